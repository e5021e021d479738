#include "megatron/core/inference/text_generation_server.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "megatron/core/inference/tokenization.h"
#include "megatron/core/utils/errors.h"

namespace megatron::inference {

using nlohmann::json;

std::string parse_generate_request(const json& body, GenerateRequest& r) {
  r = GenerateRequest();
  if (!body.is_object() || !body.contains("prompts")) return "prompts argument required";
  if (body.contains("max_len")) return "max_len is no longer used.  Replace with tokens_to_generate";
  if (body.contains("sentences")) return "sentences is no longer used.  Replace with prompts";
  if (body.contains("beam_width")) return "Beam search is no longer supported.";
  const json& prompts = body["prompts"];
  if (!prompts.is_array()) return "prompts is not a list of strings";
  if (prompts.empty()) return "prompts is empty";
  if (prompts.size() > 128) return "Maximum number of prompts is 128";
  for (const auto& p : prompts) {
    if (!p.is_string()) return "prompts is not a list of strings";
    r.prompts.push_back(p.get<std::string>());
  }
  auto has = [&](const char* k) { return body.contains(k); };
  if (has("tokens_to_generate")) {
    const json& v = body["tokens_to_generate"];
    if (!v.is_number_integer()) return "tokens_to_generate must be an integer greater than 0";
    // A value above INT64_MAX (stored unsigned) would wrap negative in get<int64_t>().
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return "Length of prompt + tokens_to_generate longer than allowed";
    r.tokens_to_generate = v.get<int64_t>();
    if (r.tokens_to_generate < 0) return "tokens_to_generate must be an integer greater than or equal to 0";
  }
  if (has("logprobs")) {
    if (!body["logprobs"].is_boolean()) return "logprobs must be a boolean value";
    r.logprobs = body["logprobs"].get<bool>();
  }
  if (r.tokens_to_generate == 0 && !r.logprobs) return "tokens_to_generate=0 implies logprobs should be True";
  if (has("temperature")) {
    const json& v = body["temperature"];
    if (!v.is_number()) return "temperature must be a positive number less than or equal to 100.0";
    r.temperature = v.get<double>();
    if (!(0.0 < r.temperature && r.temperature <= 100.0))
      return "temperature must be a positive number less than or equal to 100.0";
  }
  if (has("top_k")) {
    const json& v = body["top_k"];
    if (!v.is_number_integer())
      return "top_k must be an integer equal to or greater than 0 and less than or equal to 1000";
    r.top_k = v.get<int64_t>();
    if (!(0 <= r.top_k && r.top_k <= 1000))
      return "top_k must be equal to or greater than 0 and less than or equal to 1000";
  }
  if (has("top_p")) {
    const json& v = body["top_p"];
    if (!v.is_number_float()) return "top_p must be a positive float less than or equal to 1.0";
    r.top_p = v.get<double>();
    if (r.top_p > 0.0 && r.top_k > 0) return "cannot set both top-k and top-p samplings.";
    if (!(0 <= r.top_p && r.top_p <= 1.0)) return "top_p must be less than or equal to 1.0";
  }
  if (has("top_p_decay")) {
    const json& v = body["top_p_decay"];
    if (!v.is_number_float()) return "top_p_decay must be a positive float less than or equal to 1.0";
    r.top_p_decay = v.get<double>();
    if (r.top_p == 0.0) return "top_p_decay cannot be set without top_p";
    if (!(0 <= r.top_p_decay && r.top_p_decay <= 1.0)) return "top_p_decay must be less than or equal to 1.0";
  }
  if (has("top_p_bound")) {
    const json& v = body["top_p_bound"];
    if (!v.is_number_float()) return "top_p_bound must be a positive float less than or equal to top_p";
    r.top_p_bound = v.get<double>();
    if (r.top_p == 0.0) return "top_p_bound cannot be set without top_p";
    if (!(0.0 < r.top_p_bound && r.top_p_bound <= r.top_p)) return "top_p_bound must be greater than 0 and less than top_p";
  }
  auto boolean = [&](const char* k, bool& dst) -> std::string {
    if (!has(k)) return "";
    if (!body[k].is_boolean()) return std::string(k) + " must be a boolean value";
    dst = body[k].get<bool>();
    return "";
  };
  if (auto e = boolean("add_BOS", r.add_BOS); !e.empty()) return e;
  if (!r.add_BOS && std::any_of(r.prompts.begin(), r.prompts.end(), [](const std::string& p) { return p.empty(); }))
    return "Empty prompts require add_BOS=true";
  if (auto e = boolean("stop_on_double_eol", r.stop_on_double_eol); !e.empty()) return e;
  if (auto e = boolean("stop_on_eol", r.stop_on_eol); !e.empty()) return e;
  if (auto e = boolean("prevent_newline_after_colon", r.prevent_newline_after_colon); !e.empty()) return e;
  if (has("random_seed")) {
    if (!body["random_seed"].is_number_integer()) return "random_seed must be integer";
    r.random_seed = body["random_seed"].get<int64_t>();
    if (r.random_seed < 0) return "random_seed must be a positive integer";
  }
  if (auto e = boolean("no_log", r.no_log); !e.empty()) return e;
  if (has("stop_token")) {
    if (!body["stop_token"].is_number_integer()) return "stop_token must be an integer";
    r.stop_token = body["stop_token"].get<int64_t>();
  }
  if (has("length_penalty")) {
    if (!body["length_penalty"].is_number_float()) return "length_penalty must be a float";
    r.length_penalty = body["length_penalty"].get<double>();
  }
  return "";
}

json PreparedBatch::to_json() const {
  const GenerationParams& p = params;
  return {{"tokens", tokens},
          {"lengths", lengths},
          {"random_seed", random_seed},
          {"params",
           {p.tokens_to_generate, p.return_output_log_probs, p.top_k, p.top_p, p.top_p_decay, p.top_p_bound,
            p.temperature, p.use_eod_token_for_early_termination, p.stop_on_double_eol, p.stop_on_eol,
            p.prevent_newline_after_colon, p.termination_id, p.colon_id, p.newline_id, p.vocab_size}}};
}

PreparedBatch PreparedBatch::from_json(const json& j) {
  PreparedBatch b;
  b.tokens = j.at("tokens").get<std::vector<std::vector<int64_t>>>();
  b.lengths = j.at("lengths").get<std::vector<int64_t>>();
  b.random_seed = j.at("random_seed").get<int64_t>();
  const json& a = j.at("params");
  GenerationParams& p = b.params;
  p.tokens_to_generate = a[0];
  p.return_output_log_probs = a[1];
  p.top_k = a[2];
  p.top_p = a[3];
  p.top_p_decay = a[4];
  p.top_p_bound = a[5];
  p.temperature = a[6];
  p.use_eod_token_for_early_termination = a[7];
  p.stop_on_double_eol = a[8];
  p.stop_on_eol = a[9];
  p.prevent_newline_after_colon = a[10];
  p.termination_id = a[11];
  p.colon_id = a[12];
  p.newline_id = a[13];
  p.vocab_size = a[14];
  return b;
}

PreparedBatch prepare_batch(const GenerateRequest& req, const tokenizers::MegatronTokenizer& tokenizer,
                            const GenerationLimits& limits) {
  std::vector<std::vector<int64_t>> ids;
  try {
    ids = tokenize_prompts(tokenizer, req.prompts, req.add_BOS);
  } catch (const UserError& e) {
    throw GenerationError(std::string("cannot tokenize the prompts: ") + e.what());
  }
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t t : ids[i])
      if (t < 0 || t >= limits.padded_vocab_size)
        throw GenerationError("prompt " + std::to_string(i) + " has token id " + std::to_string(t) +
                              " outside the vocabulary [0, " + std::to_string(limits.padded_vocab_size) + ")");
  // The limits are checked before the padded rows are allocated, in arithmetic that cannot
  // overflow: tokens_to_generate may be anything up to INT64_MAX.
  int64_t longest = 0;
  for (const auto& p : ids) longest = std::max(longest, static_cast<int64_t>(p.size()));
  const int64_t batch = static_cast<int64_t>(ids.size());
  const int64_t ttg = req.tokens_to_generate;
  if (ttg < 0 || ttg > limits.max_position_embeddings - longest ||
      (ttg > 0 && ttg > limits.inference_max_seq_length - longest))
    throw GenerationError("Length of prompt + tokens_to_generate longer than allowed");
  const int64_t max_sequence_length = longest + ttg;  // <= max_position_embeddings: no overflow
  if (max_sequence_length == 0) throw GenerationError("every prompt is empty: nothing to score");
  if (max_sequence_length * batch > limits.max_tokens_to_oom)  // batch <= 128 prompts
    throw GenerationError("Too many tokens.  " + std::to_string(max_sequence_length * batch) + " is greater than " +
                          std::to_string(limits.max_tokens_to_oom));
  PreparedBatch b;
  b.tokens = pad_prompts(ids, ttg, tokenizer.eod(), &b.lengths);
  GenerationParams& p = b.params;
  p.tokens_to_generate = req.tokens_to_generate;
  p.return_output_log_probs = req.logprobs;
  p.top_k = req.top_k;
  p.top_p = req.top_p;
  p.top_p_decay = req.top_p_decay;
  p.top_p_bound = req.top_p_bound;
  p.temperature = req.temperature;
  p.stop_on_double_eol = req.stop_on_double_eol;
  p.stop_on_eol = req.stop_on_eol;
  p.prevent_newline_after_colon = req.prevent_newline_after_colon;
  p.termination_id = req.stop_token.value_or(tokenizer.eod());
  p.vocab_size = tokenizer.vocab_size();
  // What sample() asserts on rank 0 mid-generation, checked here, before anything is broadcast, so
  // a bad request is a 400 and never leaves the other ranks waiting (Megatron's sampling.py:
  // "top-k is larger than logit size." / "top-k is larger than vocab size.").
  if (p.top_k > 1 && (p.top_k > limits.padded_vocab_size || p.top_k >= p.vocab_size))
    throw GenerationError("top_k " + std::to_string(p.top_k) + " must be less than the vocabulary size " +
                          std::to_string(p.vocab_size) + " (top-k is larger than vocab size.)");
  if (p.top_k != 1 && !(p.temperature > 0.0))
    throw GenerationError("temperature must be a positive number less than or equal to 100.0");
  if (p.top_k > 1 && p.top_p > 0.0) throw GenerationError("cannot set both top-k and top-p samplings.");
  if (p.top_k == 1 && p.top_p != 0.0) throw GenerationError("cannot set both greedy and top-p samplings.");
  if (!(p.top_p >= 0.0 && p.top_p <= 1.0)) throw GenerationError("top_p must be less than or equal to 1.0");
  if (req.prevent_newline_after_colon) {
    try {  // tokenizer.tokenize(':')[0] and tokenize('\n')[0], as Megatron
      auto colon = tokenizer.tokenize(":"), newline = tokenizer.tokenize("\n");
      if (!colon.empty() && !newline.empty()) {
        p.colon_id = colon[0];
        p.newline_id = newline[0];
      }
    } catch (const UserError&) {  // a tokenizer without ':' / '\n' (NullTokenizer): nothing to prevent
    }
  }
  b.random_seed = req.random_seed;
  return b;
}

json generate_and_post_process(TextGenerator& generator, const PreparedBatch& batch,
                               const tokenizers::MegatronTokenizer& tokenizer) {
  if (batch.random_seed >= 0) generator.rng().manual_seed(static_cast<uint64_t>(batch.random_seed));
  GenerationOutput out = generator.generate(batch.tokens, batch.lengths, batch.params);
  json text = json::array(), segments = json::array(), tokens = json::array(), logprobs = json::array();
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    const auto n = static_cast<size_t>(std::min<int64_t>(out.lengths[i], static_cast<int64_t>(out.tokens[i].size())));
    std::vector<int64_t> ids(out.tokens[i].begin(), out.tokens[i].begin() + n);
    Detokenized d = detokenize_generation(tokenizer, ids, true);
    text.push_back(d.text);
    segments.push_back(d.segments);
    tokens.push_back(ids);
    if (batch.params.return_output_log_probs) {
      // api.py: output_log_probs[i][:len(segments) - 1]
      const auto& lp = out.log_probs[i];
      logprobs.push_back(std::vector<float>(lp.begin(), lp.begin() + std::min(lp.size(), n > 0 ? n - 1 : 0)));
    }
  }
  return {{"text", text},
          {"segments", segments},
          {"logprobs", batch.params.return_output_log_probs ? logprobs : json()},
          {"tokens", tokens}};
}

namespace {
constexpr int64_t kGenerate = 0;  // Megatron's GENERATE_NUM
constexpr int64_t kPing = 1;      // ours: keep-alive while idle (Megatron's 1 is beam search, refused here)
constexpr int64_t kStop = 2;      // ours: the server is shutting down

void broadcast_control(comm::ProcessGroup& world, Device device, int64_t& choice, std::string& payload) {
  Tensor head = Tensor::from_vector_i64({choice, static_cast<int64_t>(payload.size())}, {2}).to(device);
  world.broadcast(head, 0);
  Tensor h = head.to(Device::cpu());
  choice = h.data<int64_t>()[0];
  const int64_t n = h.data<int64_t>()[1];
  if (n == 0) return;
  Tensor bytes = Tensor::empty({n}, DType::kUInt8);
  if (world.rank() == 0) std::copy(payload.begin(), payload.end(), bytes.data<uint8_t>());
  Tensor d = bytes.to(device);
  world.broadcast(d, 0);
  Tensor back = d.to(Device::cpu());
  payload.assign(reinterpret_cast<const char*>(back.data<uint8_t>()), static_cast<size_t>(n));
}
}  // namespace

void send_generate(comm::ProcessGroup& world, Device device, const PreparedBatch& batch) {
  if (world.size() == 1) return;
  int64_t choice = kGenerate;
  std::string payload = batch.to_json().dump();
  broadcast_control(world, device, choice, payload);
}

void send_stop(comm::ProcessGroup& world, Device device) {
  if (world.size() == 1) return;
  int64_t choice = kStop;
  std::string payload;
  broadcast_control(world, device, choice, payload);
}

void send_ping(comm::ProcessGroup& world, Device device) {
  if (world.size() == 1) return;
  int64_t choice = kPing;
  std::string payload;
  broadcast_control(world, device, choice, payload);
}

void serve_workers(comm::ProcessGroup& world, Device device, TextGenerator& generator,
                   const tokenizers::MegatronTokenizer& tokenizer) {
  while (true) {
    int64_t choice = -1;
    std::string payload;
    broadcast_control(world, device, choice, payload);
    if (choice == kStop) return;
    if (choice == kPing) continue;
    MEGATRON_CHECK(choice == kGenerate) << "unknown control message " << choice << " from rank 0";
    try {  // a request that failed on every rank (e.g. rank 0's sampling abort) ends here, not the server
      (void)generate_and_post_process(generator, PreparedBatch::from_json(json::parse(payload)), tokenizer);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: request abandoned: %s\n", world.rank(), e.what());
    }
  }
}

}  // namespace megatron::inference
