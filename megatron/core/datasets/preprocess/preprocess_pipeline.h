// The preprocess_data pipeline: JSONL -> Megatron .bin/.idx, multi-threaded, order-preserving.
//
// Behaviour matches Megatron-LM's tools/preprocess_data.py (docs/megatron-reference.md#preprocess_data):
// one dataset per --json-keys key named {output_prefix}_{key}_{document|sentence}; one document
// per JSON line; without --split-sentences a document is one sequence (the whole value
// tokenized in one call), with it each non-empty sentence is one sequence; --append-eod adds
// the tokenizer's eod to every document that produced at least one token and counts it in the
// last sequence; empty documents still record a boundary; with --partitions P > 1 (round-robin)
// the output holds lines 0, P, 2P, ... then 1, P+1, ... exactly as Megatron's merge of its
// partition files does (with --keep-sequential-samples the order is the input order).
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace megatron::tokenizers {
class MegatronTokenizer;
}

namespace megatron::datasets::preprocess {

/// Options of one preprocessing run (Megatron's flag names in comments).
struct PreprocessConfig {
  std::vector<std::string> inputs;                // --input (a glob expands to several, read in order)
  std::vector<std::string> json_keys{"text"};     // --json-keys
  std::string output_prefix;                      // --output-prefix
  bool split_sentences = false;                   // --split-sentences (ICU, not punkt)
  bool keep_newlines = false;                     // --keep-newlines
  std::string lang = "english";                   // --lang
  bool append_eod = false;                        // --append-eod
  int workers = 1;                                // --workers (tokenizer threads)
  int partitions = 1;                             // --partitions (output order only)
  bool keep_sequential_samples = false;           // --keep-sequential-samples
  int64_t log_interval = 1000;                    // --log-interval
  int64_t max_documents = -1;                     // stop after this many documents (-1: all)
  bool skip_invalid_lines = false;                // --skip-invalid-lines (ours)
  int progress_bar = -1;                          // -1: when stderr is a terminal, 0 off, 1 on
  size_t batch_bytes = 1 << 20;                   // input bytes per work item
};

/// What a run did.
struct PreprocessStats {
  uint64_t documents = 0;        // documents written (per key)
  uint64_t skipped_lines = 0;    // invalid lines skipped (--skip-invalid-lines)
  uint64_t tokens = 0;           // tokens written, all keys
  uint64_t input_bytes = 0;      // decoded input bytes (line terminators included)
  uint64_t characters = 0;       // Python characters (Megatron's "MB" counter)
  double seconds = 0;            // processing time (after startup), wall clock
  double cpu_seconds = 0;        // CPU time of the whole process during processing (user+sys)
  std::vector<double> performance;  // docs/s at each progress line (--find-optimal-num-workers)
};

/// Output path prefix of key `key`: {prefix}_{key}_{document|sentence}.
std::string output_dataset_prefix(const PreprocessConfig& cfg, const std::string& key);

/// Runs the pipeline. Prints Megatron's "Opening", "Time to startup:" lines to `out`,
/// "Processed N documents (x docs/s, y MB/s)." lines (and a progress bar on a terminal) to
/// `err`. `startup_begin` is when the program started building the tokenizer.
/// Throws UserError naming file:line for an invalid line (unless skip_invalid_lines), a bad
/// input file or an output that cannot be written; outputs appear only when complete.
PreprocessStats run_preprocess(const PreprocessConfig& cfg, const tokenizers::MegatronTokenizer& tokenizer,
                               std::ostream& out, std::ostream& err,
                               std::chrono::steady_clock::time_point startup_begin);

/// Asks a running run_preprocess to stop: it then throws UserError("interrupted") after the
/// current batch, and its temporary files are removed. Async-signal-safe (a lock-free atomic
/// store), meant for SIGINT/SIGTERM handlers.
void request_stop() noexcept;

/// Python's repr() of a float (shortest round-trip digits, always with a '.' or exponent),
/// used to print Megatron's progress numbers exactly as Python does.
std::string python_float_repr(double v);

/// Number of Python characters (code points) in UTF-8 text.
uint64_t count_code_points(const char* s, size_t n);

}  // namespace megatron::datasets::preprocess
