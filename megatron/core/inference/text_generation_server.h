// Megatron's text generation REST API without the HTTP layer (megatron/inference/
// text_generation_server.py MegatronGenerate.put and api.py generate_and_post_process): request
// validation with Megatron's messages, tokenization and limits, the response JSON, and the
// rank-0-broadcasts protocol that keeps the other ranks of a tensor-parallel model in step.
// tools/run_text_generation_server.cpp puts cpp-httplib in front of it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/inference/text_generation.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"

namespace megatron::inference {

/// The fields of a PUT /api request, with Megatron's defaults.
struct GenerateRequest {
  std::vector<std::string> prompts;
  int64_t tokens_to_generate = 64;
  bool logprobs = false;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 0.0, top_p_decay = 0.0, top_p_bound = 0.0;
  bool add_BOS = false;
  bool stop_on_double_eol = false, stop_on_eol = false, prevent_newline_after_colon = false;
  int64_t random_seed = -1;  // -1: keep the RNG's state
  bool no_log = false;
  std::optional<int64_t> stop_token;  // replaces EOD as the termination id (see docs/inference.md)
  double length_penalty = 1.0;        // beam search only (refused): validated, unused
};

/// MegatronGenerate.put's checks, in its order and with its messages (e.g. "prompts argument
/// required", "tokens_to_generate must be an integer greater than or equal to 0", "Beam search is
/// no longer supported."). Types as Python's isinstance: integers for int fields (a JSON float
/// such as 1.0 is refused), any number for temperature, a float literal for top_p / top_p_decay /
/// top_p_bound / length_penalty (1 is refused, 1.0 accepted), booleans for flags; prompts must be
/// strings. Returns the message (to answer with HTTP 400), or "" when `req` was filled.
std::string parse_generate_request(const nlohmann::json& body, GenerateRequest& req);

/// Limits of a server (Megatron's args).
struct GenerationLimits {
  int64_t max_position_embeddings = 0;       // --max-position-embeddings
  int64_t max_tokens_to_oom = 12000;         // --max-tokens-to-oom: batch * (longest prompt + tokens_to_generate)
  int64_t inference_max_seq_length = 2560;   // --inference-max-seq-length: KV cache length
  int64_t padded_vocab_size = 0;             // token ids must be below this
};

/// Megatron's ValueError of generate(): answered as HTTP 400 with what().
struct GenerationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A tokenized, checked batch: what rank 0 broadcasts.
struct PreparedBatch {
  std::vector<std::vector<int64_t>> tokens;  // padded rows
  std::vector<int64_t> lengths;
  GenerationParams params;
  int64_t random_seed = -1;
  nlohmann::json to_json() const;
  static PreparedBatch from_json(const nlohmann::json& j);
};

/// Tokenizes the prompts, pads them and checks the limits: GenerationError with Megatron's
/// messages "Length of prompt + tokens_to_generate longer than allowed", "Too many tokens.  N is
/// greater than M", or one naming a prompt whose token id is outside the vocabulary / that the
/// tokenizer rejects.
PreparedBatch prepare_batch(const GenerateRequest& req, const tokenizers::MegatronTokenizer& tokenizer,
                            const GenerationLimits& limits);

/// Runs the batch (collective over the generator's TP group) and returns Megatron's response on
/// TP rank 0: {"text": [prompt + generation], "segments": [[per-token strings]], "logprobs":
/// [[log p of tokens 1..n-1]] or null, "tokens": [[ids]]}, each sequence cut to its length.
nlohmann::json generate_and_post_process(TextGenerator& generator, const PreparedBatch& batch,
                                         const tokenizers::MegatronTokenizer& tokenizer);

/// The rank-0 protocol over `world` (every rank, same order; Megatron's send_do_generate):
/// rank 0 calls send_generate(batch) before its own generate_and_post_process, or send_stop() to
/// end; the other ranks loop in serve_workers() until the stop. Device: where the control
/// tensors live (the model's device, so NCCL groups work).
void send_generate(comm::ProcessGroup& world, Device device, const PreparedBatch& batch);
void send_stop(comm::ProcessGroup& world, Device device);
/// A no-op message that keeps idle workers' collectives inside the distributed timeout
/// (--distributed-timeout-minutes): the server sends one every few seconds while idle.
void send_ping(comm::ProcessGroup& world, Device device);
void serve_workers(comm::ProcessGroup& world, Device device, TextGenerator& generator,
                   const tokenizers::MegatronTokenizer& tokenizer);

}  // namespace megatron::inference
