#include "megatron/core/datasets/preprocess/preprocess_pipeline.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <thread>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/datasets/preprocess/input_reader.h"
#include "megatron/core/datasets/preprocess/json_record.h"
#include "megatron/core/datasets/preprocess/sentence_splitter.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/utils/errors.h"

namespace megatron::datasets::preprocess {

using Clock = std::chrono::steady_clock;

namespace {
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

double process_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}
}  // namespace

void request_stop() noexcept { g_stop_requested.store(true, std::memory_order_relaxed); }

std::string python_float_repr(double v) {
  if (v != v) return "nan";
  if (v == std::numeric_limits<double>::infinity()) return "inf";
  if (v == -std::numeric_limits<double>::infinity()) return "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  std::string sign;
  if (s[0] == '-') { sign = "-"; s.erase(0, 1); }
  size_t e = s.find('e');
  std::string mant = s.substr(0, e);
  int exp = std::stoi(s.substr(e + 1));
  std::string digits;
  for (char c : mant) if (c != '.') digits += c;
  if (exp < -4 || exp >= 16) return sign + s;  // same layout as Python: 1.5e-05, 1e+16
  std::string o;
  int nd = static_cast<int>(digits.size());
  if (exp < 0) {
    o = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (exp + 1 >= nd) {
    o = digits + std::string(static_cast<size_t>(exp + 1 - nd), '0') + ".0";
  } else {
    o = digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
  }
  return sign + o;
}

uint64_t count_code_points(const char* s, size_t n) {
  // n minus the UTF-8 continuation bytes (10xxxxxx), 8 bytes at a time: bit 7 of
  // (x & ~(x << 1)) is set exactly in the bytes whose top two bits are 10.
  uint64_t cont = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x;
    std::memcpy(&x, s + i, 8);
    cont += static_cast<uint64_t>(__builtin_popcountll(x & ~(x << 1) & 0x8080808080808080ull));
  }
  for (; i < n; ++i) cont += (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80;
  return n - cont;
}

std::string output_dataset_prefix(const PreprocessConfig& cfg, const std::string& key) {
  return cfg.output_prefix + "_" + key + "_" + (cfg.split_sentences ? "sentence" : "document");
}

namespace {

/// Per-batch output of a worker.
struct BatchResult {
  uint64_t seq = 0;
  uint64_t first_line = 0;
  std::string file;
  uint64_t input_bytes_done = 0;
  uint64_t raw_bytes = 0;
  struct Doc {
    uint64_t chars = 0;
    std::string error;  // non-empty: invalid line
  };
  std::vector<Doc> docs;
  // per key: flat tokens, flat sequence lengths, and per doc the number of sequences
  std::vector<std::vector<int64_t>> tokens, lens;
  // per key: the tokens already in the dataset dtype (little-endian bytes), written as is
  std::vector<std::vector<char>> encoded;
  std::vector<std::vector<uint32_t>> nseq;
};

/// Inclusive range of token ids the dtype can store.
std::pair<int64_t, int64_t> dtype_range(IndexDType t) {
  switch (t) {
    case IndexDType::kUInt8: return {0, 255};
    case IndexDType::kInt8: return {-128, 127};
    case IndexDType::kInt16: return {-32768, 32767};
    case IndexDType::kUInt16: return {0, 65535};
    case IndexDType::kInt32: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    default: return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

const char* kind_name(const KeyValue& kv) { return kv.type_name.empty() ? "value" : kv.type_name.c_str(); }

class Worker {
 public:
  Worker(const PreprocessConfig& cfg, const tokenizers::MegatronTokenizer& tok, IndexDType dtype)
      : cfg_(cfg), tok_(tok), parser_(cfg.json_keys), range_(dtype_range(dtype)), dtype_(dtype) {
    if (cfg.split_sentences) splitter_.emplace(cfg.lang, cfg.keep_newlines);
  }

  void process(const LineBatch& in, BatchResult& out) {
    const size_t K = cfg_.json_keys.size();
    out.seq = in.seq;
    out.first_line = in.first_line;
    out.file = in.file;
    out.input_bytes_done = in.input_bytes_done;
    out.raw_bytes = 0;
    out.docs.assign(in.lines.size(), {});
    out.tokens.assign(K, {});
    out.lens.assign(K, {});
    out.nseq.assign(K, std::vector<uint32_t>(in.lines.size(), 0));
    for (size_t i = 0; i < in.lines.size(); ++i) {
      const auto& ln = in.lines[i];
      const char* p = in.data.data() + ln.offset;
      auto& doc = out.docs[i];
      doc.chars = count_code_points(p, ln.length) + (ln.has_newline ? 1 : 0);
      out.raw_bytes += ln.length + (ln.has_newline ? 1 : 0);
      doc.error = encode_line(std::string_view(p, ln.length), out, i);
      if (!doc.error.empty()) {
        // roll back whatever this line added
        for (size_t k = 0; k < K; ++k) {
          uint32_t n = out.nseq[k][i];
          int64_t ntok = 0;
          for (uint32_t j = 0; j < n; ++j) ntok += out.lens[k][out.lens[k].size() - 1 - j];
          out.lens[k].resize(out.lens[k].size() - n);
          out.tokens[k].resize(out.tokens[k].size() - static_cast<size_t>(ntok));
          out.nseq[k][i] = 0;
        }
      }
    }
    // Convert to the dataset dtype here, in parallel, so the writer thread only copies bytes
    // (every id was range-checked per line above).
    out.encoded.assign(K, {});
    for (size_t k = 0; k < K; ++k) encode_tokens(dtype_, out.tokens[k], out.encoded[k]);
  }

 private:
  std::string encode_line(std::string_view line, BatchResult& out, size_t doc) {
    std::string err = parser_.parse(line, values_);
    if (!err.empty()) return "invalid JSON: " + err;
    for (size_t k = 0; k < cfg_.json_keys.size(); ++k) {
      const KeyValue& kv = values_[k];
      const std::string& key = cfg_.json_keys[k];
      switch (kv.kind) {
        case KeyValue::Kind::kMissing: return "key '" + key + "' is missing (check --json-keys)";
        case KeyValue::Kind::kOther:
          return "key '" + key + "' is a JSON " + kind_name(kv) + ", not a string or a list of strings";
        default: break;
      }
      if (kv.lone_surrogate)
        return "key '" + key + "' holds an unpaired UTF-16 surrogate escape (e.g. \\ud800) that no tokenizer can encode";
      auto& toks = out.tokens[k];
      auto& lens = out.lens[k];
      size_t tok_start = toks.size();
      uint32_t nseq = 0;
      auto add = [&](std::string_view sentence) -> std::string {
        const size_t before = toks.size();
        try {
          tok_.tokenize_into(sentence, toks);
        } catch (const std::exception& e) {
          toks.resize(before);
          return "key '" + key + "': tokenizer failed: " + e.what();
        }
        if (toks.size() == before) return {};
        lens.push_back(static_cast<int64_t>(toks.size() - before));
        ++nseq;
        out.nseq[k][doc] = nseq;
        return {};
      };
      for (const std::string& s : kv.strings) {
        std::string e;
        if (splitter_ && kv.kind == KeyValue::Kind::kString) {
          for (std::string_view sent : splitter_->split(s))
            if (!(e = add(sent)).empty()) return e;
        } else if (!(e = add(s)).empty()) {
          return e;
        }
      }
      if (nseq > 0 && cfg_.append_eod) {
        toks.push_back(tok_.eod());
        lens.back() += 1;
      }
      for (size_t t = tok_start; t < toks.size(); ++t)
        if (toks[t] < range_.first || toks[t] > range_.second)
          return "key '" + key + "': token id " + std::to_string(toks[t]) + " does not fit the dataset dtype " +
                 index_dtype_name(dtype_) + " (chosen from the tokenizer's vocab_size " +
                 std::to_string(tok_.vocab_size()) + "); check --vocab-size / the tokenizer";
    }
    return {};
  }

  const PreprocessConfig& cfg_;
  const tokenizers::MegatronTokenizer& tok_;
  JsonRecordParser parser_;
  std::optional<SentenceSplitter> splitter_;
  std::vector<KeyValue> values_;
  std::pair<int64_t, int64_t> range_;
  IndexDType dtype_;
};

/// Bounded, order-restoring work distribution: reader -> workers -> writer (caller's thread).
class Pipeline {
 public:
  Pipeline(const PreprocessConfig& cfg, const tokenizers::MegatronTokenizer& tok, IndexDType dtype)
      : cfg_(cfg), tok_(tok), dtype_(dtype), max_inflight_(static_cast<size_t>(2 * cfg.workers + 2)) {}

  ~Pipeline() { stop(); }

  void start() {
    reader_ = std::thread([this] { read_all(); });
    for (int w = 0; w < cfg_.workers; ++w) workers_.emplace_back([this] { work(); });
  }

  /// Next result in input order; nullopt at the end. Rethrows a reader/worker failure.
  std::optional<BatchResult> next() {
    std::unique_lock lk(mu_);
    cv_out_.wait(lk, [&] { return failure_ || done_.count(next_seq_) || (reader_done_ && next_seq_ >= total_batches_); });
    if (failure_) std::rethrow_exception(failure_);
    auto it = done_.find(next_seq_);
    if (it == done_.end()) return std::nullopt;
    BatchResult r = std::move(it->second);
    done_.erase(it);
    ++next_seq_;
    --inflight_;
    cv_in_.notify_all();
    return r;
  }

  void stop() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_in_.notify_all();
    cv_work_.notify_all();
    cv_out_.notify_all();
    if (reader_.joinable()) reader_.join();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
    workers_.clear();
  }

 private:
  void fail(std::exception_ptr e) {
    std::lock_guard lk(mu_);
    if (!failure_) failure_ = e;
    stopping_ = true;
    cv_out_.notify_all();
    cv_in_.notify_all();
    cv_work_.notify_all();
  }

  void read_all() {
    try {
      uint64_t seq = 0;
      for (const auto& path : cfg_.inputs) {
        InputReader reader(path, cfg_.batch_bytes);
        for (;;) {
          LineBatch b;
          if (g_stop_requested.load(std::memory_order_relaxed))
            user_error("interrupted; the outputs were not written (temporary files removed)");
          if (!reader.next(b)) break;
          b.seq = seq++;
          std::unique_lock lk(mu_);
          cv_in_.wait(lk, [&] { return stopping_ || inflight_ < max_inflight_; });
          if (stopping_) return;
          ++inflight_;
          todo_.push_back(std::move(b));
          cv_work_.notify_one();
        }
      }
      std::lock_guard lk(mu_);
      reader_done_ = true;
      total_batches_ = seq;
      cv_out_.notify_all();
      cv_work_.notify_all();
    } catch (...) {
      fail(std::current_exception());
    }
  }

  void work() {
    try {
      Worker w(cfg_, tok_, dtype_);
      for (;;) {
        LineBatch b;
        {
          std::unique_lock lk(mu_);
          cv_work_.wait(lk, [&] { return stopping_ || !todo_.empty() || reader_done_; });
          if (stopping_) return;
          if (todo_.empty()) return;  // reader done and nothing left
          b = std::move(todo_.front());
          todo_.pop_front();
        }
        BatchResult r;
        w.process(b, r);
        std::lock_guard lk(mu_);
        done_.emplace(r.seq, std::move(r));
        cv_out_.notify_all();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }

  const PreprocessConfig& cfg_;
  const tokenizers::MegatronTokenizer& tok_;
  IndexDType dtype_;
  size_t max_inflight_;
  std::mutex mu_;
  std::condition_variable cv_in_, cv_work_, cv_out_;
  std::deque<LineBatch> todo_;
  std::map<uint64_t, BatchResult> done_;
  size_t inflight_ = 0;
  uint64_t next_seq_ = 0, total_batches_ = 0;
  bool reader_done_ = false, stopping_ = false;
  std::exception_ptr failure_;
  std::thread reader_;
  std::vector<std::thread> workers_;
};

std::string fmt_bytes(double b) {
  char buf[32];
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  return buf;
}

std::string fmt_eta(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--";
  long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

/// Removes its files unless released (temporary partition outputs).
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (auto& p : paths) std::remove(p.c_str());
  }
};

}  // namespace

PreprocessStats run_preprocess(const PreprocessConfig& cfg, const tokenizers::MegatronTokenizer& tok,
                               std::ostream& out, std::ostream& err, Clock::time_point startup_begin) {
  if (cfg.inputs.empty()) user_error("--input: no input file");
  if (cfg.json_keys.empty()) user_error("--json-keys needs at least one key");
  // Megatron would write the same <prefix>_<key>_<level> files once per occurrence (the second
  // overwrites the first while both are open): refuse instead.
  for (size_t i = 0; i < cfg.json_keys.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (cfg.json_keys[i] == cfg.json_keys[j])
        user_error("argument --json-keys: key '", cfg.json_keys[i],
                   "' is given twice (each key writes its own output files); give each key once");
  if (cfg.workers < 1) user_error("--workers must be at least 1 (got ", cfg.workers, ")");
  if (cfg.partitions < 1) user_error("--partitions must be at least 1 (got ", cfg.partitions, ")");
  if (cfg.log_interval < 1) user_error("--log-interval must be at least 1 (got ", cfg.log_interval, ")");
  if (cfg.append_eod && tok.eod() < 0)
    user_error("--append-eod: tokenizer ", "has no end-of-document token (no eos); drop --append-eod");

  const IndexDType dtype = optimal_index_dtype(tok.vocab_size());
  const size_t dtype_size = index_dtype_size(dtype);
  const size_t K = cfg.json_keys.size();
  const bool round_robin = cfg.partitions > 1 && !cfg.keep_sequential_samples;
  const size_t P = round_robin ? static_cast<size_t>(cfg.partitions) : 1;

  for (const auto& in : cfg.inputs) out << "Opening " << in << "\n";
  out.flush();

  // builders[k][p]; with one partition they write the final files directly.
  TempFiles temps;
  std::vector<std::vector<std::unique_ptr<IndexedDatasetBuilder>>> builders(K);
  std::vector<std::vector<std::string>> part_prefix(K);
  for (size_t k = 0; k < K; ++k) {
    std::string final_prefix = output_dataset_prefix(cfg, cfg.json_keys[k]);
    auto parent = std::filesystem::path(final_prefix).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent))
      user_error("--output-prefix ", cfg.output_prefix, ": folder ", parent.string(), " does not exist; create it first (mkdir -p ", parent.string(), ")");
    for (size_t p = 0; p < P; ++p) {
      std::string pre = P == 1 ? final_prefix : final_prefix + ".tmp-partition" + std::to_string(p);
      if (P > 1) {
        temps.paths.push_back(pre + ".bin");
        temps.paths.push_back(pre + ".idx");
      }
      part_prefix[k].push_back(pre);
      builders[k].push_back(std::make_unique<IndexedDatasetBuilder>(pre + ".bin", dtype));
    }
  }

  uint64_t total_input = 0;
  for (const auto& in : cfg.inputs) {
    std::error_code ec;
    auto sz = std::filesystem::file_size(in, ec);
    if (!ec) total_input += sz;
  }

  auto startup_end = Clock::now();
  out << "Time to startup: " << python_float_repr(std::chrono::duration<double>(startup_end - startup_begin).count())
      << "\n";
  out.flush();

  const bool bar = cfg.progress_bar == 1 || (cfg.progress_bar == -1 && ::isatty(2));
  PreprocessStats st;
  const auto proc_start = Clock::now();
  const double cpu_start = process_cpu_seconds();
  auto last_bar = proc_start;
  uint64_t bytes_before_file = 0, bytes_done = 0;
  std::string cur_file;
  uint64_t line_index = 0;  // global line counter (round-robin partition assignment)
  bool bar_shown = false;

  auto clear_bar = [&] {
    if (bar_shown) {
      err << "\r\033[K";
      bar_shown = false;
    }
  };
  auto draw_bar = [&](bool force) {
    auto now = Clock::now();
    if (!force && now - last_bar < std::chrono::milliseconds(250)) return;
    last_bar = now;
    double el = std::chrono::duration<double>(now - proc_start).count();
    double rate = el > 0 ? bytes_done / el : 0;
    double frac = total_input ? std::min(1.0, static_cast<double>(bytes_done) / total_input) : 0;
    constexpr int W = 30;
    int fill = static_cast<int>(frac * W);
    std::string b(static_cast<size_t>(fill), '#');
    b.resize(W, ' ');
    char line[256];
    std::snprintf(line, sizeof line, "\r[%s] %5.1f%% %s / %s  %.1f MiB/s  ETA %s  %llu docs", b.c_str(), frac * 100,
                  fmt_bytes(static_cast<double>(bytes_done)).c_str(), fmt_bytes(static_cast<double>(total_input)).c_str(),
                  rate / (1024 * 1024), rate > 0 ? fmt_eta((total_input - bytes_done) / rate).c_str() : "--:--",
                  static_cast<unsigned long long>(st.documents));
    err << line << "\033[K";
    err.flush();
    bar_shown = true;
  };

  Pipeline pipe(cfg, tok, dtype);
  pipe.start();
  bool reached_max = false;
  while (!reached_max) {
    std::optional<BatchResult> r = pipe.next();
    if (!r) break;
    if (r->file != cur_file) {
      if (!cur_file.empty()) {
        std::error_code ec;
        auto sz = std::filesystem::file_size(cur_file, ec);
        bytes_before_file += ec ? 0 : sz;
      }
      cur_file = r->file;
    }
    std::vector<size_t> tok_off(K, 0), len_off(K, 0);
    for (size_t i = 0; i < r->docs.size(); ++i, ++line_index) {
      const auto& d = r->docs[i];
      if (!d.error.empty()) {
        std::string where = r->file + ":" + std::to_string(r->first_line + i) + ": ";
        if (!cfg.skip_invalid_lines)
          user_error(where, d.error,
                     " (Megatron's preprocess_data.py stops on this line too; fix it or pass --skip-invalid-lines)");
        ++st.skipped_lines;
        if (st.skipped_lines <= 10) {
          clear_bar();
          err << "WARNING: skipping " << where << d.error << "\n";
          if (st.skipped_lines == 10) err << "WARNING: further skipped lines are only counted\n";
        }
        continue;
      }
      size_t part = round_robin ? line_index % P : 0;
      for (size_t k = 0; k < K; ++k) {
        uint32_t ns = r->nseq[k][i];
        int64_t ntok = 0;
        for (uint32_t j = 0; j < ns; ++j) ntok += r->lens[k][len_off[k] + j];
        builders[k][part]->add_document_encoded(r->encoded[k].data() + tok_off[k] * dtype_size,
                                                static_cast<size_t>(ntok), r->lens[k].data() + len_off[k], ns);
        tok_off[k] += static_cast<size_t>(ntok);
        len_off[k] += ns;
        st.tokens += static_cast<uint64_t>(ntok);
      }
      ++st.documents;
      st.characters += d.chars;
      if (st.documents % static_cast<uint64_t>(cfg.log_interval) == 0) {
        double el = std::chrono::duration<double>(Clock::now() - proc_start).count();
        double dps = st.documents / el;
        clear_bar();
        err << "Processed " << st.documents << " documents (" << python_float_repr(dps) << " docs/s, "
            << python_float_repr(st.characters / el / 1024 / 1024) << " MB/s).\n";
        err.flush();
        st.performance.push_back(dps);
      }
      if (cfg.max_documents >= 0 && st.documents >= static_cast<uint64_t>(cfg.max_documents)) {
        reached_max = true;
        break;
      }
    }
    st.input_bytes += r->raw_bytes;
    bytes_done = bytes_before_file + r->input_bytes_done;
    if (bar) draw_bar(false);
  }
  pipe.stop();
  if (bar) {
    draw_bar(true);
    err << "\n";
  }

  for (size_t k = 0; k < K; ++k) {
    std::string final_prefix = output_dataset_prefix(cfg, cfg.json_keys[k]);
    if (P == 1) {
      builders[k][0]->finalize(final_prefix + ".idx");
      continue;
    }
    for (size_t p = 0; p < P; ++p) builders[k][p]->finalize(part_prefix[k][p] + ".idx");
    IndexedDatasetBuilder merged(final_prefix + ".bin", dtype);
    for (size_t p = 0; p < P; ++p) merged.add_index(part_prefix[k][p]);
    merged.finalize(final_prefix + ".idx");
  }
  st.seconds = std::chrono::duration<double>(Clock::now() - proc_start).count();
  st.cpu_seconds = process_cpu_seconds() - cpu_start;
  return st;
}

}  // namespace megatron::datasets::preprocess
