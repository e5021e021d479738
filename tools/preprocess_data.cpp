// preprocess_data: JSONL -> Megatron-LM .bin/.idx datasets (Megatron's tools/preprocess_data.py).
//
//   preprocess_data --input corpus.jsonl --output-prefix data/corpus \
//       --tokenizer-type HuggingFaceTokenizer --tokenizer-model llama3/ --append-eod --workers 8
//
// Same flags, defaults, output names, log lines and output bytes as Megatron's script; workers
// are threads. See docs/preprocess_data.md.
#include <glob.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>

#include "megatron/core/datasets/preprocess/preprocess_pipeline.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/arg_utils.h"
#include "megatron/core/utils/signals.h"

namespace pp = megatron::datasets::preprocess;

namespace {

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> out;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (out.empty()) megatron::user_error("--input ", pattern, ": no file matches");
  return out;  // glob(3) sorts the names
}

int run(int argc, char** argv) {
  auto t0 = std::chrono::steady_clock::now();
  CLI::App app{"Tokenize a JSONL corpus into Megatron-LM .bin/.idx datasets (tools/preprocess_data.py)",
               "preprocess_data"};
  megatron::tokenizers::TokenizerConfig tcfg;
  megatron::training::add_tokenizer_args(app, tcfg);

  pp::PreprocessConfig cfg;
  std::string input;
  bool find_optimal = false;
  std::vector<int> workers_to_check{16, 32, 64};
  int64_t max_documents = 100000;
  int workers = 0;
  app.add_option("--input", input, "Path to input JSON (.jsonl, .jsonl.gz, .jsonl.zst; a glob with --partitions > 1)")
      ->required();
  app.add_option("--json-keys", cfg.json_keys, "space separate listed of keys to extract from json")
      ->capture_default_str();
  app.add_flag("--split-sentences", cfg.split_sentences, "Split documents into sentences (ICU, not NLTK punkt).");
  app.add_flag("--keep-newlines", cfg.keep_newlines, "Keep newlines between sentences when splitting.");
  app.add_flag("--append-eod", cfg.append_eod, "Append an <eod> token to the end of a document.");
  app.add_option("--lang", cfg.lang, "Language for sentence splitting (punkt name or ICU locale).")
      ->capture_default_str();
  app.add_option("--output-prefix", cfg.output_prefix, "Path to binary output file without suffix")->required();
  app.add_option("--workers", workers, "Number of tokenizer threads.")->required();
  app.add_flag("--find-optimal-num-workers", find_optimal,
               "Run short jobs with each of --workers-to-check and report the fastest.");
  app.add_option("--workers-to-check", workers_to_check, "Worker counts to try with --find-optimal-num-workers")
      ->capture_default_str();
  app.add_option("--max-documents", max_documents, "Documents per run with --find-optimal-num-workers")
      ->capture_default_str();
  app.add_option("--partitions", cfg.partitions, "Number of file partitions (output order as Megatron)")
      ->capture_default_str();
  app.add_option("--log-interval", cfg.log_interval, "Interval between progress updates")->capture_default_str();
  app.add_flag("--keep-sequential-samples", cfg.keep_sequential_samples,
               "Keep the input order with --partitions > 1.");
  app.add_flag("--skip-invalid-lines", cfg.skip_invalid_lines,
               "Skip (and count) lines Megatron would die on, instead of stopping (ours).");
  if (!megatron::training::parse_args(app, argc, argv)) return 0;
  megatron::training::warn_ignored_flags(app);

  // Megatron's get_args() hard-sets vocab_extra_ids = 0 for preprocessing.
  if (tcfg.vocab_extra_ids != 0)
    std::cerr << "WARNING: --vocab-extra-ids is set to 0 for preprocessing, as Megatron's preprocess_data.py does\n";
  tcfg.vocab_extra_ids = 0;
  if (tcfg.tokenizer_type.rfind("Bert", 0) == 0 && !cfg.split_sentences)
    std::cout << "Are you sure you don't want to split sentences?\n";
  if (cfg.partitions < 1) megatron::user_error("--partitions must be at least 1 (got ", cfg.partitions, ")");
  if (cfg.keep_newlines && !cfg.split_sentences)
    std::cerr << "WARNING: --keep-newlines has no effect without --split-sentences\n";
  cfg.inputs = cfg.partitions > 1 ? expand_glob(input) : std::vector<std::string>{input};

  std::vector<int> worker_list = find_optimal ? workers_to_check : std::vector<int>{workers};
  std::vector<int> kept;
  for (int w : worker_list) {
    if (w % cfg.partitions != 0) {
      std::cout << "Removing num_workers (" << w << ") from workers list because it's not divisible by "
                << "num_partitions (" << cfg.partitions << ")\n";
      continue;
    }
    kept.push_back(w);
  }
  if (kept.empty()) megatron::user_error("--workers: provide a number of workers divisible by --partitions");
  if (find_optimal) {
    cfg.log_interval = 1000;
    cfg.max_documents = max_documents;
  }

  auto tokenizer = megatron::tokenizers::build_tokenizer(tcfg);
  std::vector<std::pair<int, double>> perf;
  pp::PreprocessStats last;
  for (int w : kept) {
    std::cout << "Processing data with " << w << " workers.\n";
    cfg.workers = w;
    auto start = perf.empty() ? t0 : std::chrono::steady_clock::now();
    last = pp::run_preprocess(cfg, *tokenizer, std::cout, std::cerr, start);
    if (find_optimal) {
      double avg = 0;
      for (double p : last.performance) avg += p;
      if (!last.performance.empty()) avg /= static_cast<double>(last.performance.size());
      perf.emplace_back(w, avg);
    }
    char line[512];
    double mb = last.input_bytes / (1024.0 * 1024.0);
    std::snprintf(line, sizeof line,
                  "Done: %llu documents, %llu tokens, %llu bytes (%.2f MiB) in %.2f s, %.2f MiB/s, %d workers, "
                  "%.2f CPU s (%.2f MiB per CPU second)%s",
                  static_cast<unsigned long long>(last.documents), static_cast<unsigned long long>(last.tokens),
                  static_cast<unsigned long long>(last.input_bytes), mb, last.seconds,
                  last.seconds > 0 ? mb / last.seconds : 0.0, w, last.cpu_seconds,
                  last.cpu_seconds > 0 ? mb / last.cpu_seconds : 0.0,
                  last.skipped_lines ? (", " + std::to_string(last.skipped_lines) + " invalid lines skipped").c_str()
                                     : "");
    std::cout << line << "\n";
    std::cout.flush();
  }
  if (find_optimal) {
    std::stable_sort(perf.begin(), perf.end(), [](auto& a, auto& b) { return a.second > b.second; });
    std::cout << "\n-----------------------------------\n";
    std::cout << "Performance results (fastest \u2192 slowest):\n";
    char buf[256];
    for (size_t i = 0; i < perf.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%zu. %d workers \u2192 avg. docs/s: %.4f", i + 1, perf[i].first, perf[i].second);
      std::cout << buf << "\n";
    }
    std::cout << "\n-----------------------------------\n";
    std::snprintf(buf, sizeof buf, "The most optimal num of workers is %d with avg. preprocessed docs/s: %.4f.",
                  perf[0].first, perf[0].second);
    std::cout << buf << "\n-----------------------------------\n";
  }
  return 0;
}

}  // namespace

extern "C" void on_signal(int) { pp::request_stop(); }

int main(int argc, char** argv) {
  megatron::ignore_file_size_signal();  // writes past `ulimit -f` fail with EFBIG, not a signal
  // Ctrl-C / SIGTERM: stop after the current batch and remove the temporary .bin/.idx files.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  try {
    return run(argc, argv);
  } catch (const megatron::UserError& e) {
    std::cout.flush();
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "internal error: " << e.what() << "\n";
    return 2;
  }
}
