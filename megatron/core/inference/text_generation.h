// The text generation engine: Megatron's megatron/inference/text_generation/generation.py
// (generate_tokens_probs_and_return_on_first_stage, score_and_return_on_first_stage) over a
// GPTModel with a KV cache (transformer/inference_context.h).
//
// Batching semantics are Megatron's: the prompts are right-padded (with EOD) to one length
// L = longest prompt + tokens_to_generate; generation starts at the SHORTEST prompt's length and
// advances all sequences together one position per step; at position t a sequence whose prompt is
// longer than t keeps its prompt token (the sample is discarded), the others take the sample. Every
// sequence therefore sees exactly its own prefix at every step, so a batch gives the same tokens as
// each prompt alone with the same L (tests/unit_tests/inference). The first step (prefill) runs the
// model on positions [0, shortest), each later step on one position (decode), reading the cache.
//
// Tensor parallelism: every TP rank calls generate() with the same arguments; the logits are
// gathered over the TP group, TP rank 0 samples (sampling.h) and broadcasts the new tokens, so the
// ranks stay in step. Results are meaningful on TP rank 0 (the others return the same tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/inference/sampling.h"

namespace megatron::models::gpt {
class GPTModel;
}

namespace megatron::inference {

/// How the decode steps (one token per sequence) of generate() run (docs/inference.md "CUDA graph
/// of the decode step"). Every mode gives the same tokens and logits, bit for bit.
enum class DecodeGraphMode {
  /// Every op launched from the host per step, the token ids and positions uploaded per op call
  /// (the CPU, TP > 1, MEGATRON_DECODE_CUDA_GRAPH=0).
  kEager,
  /// The graph's step launched eagerly: inputs, positions and outputs in fixed device buffers,
  /// the cache position read from device memory (ops::kv_cache_write, AttentionParams::kv_len);
  /// no capture. What kGraph falls back to when a capture fails; the CPU tests run it.
  kDeviceInputs,
  /// kDeviceInputs captured once per batch size (and cache capacity) as a CUDA graph on a
  /// private compute stream and replayed every step (CUDA, one TP rank; the default there).
  kGraph,
};
// With kDeviceInputs and kGraph the greedy device-argmax steps are also pipelined by default
// (TextGenerator::set_decode_pipeline, docs/inference.md "Pipelined decode"): the step feeds its
// own clamped argmax and the advanced positions to the next step on the device, and once every
// row is past its prompt the host launches step t+1 before it reads step t's ids.

/// Megatron's generate() arguments (api.py / generation.py names).
struct GenerationParams {
  int64_t tokens_to_generate = 0;        // 0: score the prompts (log-probs only)
  bool return_output_log_probs = false;  // log-probs of the chosen tokens (from the raw logits)
  int64_t top_k = 0;                     // 1 = greedy
  double top_p = 0.0;
  double top_p_decay = 0.0;  // after each step top_p *= top_p_decay (not below top_p_bound)
  double top_p_bound = 0.0;
  double temperature = 1.0;
  bool use_eod_token_for_early_termination = true;  // stop when every sequence produced termination_id
  bool stop_on_double_eol = false;  // GPT-2 ids, as Megatron: 628 ("\n\n") or 198 twice
  bool stop_on_eol = false;         // 198 ("\n") or 628
  bool prevent_newline_after_colon = false;  // logit of newline_id = -1e10 after colon_id
  int64_t termination_id = -1;      // EOD (or the request's stop_token)
  int64_t colon_id = -1, newline_id = -1;
  int64_t vocab_size = 0;           // the tokenizer's (unpadded) size: samples are clamped below it
};

/// generate() output (Megatron's tokens, generated_sequence_lengths, output_log_probs).
struct GenerationOutput {
  /// [b][n]: prompts and generated tokens up to the last generated position n (n <= L; shorter when
  /// every sequence stopped early). Tokens past a sequence's length are not meaningful.
  std::vector<std::vector<int64_t>> tokens;
  /// [b]: prompt + generation length of each sequence, including its termination token
  /// (the prompt length when scoring).
  std::vector<int64_t> lengths;
  /// [b][n - 1] when requested (else empty): log_probs[i][j] = log p(tokens[i][j + 1] | tokens[i][0..j]).
  std::vector<std::vector<float>> log_probs;
};

/// Runs generations on one model (not thread-safe: one generate() at a time).
class TextGenerator {
 public:
  /// `model`: the whole model on this rank (no pipeline split), built without sequence
  /// parallelism. tp_group: the model's TP group (nullptr = single rank). seed: the RNG's start
  /// seed (pretrain's --seed).
  /// The decode mode is kGraph for a model on a CUDA device unless the environment variable
  /// MEGATRON_DECODE_CUDA_GRAPH is 0 (then and on the CPU kEager); TP > 1 always runs kEager.
  /// MEGATRON_DECODE_CUDA_GRAPH=1 turns the pipelined loop off (per-step graph launches), 2 or
  /// unset leaves it on; any other value throws UserError naming the variable.
  TextGenerator(models::gpt::GPTModel& model, std::shared_ptr<comm::ProcessGroup> tp_group, uint64_t seed);
  ~TextGenerator();

  /// Overrides the decode mode (tests: kDeviceInputs on the CPU; kGraph needs a CUDA model, else
  /// its capture fails once with a one-line note and the steps run as kDeviceInputs). Drops the
  /// captured graphs and their KV caches.
  void set_decode_graph_mode(DecodeGraphMode mode);
  DecodeGraphMode decode_graph_mode() const { return mode_; }
  /// Decode steps of this generator so far that replayed a captured graph (tests, benchmarks).
  int64_t graph_replays() const { return graph_replays_; }
  /// Turns the pipelined greedy loop on (the default) or off (every step's ids read before the
  /// next step is launched, the inputs uploaded per step); it applies with kDeviceInputs and
  /// kGraph on one TP rank to greedy generation without log-probs (top_k 1, top_p 0, no
  /// prevent_newline_after_colon). Same tokens and lengths either way. Drops the kept steps.
  void set_decode_pipeline(bool on);
  bool decode_pipeline() const { return pipeline_; }
  /// Decode steps of this generator so far launched before the previous step's ids were read
  /// (self-fed on the device; a step launched past the end of a generation is counted too).
  int64_t pipelined_steps() const { return pipelined_steps_; }

  /// Generates (tokens_to_generate > 0) or scores (0) a batch. tokens [b][L] right-padded rows of one
  /// length L (pad_prompts), lengths [b] the prompt lengths (1 <= length <= L). Collective over the
  /// TP group. Throws UserError for inconsistent shapes or sampling settings.
  GenerationOutput generate(const std::vector<std::vector<int64_t>>& tokens, const std::vector<int64_t>& lengths,
                            const GenerationParams& params);

  /// Kernel profile (CUDA builds, docs/inference.md#performance): with the environment variable
  /// MEGATRON_GENERATE_PROFILE=N[,M...] the N-th (1-based, per process) generate() call records
  /// its decode steps after the first one (CUPTI) and prints the step-time breakdown to stderr
  /// ("[Rank r] kernel profile | ..." lines; "iterations" are the decode steps). Other calls are
  /// not slowed.
  /// The RNG of TP rank 0 (manual_seed for a request's random_seed).
  SamplingRng& rng() { return rng_; }
  models::gpt::GPTModel& model() { return model_; }

 private:
  models::gpt::GPTModel& model_;
  std::shared_ptr<comm::ProcessGroup> tp_;
  SamplingRng rng_;
  int64_t calls_ = 0;  // generate() calls so far (MEGATRON_GENERATE_PROFILE)
  DecodeGraphMode mode_ = DecodeGraphMode::kEager;
  struct DecodeState;  // text_generation.cpp: the private stream and the per-batch-size steps
  std::unique_ptr<DecodeState> decode_;
  int64_t graph_replays_ = 0;
  bool pipeline_ = true;
  int64_t pipelined_steps_ = 0;
};

/// Megatron's _tokenize_prompts_and_batch padding: every row extended with `pad_id` to
/// max(len) + tokens_to_generate. Returns the padded rows; `lengths` receives the prompt lengths.
std::vector<std::vector<int64_t>> pad_prompts(const std::vector<std::vector<int64_t>>& prompts,
                                              int64_t tokens_to_generate, int64_t pad_id,
                                              std::vector<int64_t>* lengths);

}  // namespace megatron::inference
