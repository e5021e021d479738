#include "megatron/core/datasets/gpt_dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <type_traits>

#include "megatron/core/datasets/helpers.h"
#include "megatron/core/datasets/numpy_random.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/temp_file.h"

namespace megatron::datasets {

namespace fs = std::filesystem;

// ----------------------------------------------------------------------------------------------
// MockGPTLowLevelDataset
// ----------------------------------------------------------------------------------------------
MockGPTLowLevelDataset::MockGPTLowLevelDataset(int64_t vocab_size, int64_t eod)
    : vocab_size_(vocab_size), eod_(eod) {
  if (vocab_size <= 0) user_error("mock data needs a tokenizer with a positive vocab size (--vocab-size)");
  NumpyDefaultRng rng(kSeed);
  lengths_ = rng.integers_int32(1, kMaxSequenceLength, kSize);
}

void MockGPTLowLevelDataset::get(int64_t idx, int64_t offset, int64_t length,
                                 std::vector<int64_t>& out) const {
  const int64_t len = lengths_[static_cast<size_t>(idx)];
  if (length < 0) length = len - offset;
  // numpy slicing [offset:offset+length] clamps to the sequence
  const int64_t beg = std::min(std::max<int64_t>(offset, 0), len);
  const int64_t end = std::min(beg + std::max<int64_t>(length, 0), len);
  for (int64_t k = beg; k < end; ++k) out.push_back(k == len - 1 ? eod_ : (k + 1) % vocab_size_);
}

// ----------------------------------------------------------------------------------------------
// Config
// ----------------------------------------------------------------------------------------------
void BlendedMegatronDatasetConfig::finalize() {
  if (sequence_length <= 1) user_error("--seq-length must be > 1 for GPT datasets (got ", sequence_length, ")");
  if (random_seed < 0 || random_seed > 0xffffffffLL)
    user_error("--seed ", random_seed, " must be in [0, 2^32) for numpy's RandomState");
  if (!tokenizer) user_error("the dataset config needs a tokenizer (--tokenizer-type)");
  if (mid_level_dataset_surplus < 0) user_error("--mid-level-dataset-surplus must be >= 0");
  const bool per_split = blend_per_split && ((*blend_per_split)[0] || (*blend_per_split)[1] || (*blend_per_split)[2]);
  if (per_split) {
    if (blend) user_error("--data-path cannot be combined with --train-data-path/--valid-data-path/--test-data-path");
    if (split) user_error("--split cannot be combined with --train-data-path/--valid-data-path/--test-data-path");
    for (const auto& b : *blend_per_split)
      if (b && b->weights && b->weights->size() != b->prefixes.size())
        user_error("per-split blend: prefixes and weights must be equal in number");
    split_matrix.reset();
    mock = false;
    return;
  }
  if (blend) {
    if (blend->weights && blend->weights->size() != blend->prefixes.size())
      user_error("--data-path: prefixes and weights must be equal in number");
    if (!split) user_error("--split must be given with --data-path");
    mock = false;
  } else {
    mock = true;
    split = "1,1,1";
  }
  split_matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(*split));
}

// ----------------------------------------------------------------------------------------------
// Masks
// ----------------------------------------------------------------------------------------------
void get_ltor_masks_and_position_ids(const int64_t* data, int64_t s, int64_t eod,
                                     bool reset_position_ids, bool reset_attention_mask,
                                     bool eod_mask_loss, uint8_t* attention_mask, float* loss_mask,
                                     int64_t* position_ids) {
  if (attention_mask) {
    // causal: row q sees columns <= q; stored as "masked" = 1 above the diagonal
    for (int64_t q = 0; q < s; ++q)
      for (int64_t k = 0; k < s; ++k) attention_mask[q * s + k] = k > q ? 1 : 0;
  }
  for (int64_t i = 0; i < s; ++i) {
    loss_mask[i] = (eod_mask_loss && data[i] == eod) ? 0.0f : 1.0f;
    position_ids[i] = i;
  }
  if (reset_position_ids || reset_attention_mask) {
    int64_t prev = 0;
    for (int64_t i = 0; i < s; ++i) {
      if (data[i] != eod) continue;
      if (reset_attention_mask && attention_mask) {
        for (int64_t q = i + 1; q < s; ++q) std::memset(attention_mask + q * s, 1, static_cast<size_t>(i + 1));
      }
      if (reset_position_ids) {
        for (int64_t k = i + 1; k < s; ++k) position_ids[k] -= i + 1 - prev;
        prev = i + 1;
      }
    }
  }
}

// ----------------------------------------------------------------------------------------------
// GPTDataset
// ----------------------------------------------------------------------------------------------
namespace {
JsonValue tokenizer_json(const tokenizers::MegatronTokenizer& tok) {
  JsonValue o = JsonValue::make_object();
  for (const auto& [k, v] : tok.unique_identifiers()) {
    if (k == "tokenizer_path" && v == "null") o.add(k, JsonValue::null());
    else o.add(k, JsonValue::string(v));
  }
  return o;
}

bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  TempFileGuard guard(tmp);  // removed on every error below (e.g. a full disk)
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) user_error(path, ": cannot create (", std::strerror(errno), "); check --data-cache-path is writable");
    f << text;
    f.flush();
    if (!f) user_error(path, ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) user_error(path, ": rename failed (", std::strerror(errno), ")");
  guard.release();
}
}  // namespace

GPTDataset::GPTDataset(const char* class_name, std::shared_ptr<LowLevelDataset> dataset,
                       std::optional<std::string> dataset_path, int64_t index_beg, int64_t index_end,
                       std::optional<int64_t> num_samples, Split split,
                       std::shared_ptr<const GPTDatasetConfig> config)
    : class_name_(class_name),
      dataset_(std::move(dataset)),
      dataset_path_(std::move(dataset_path)),
      index_beg_(index_beg),
      index_end_(std::max(index_beg, index_end)),
      num_samples_(num_samples),
      split_(split),
      config_(std::move(config)) {
  MEGATRON_CHECK(dataset_ && config_ && config_->tokenizer) << "GPTDataset needs a dataset, config and tokenizer";
  identifiers_ = JsonValue::make_object();
  identifiers_.add("class", JsonValue::string(class_name_));
  identifiers_.add("dataset_path", dataset_path_ ? JsonValue::string(*dataset_path_) : JsonValue::null());
  identifiers_.add("num_samples", num_samples_ ? JsonValue::integer(*num_samples_) : JsonValue::null());
  identifiers_.add("index_split", JsonValue::string(split_name(split_)));
  identifiers_.add("random_seed", JsonValue::integer(config_->random_seed));
  identifiers_.add("sequence_length", JsonValue::integer(config_->sequence_length));
  identifiers_.add("split", config_->split ? JsonValue::string(*config_->split) : JsonValue::null());
  identifiers_.add("split_matrix", config_->split_matrix ? split_matrix_json(*config_->split_matrix) : JsonValue::null());
  identifiers_.add("tokenizer", tokenizer_json(*config_->tokenizer));
  description_ = json_dumps_indent4(identifiers_);
  hash_ = md5_hex(description_);

  eod_ = config_->tokenizer->eod();
  pad_token_id_ = config_->tokenizer->pad();
  if (pad_token_id_ && *pad_token_id_ == eod_ && !config_->allow_ambiguous_pad_tokens) pad_token_id_ = -1;

  build_or_load_indices();
}

void GPTDataset::build_or_load_indices() {
  std::optional<std::string> cache = config_->path_to_cache;
  if (!cache && !config_->mock) {
    auto prefix = dataset_->path_prefix();
    if (prefix) cache = (fs::path(*prefix) / "cache" / (class_name_ + "_indices")).string();
  }
  std::string base;
  bool hit = false;
  if (cache) {
    base = (fs::path(*cache) / (hash_ + "-" + class_name_ + "-" + split_name(split_))).string();
    hit = is_file(base + "-description.txt") && is_file(base + "-document_index.npy") &&
          is_file(base + "-sample_index.npy") && is_file(base + "-shuffle_index.npy");
    cache_dir_ = *cache;
  }
  const auto& dist = config_->distributed;
  if (!cache || (!hit && (!dist.initialized || dist.rank == 0))) {
    build_indices();
    if (cache && num_samples_total_ >= 0) {
      std::error_code ec;
      fs::create_directories(*cache, ec);
      if (ec) user_error(*cache, ": cannot create the dataset cache folder (", ec.message(), "); give a writable --data-cache-path");
      save_indices(base);
    }
    return;
  }
  if (!hit) {
    user_error(base, "-*.npy: the index cache that rank 0 should have written is missing; "
                     "make --data-cache-path a folder every rank can read");
  }
  load_indices(base);
  loaded_from_cache_ = true;
}

void GPTDataset::build_indices() {
  const int64_t s = config_->sequence_length;
  const int x = config_->add_extra_token_to_sequence ? 1 : 0;
  const int32_t* lengths = dataset_->sequence_lengths();
  const std::string what = (dataset_path_ ? "'" + *dataset_path_ + "'" : std::string("mock data")) +
                           " " + split_name(split_) + " split";
  // No samples requested from a split with no usable data: empty indices (no error).
  auto set_empty_indices = [this] {
    num_samples_total_ = 0;
    document_index_ = NpyView::own(NpyDType::kInt32, {0}, std::vector<int32_t>{});
    sample_index_ = NpyView::own(NpyDType::kInt32, {1, 2}, std::vector<int32_t>{0, 0});
    shuffle_index_ = NpyView::own(NpyDType::kUInt32, {0}, std::vector<uint32_t>{});
  };

  if (index_end_ <= index_beg_) {
    if (num_samples_ && *num_samples_ == 0) return set_empty_indices();
    user_error(what, ": --split '", config_->split.value_or(""), "' leaves it no sequences (range [",
               index_beg_, ", ", index_end_, ") of ", dataset_->num_sequences(),
               "); give this split a larger share in --split or request no samples from it");
  }
  int64_t tokens_per_epoch = 0;
  for (int64_t i = index_beg_; i < index_end_; ++i) tokens_per_epoch += lengths[i];
  if (tokens_per_epoch <= 1) {
    if (num_samples_ && *num_samples_ == 0) return set_empty_indices();
    user_error(what, ": its ", index_end_ - index_beg_, " sequences hold only ", tokens_per_epoch,
               " token(s); a GPT sample needs at least 2. Use more data or another --split");
  }

  if (tokens_per_epoch < s + x && num_samples_ && *num_samples_ > 0 && (!config_->distributed.initialized || config_->distributed.rank == 0)) {
    // Megatron tiles several epochs into every sample here (a tiny test split does this with the
    // default --split); allowed, but worth a line.
    std::fprintf(stderr, "WARNING: %s holds %lld tokens, fewer than one sample of --seq-length %lld; samples repeat its tokens\n",
                 what.c_str(), static_cast<long long>(tokens_per_epoch), static_cast<long long>(s));
  }
  int64_t num_epochs = 1;
  if (num_samples_) {
    int64_t tokens = tokens_per_epoch;
    const int64_t requested = *num_samples_ * s + x;
    while (tokens < requested) {
      ++num_epochs;
      tokens += tokens_per_epoch;
    }
  } else if ((tokens_per_epoch - x) / s == 0) {
    user_error(what, ": --seq-length ", s, " is longer than all ", tokens_per_epoch,
               " tokens of the split (one epoch yields no sample); use a shorter --seq-length or more data");
  }
  if (num_epochs > std::numeric_limits<int32_t>::max()) user_error(what, ": needs ", num_epochs, " epochs; too many");

  bool separate_final_epoch = false;
  int64_t sans_final = 0;
  if (num_epochs > 1) {
    sans_final = ((num_epochs - 1) * tokens_per_epoch - x) / s;
    const int64_t from_final = *num_samples_ - sans_final;
    const int64_t per_epoch = (tokens_per_epoch - x) / s;
    MEGATRON_CHECK(from_final >= 0 && from_final <= per_epoch + 1) << "from_final " << from_final;
    separate_final_epoch = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }

  NumpyRandomState rng(static_cast<uint32_t>(config_->random_seed));
  const int64_t ndocs = index_end_ - index_beg_;
  auto tile = [&](int64_t epochs, int32_t* dst) {
    for (int64_t e = 0; e < epochs; ++e)
      for (int64_t i = 0; i < ndocs; ++i) dst[e * ndocs + i] = static_cast<int32_t>(index_beg_ + i);
  };
  std::vector<int32_t> document_index(static_cast<size_t>(num_epochs * ndocs));
  if (!separate_final_epoch) {
    tile(num_epochs, document_index.data());
    rng.shuffle(document_index.data(), static_cast<int64_t>(document_index.size()));
  } else {
    tile(num_epochs - 1, document_index.data());
    rng.shuffle(document_index.data(), (num_epochs - 1) * ndocs);
    int32_t* last = document_index.data() + (num_epochs - 1) * ndocs;
    tile(1, last);
    rng.shuffle(last, ndocs);
  }

  bool drop_last = true;
  if (split_ == Split::valid) drop_last = config_->drop_last_partial_validation_sequence;
  std::vector<int64_t> sample_index =
      build_sample_idx(lengths, document_index.data(), static_cast<int64_t>(document_index.size()),
                       static_cast<int32_t>(s), static_cast<int32_t>(num_epochs), tokens_per_epoch, drop_last, x);
  const int64_t max_len = *std::max_element(lengths, lengths + dataset_->num_sequences());
  const int64_t sample_idx_max = std::max<int64_t>(static_cast<int64_t>(document_index.size()), max_len);
  num_samples_total_ = static_cast<int64_t>(sample_index.size() / 2) - 1;
  const int64_t doc_count = static_cast<int64_t>(document_index.size());
  document_index_ = NpyView::own(NpyDType::kInt32, {doc_count}, std::move(document_index));
  if (sample_idx_max <= std::numeric_limits<int32_t>::max()) {
    std::vector<int32_t> narrow(sample_index.begin(), sample_index.end());
    sample_index_ = NpyView::own(NpyDType::kInt32, {num_samples_total_ + 1, 2}, std::move(narrow));
  } else {
    sample_index_ = NpyView::own(NpyDType::kInt64, {num_samples_total_ + 1, 2}, std::move(sample_index));
  }

  const int64_t total = num_samples_total_;
  auto shuffle = [&](auto* p) {
    for (int64_t i = 0; i < total; ++i) p[i] = static_cast<std::remove_pointer_t<decltype(p)>>(i);
    if (separate_final_epoch) {
      rng.shuffle(p, sans_final);
      rng.shuffle(p + sans_final, total - sans_final);
    } else {
      rng.shuffle(p, total);
    }
  };
  if (total >= static_cast<int64_t>(0xffffffffULL) - 1) {
    std::vector<int64_t> sh(static_cast<size_t>(total));
    shuffle(sh.data());
    shuffle_index_ = NpyView::own(NpyDType::kInt64, {total}, std::move(sh));
  } else {
    std::vector<uint32_t> sh(static_cast<size_t>(total));
    shuffle(sh.data());
    shuffle_index_ = NpyView::own(NpyDType::kUInt32, {total}, std::move(sh));
  }
}

void GPTDataset::save_indices(const std::string& base) const {
  write_text_atomic(base + "-description.txt", description_);
  npy_save_raw(base + "-document_index.npy", document_index_.dtype(), document_index_.shape(), document_index_.data());
  npy_save_raw(base + "-sample_index.npy", sample_index_.dtype(), sample_index_.shape(), sample_index_.data());
  npy_save_raw(base + "-shuffle_index.npy", shuffle_index_.dtype(), shuffle_index_.shape(), shuffle_index_.data());
}

bool GPTDataset::load_indices(const std::string& base) {
  NpyView d = NpyView::map(base + "-document_index.npy");
  NpyView si = NpyView::map(base + "-sample_index.npy");
  NpyView sh = NpyView::map(base + "-shuffle_index.npy");
  if (d.shape().size() != 1 || d.dtype() != NpyDType::kInt32)
    user_error(base, "-document_index.npy: expected a 1-D int32 array; delete the cache to rebuild it");
  if (si.shape().size() != 2 || si.shape()[1] != 2 || si.shape()[0] < 1 ||
      (si.dtype() != NpyDType::kInt32 && si.dtype() != NpyDType::kInt64))
    user_error(base, "-sample_index.npy: expected an [n+1, 2] int32/int64 array; delete the cache to rebuild it");
  if (sh.shape().size() != 1 || sh.shape()[0] != si.shape()[0] - 1 ||
      (sh.dtype() != NpyDType::kUInt32 && sh.dtype() != NpyDType::kInt64))
    user_error(base, "-shuffle_index.npy: its length or dtype disagrees with the sample index; delete the cache to rebuild it");
  num_samples_total_ = sh.numel();
  // Validate what get() will dereference (cheap next to building; catches a stale or damaged cache).
  const int64_t nd = d.numel();
  const int64_t nseq = dataset_->num_sequences();
  for (int64_t i = 0; i < nd; ++i)
    if (d[i] < 0 || d[i] >= nseq)
      user_error(base, "-document_index.npy: sequence id ", d[i], " out of range; delete the cache to rebuild it");
  for (int64_t r = 0; r <= num_samples_total_; ++r)
    if (si[2 * r] < 0 || si[2 * r] >= std::max<int64_t>(nd, 1))
      user_error(base, "-sample_index.npy: row ", r, " out of range; delete the cache to rebuild it");
  for (int64_t i = 0; i < num_samples_total_; ++i)
    if (sh[i] < 0 || sh[i] >= num_samples_total_)
      user_error(base, "-shuffle_index.npy: entry out of range; delete the cache to rebuild it");
  document_index_ = std::move(d);
  sample_index_ = std::move(si);
  shuffle_index_ = std::move(sh);
  return true;
}

void GPTDataset::get(int64_t idx, GPTSample& out, bool with_attention_mask) const {
  MEGATRON_CHECK(idx >= 0 && idx < num_samples_total_) << "sample " << idx << " of " << num_samples_total_;
  const int64_t s = config_->sequence_length;
  const int64_t x = config_->add_extra_token_to_sequence ? 1 : 0;
  const int64_t i = shuffle_index_[idx];
  const int64_t d0 = sample_index_[2 * i], o0 = sample_index_[2 * i + 1];
  const int64_t d1 = sample_index_[2 * i + 2], o1 = sample_index_[2 * i + 3];
  thread_local std::vector<int64_t> text;
  text.clear();
  text.reserve(static_cast<size_t>(s + x));
  if (d0 == d1) {
    dataset_->get(document_index_[d0], o0, o1 - o0 + x, text);
  } else {
    for (int64_t k = d0; k <= d1; ++k) {
      const int64_t off = k > d0 ? 0 : o0;
      const int64_t len = k < d1 ? -1 : o1 + x;
      dataset_->get(document_index_[k], off, len, text);
    }
  }
  const int64_t pad = pad_token_id_.value_or(-1);
  while (static_cast<int64_t>(text.size()) < s + x) text.push_back(pad);
  MEGATRON_CHECK(static_cast<int64_t>(text.size()) == s + x) << "sample has " << text.size() << " tokens, want " << s + x;

  out.dataset_id = -1;
  out.tokens.assign(text.begin(), text.begin() + s);
  if (x) {
    out.labels.assign(text.begin() + 1, text.end());
  } else {
    out.labels.assign(text.begin() + 1, text.end());
    out.labels.push_back(pad);
  }
  out.loss_mask.resize(static_cast<size_t>(s));
  out.position_ids.resize(static_cast<size_t>(s));
  const bool make_mask = config_->create_attention_mask && with_attention_mask;
  if (make_mask) out.attention_mask.resize(static_cast<size_t>(s * s));
  else out.attention_mask.clear();
  get_ltor_masks_and_position_ids(out.tokens.data(), s, eod_, config_->reset_position_ids,
                                  config_->reset_attention_mask, config_->eod_mask_loss,
                                  make_mask ? out.attention_mask.data() : nullptr, out.loss_mask.data(),
                                  out.position_ids.data());
  if (pad_token_id_) {
    const int64_t p = *pad_token_id_;
    for (int64_t k = 0; k < s; ++k) {
      if (out.labels[k] == p) {
        out.loss_mask[k] = 0.0f;
        out.labels[k] = 0;
      }
      if (out.tokens[k] == p) out.tokens[k] = 0;
    }
  }
}

// ----------------------------------------------------------------------------------------------
// Sample digest (MEGATRON_DUMP_SAMPLES)
// ----------------------------------------------------------------------------------------------
std::string sample_digest(const char* split, int64_t idx, const GPTSample& sample) {
  auto list = [](const auto& v) {
    std::string o;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) o += ',';
      o += std::to_string(v[i]);
    }
    return o;
  };
  std::vector<int64_t> zero;
  for (size_t i = 0; i < sample.loss_mask.size(); ++i)
    if (sample.loss_mask[i] == 0.0f) zero.push_back(static_cast<int64_t>(i));
  bool arange = true;
  for (size_t i = 0; i < sample.position_ids.size(); ++i) arange = arange && sample.position_ids[i] == static_cast<int64_t>(i);
  return std::string("SAMPLE ") + split + " " + std::to_string(idx) + " tokens=" + list(sample.tokens) +
         " labels=" + list(sample.labels) + " loss_mask_zero=" + (zero.empty() ? std::string("-") : list(zero)) +
         " position_ids=" + (arange ? std::string("arange") : list(sample.position_ids));
}

}  // namespace megatron::datasets
