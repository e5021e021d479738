// Text generation (megatron/core/inference): the KV cache against a full recompute, Megatron's
// batching semantics against one prompt at a time, seeded sampling, the sampling filters, the
// REST request validation, and the transformers oracle (greedy continuations and log-probs of
// tests/reference/hf/generation/, written by generate_generation_fixtures.py on the GPU machine;
// skipped until they are committed).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "megatron/core/inference/sampling.h"
#include "megatron/core/inference/text_generation.h"
#include "megatron/core/inference/text_generation_server.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/tokenizers/null_tokenizer.h"
#include "megatron/core/transformer/inference_context.h"
#include "megatron/training/hf/hf_checkpoint.h"
#include "megatron/training/hf/hf_model.h"

namespace megatron {
namespace {

using inference::GenerationParams;
using inference::TextGenerator;
using models::gpt::GPTModel;
using nlohmann::json;

const std::string kHF = std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/hf/";

/// A random tiny model of the LLaMA (rope, RMSNorm, SwiGLU, GQA, untied) or GPT-2 (learned
/// positions, LayerNorm, tanh GeLU, biases, tied) flavour, shapes from the HF fixtures' config.json.
/// init std 0.3 (instead of 0.02): peaked next-token distributions, so greedy choices are not
/// decided by float32 rounding (top-2 margins far above the ~1e-6 noise of a reordered sum).
std::unique_ptr<GPTModel> tiny_model(const std::string& flavour, uint64_t seed = 7) {
  transformer::TransformerConfig c = hf::transformer_config_from_hf(hf::read_hf_config(kHF + flavour + "/config.json"));
  c.init_method_std = 0.3f;
  return std::make_unique<GPTModel>(c, 256, 64, seed);
}

std::vector<std::vector<int64_t>> random_prompts(const std::vector<int>& lengths, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<std::vector<int64_t>> p;
  for (int n : lengths) {
    p.emplace_back();
    for (int i = 0; i < n; ++i) p.back().push_back(static_cast<int64_t>(g() % 256));
  }
  return p;
}

GenerationParams greedy(int64_t n, bool logprobs = true) {
  GenerationParams gp;
  gp.tokens_to_generate = n;
  gp.top_k = 1;
  gp.return_output_log_probs = logprobs;
  gp.use_eod_token_for_early_termination = false;
  gp.vocab_size = 256;
  return gp;
}

class Flavours : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Inference, Flavours, ::testing::Values("llama_tiny", "gpt2_tiny"));

// Prefill + chunk (explicit-mask path) + single-token decode through the KV cache gives the logits
// of one full causal forward over the same tokens. fp32 CPU; the only difference is the order of
// the GEMM sums (a row of 1 vs a block of rows), bounded by 1e-5 of the largest logit as the HF
// comparisons of GPTModel.
TEST_P(Flavours, KvCacheDecodeEqualsFullRecompute) {
  auto model = tiny_model(GetParam());
  const int64_t b = 2, s = 30;
  auto rows = random_prompts({30, 30}, 3);
  Tensor all = Tensor::empty({b, s}, DType::kInt64);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < s; ++j) all.data<int64_t>()[i * s + j] = rows[i][j];
  std::vector<float> full = model->forward_logits(all).to_float_vector();  // [s, b, V]
  transformer::InferenceContext ictx(b, s);
  std::vector<float> inc;
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{0, 10}, {10, 15}};
  auto run = [&](int64_t from, int64_t to) {
    Tensor t = Tensor::empty({b, to - from}, DType::kInt64);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = from; j < to; ++j) t.data<int64_t>()[i * (to - from) + j - from] = rows[i][j];
    std::vector<float> l = model->forward_logits(t, &ictx).to_float_vector();
    ictx.sequence_len_offset += to - from;
    inc.insert(inc.end(), l.begin(), l.end());
  };
  for (auto [f, t] : chunks) run(f, t);
  for (int64_t j = 15; j < s; ++j) run(j, j + 1);
  ASSERT_EQ(inc.size(), full.size());
  double scale = 0, err = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(full[i])));
    err = std::max(err, std::abs(static_cast<double>(inc[i]) - full[i]));
  }
  EXPECT_GT(scale, 0.5);  // not a degenerate (all-zero) model
  EXPECT_LE(err, 1e-5 * scale) << "max |incremental - full| " << err << " of max |logit| " << scale;
}

// Megatron's batching (right padding, generation from the shortest prompt, prompt tokens kept)
// gives each sequence exactly what it gets alone with the same padded length: same tokens, same
// lengths, log-probs equal up to float32 summation order (1e-5 absolute on log-probs of ~-1..-10).
TEST_P(Flavours, BatchOfDifferentLengthsEqualsOneByOne) {
  auto model = tiny_model(GetParam());
  TextGenerator gen(*model, nullptr, 1);
  auto prompts = random_prompts({3, 9, 6}, 5);
  std::vector<int64_t> lengths;
  auto rows = inference::pad_prompts(prompts, 12, 255, &lengths);
  auto batch = gen.generate(rows, lengths, greedy(12));
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto one = gen.generate({rows[i]}, {lengths[i]}, greedy(12));
    const auto n = static_cast<size_t>(batch.lengths[i]);
    EXPECT_EQ(batch.lengths[i], one.lengths[0]);
    EXPECT_EQ(std::vector<int64_t>(batch.tokens[i].begin(), batch.tokens[i].begin() + n),
              std::vector<int64_t>(one.tokens[0].begin(), one.tokens[0].begin() + n))
        << "prompt " << i;
    EXPECT_EQ(std::vector<int64_t>(batch.tokens[i].begin(), batch.tokens[i].begin() + lengths[i]), prompts[i]);
    for (size_t j = 0; j + 1 < n; ++j) EXPECT_NEAR(batch.log_probs[i][j], one.log_probs[0][j], 1e-5) << i << "," << j;
  }
  // Log-probs of a generation equal the scoring path's (tokens_to_generate = 0, one full forward).
  GenerationParams score;
  score.tokens_to_generate = 0;
  score.return_output_log_probs = true;
  std::vector<int64_t> seq(batch.tokens[0].begin(), batch.tokens[0].end());
  auto sc = gen.generate({seq}, {static_cast<int64_t>(seq.size())}, score);
  for (size_t j = 0; j + 1 < seq.size(); ++j) EXPECT_NEAR(sc.log_probs[0][j], batch.log_probs[0][j], 1e-5) << j;
}

// The termination token ends a sequence with Megatron's lengths: prompt + tokens up to and
// including the stop token; generation stops once every sequence stopped.
TEST(Inference, StopTokenSetsLengthAndEndsEarly) {
  auto model = tiny_model("llama_tiny");
  TextGenerator gen(*model, nullptr, 1);
  auto prompt = random_prompts({5}, 9);
  std::vector<int64_t> lengths;
  auto rows = inference::pad_prompts(prompt, 20, 255, &lengths);
  auto free_run = gen.generate(rows, lengths, greedy(20, false));
  GenerationParams gp = greedy(20, false);
  gp.termination_id = free_run.tokens[0][5 + 6];  // the 7th generated token
  int64_t first = 5;
  while (free_run.tokens[0][first] != gp.termination_id) ++first;  // it may occur earlier
  gp.use_eod_token_for_early_termination = true;
  auto stopped = gen.generate(rows, lengths, gp);
  EXPECT_EQ(stopped.lengths[0], first + 1);
  EXPECT_EQ(static_cast<int64_t>(stopped.tokens[0].size()), first + 1);
}

// Sampling with a seed: the same seed gives the same tokens (run twice), another seed other tokens.
TEST(Inference, SeededSamplingIsReproducible) {
  auto model = tiny_model("gpt2_tiny");
  TextGenerator gen(*model, nullptr, 1);
  std::vector<int64_t> lengths;
  auto rows = inference::pad_prompts(random_prompts({4, 7}, 11), 24, 255, &lengths);
  for (int mode = 0; mode < 3; ++mode) {
    GenerationParams gp = greedy(24, false);
    gp.top_k = mode == 0 ? 0 : mode == 1 ? 20 : 0;
    gp.top_p = mode == 2 ? 0.9 : 0.0;
    gp.temperature = mode == 0 ? 1.5 : 1.0;
    gen.rng().manual_seed(42);
    auto a = gen.generate(rows, lengths, gp);
    gen.rng().manual_seed(42);
    auto b = gen.generate(rows, lengths, gp);
    gen.rng().manual_seed(43);
    auto c = gen.generate(rows, lengths, gp);
    EXPECT_EQ(a.tokens, b.tokens) << "mode " << mode;
    EXPECT_NE(a.tokens, c.tokens) << "mode " << mode << ": another seed drew the same 48 tokens";
  }
}

// The filters of Megatron's sample() on a row whose softmax is known: p = [0.5, 0.3, 0.15, 0.05].
TEST(Inference, SamplingFiltersFollowMegatron) {
  const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto pick = [&](int64_t k, double p, double t, double u) { return inference::sample_row(l.data(), 4, k, p, t, 4, u); };
  // Greedy ignores u and temperature.
  EXPECT_EQ(pick(1, 0, 1, 0.99), 0);
  // No filter: inverse CDF over [0.5, 0.8, 0.95, 1].
  EXPECT_EQ(pick(0, 0, 1, 0.49), 0);
  EXPECT_EQ(pick(0, 0, 1, 0.51), 1);
  EXPECT_EQ(pick(0, 0, 1, 0.90), 2);
  EXPECT_EQ(pick(0, 0, 1, 0.97), 3);
  // top-k 2: renormalized [0.625, 0.375].
  EXPECT_EQ(pick(2, 0, 1, 0.62), 0);
  EXPECT_EQ(pick(2, 0, 1, 0.63), 1);
  EXPECT_EQ(pick(2, 0, 1, 0.999), 1);
  // top-p 0.6: cumsum [0.5, 0.8, ...]; Megatron drops token i when cumsum[i-1] > top_p, so the
  // token that crosses 0.6 (index 1) stays: renormalized [0.625, 0.375].
  EXPECT_EQ(pick(0, 0.6, 1, 0.63), 1);
  EXPECT_EQ(pick(0, 0.6, 1, 0.999), 1);
  // top-p 0.4: only the first token.
  EXPECT_EQ(pick(0, 0.4, 1, 0.999), 0);
  // Temperature 2: p ~ sqrt(p) normalized = [0.379, 0.294, 0.208, 0.120]; cum [0.379, 0.673, 0.880].
  EXPECT_EQ(pick(0, 0, 2, 0.37), 0);
  EXPECT_EQ(pick(0, 0, 2, 0.39), 1);
  EXPECT_EQ(pick(0, 0, 2, 0.87), 2);
  EXPECT_EQ(pick(0, 0, 2, 0.89), 3);
  // Clamped below the tokenizer's vocabulary (padding rows never returned).
  EXPECT_EQ(inference::sample_row(l.data(), 4, 0, 0, 1, 2, 0.97), 1);
}

// MegatronGenerate.put's messages (megatron/inference/text_generation_server.py).
TEST(Inference, RequestValidationUsesMegatronMessages) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "prompts argument required"},
      {R"([1])", "prompts argument required"},
      {R"({"prompts": ["a"], "max_len": 3})", "max_len is no longer used.  Replace with tokens_to_generate"},
      {R"({"prompts": ["a"], "sentences": 3})", "sentences is no longer used.  Replace with prompts"},
      {R"({"prompts": ["a"], "beam_width": 2})", "Beam search is no longer supported."},
      {R"({"prompts": "a"})", "prompts is not a list of strings"},
      {R"({"prompts": [1]})", "prompts is not a list of strings"},
      {R"({"prompts": []})", "prompts is empty"},
      {R"({"prompts": ["a"], "tokens_to_generate": 1.5})", "tokens_to_generate must be an integer greater than 0"},
      {R"({"prompts": ["a"], "tokens_to_generate": -1})",
       "tokens_to_generate must be an integer greater than or equal to 0"},
      {R"({"prompts": ["a"], "logprobs": 1})", "logprobs must be a boolean value"},
      {R"({"prompts": ["a"], "tokens_to_generate": 0})", "tokens_to_generate=0 implies logprobs should be True"},
      {R"({"prompts": ["a"], "temperature": 0})", "temperature must be a positive number less than or equal to 100.0"},
      {R"({"prompts": ["a"], "temperature": "x"})", "temperature must be a positive number less than or equal to 100.0"},
      {R"({"prompts": ["a"], "top_k": 1001})", "top_k must be equal to or greater than 0 and less than or equal to 1000"},
      {R"({"prompts": ["a"], "top_k": 1.0})",
       "top_k must be an integer equal to or greater than 0 and less than or equal to 1000"},
      {R"({"prompts": ["a"], "top_p": 1})", "top_p must be a positive float less than or equal to 1.0"},
      {R"({"prompts": ["a"], "top_k": 5, "top_p": 0.5})", "cannot set both top-k and top-p samplings."},
      {R"({"prompts": ["a"], "top_p": 1.5})", "top_p must be less than or equal to 1.0"},
      {R"({"prompts": ["a"], "top_p_decay": 0.5})", "top_p_decay cannot be set without top_p"},
      {R"({"prompts": ["a"], "top_p": 0.5, "top_p_bound": 0.7})",
       "top_p_bound must be greater than 0 and less than top_p"},
      {R"({"prompts": ["a"], "add_BOS": 1})", "add_BOS must be a boolean value"},
      {R"({"prompts": [""]})", "Empty prompts require add_BOS=true"},
      {R"({"prompts": ["a"], "stop_on_eol": "no"})", "stop_on_eol must be a boolean value"},
      {R"({"prompts": ["a"], "random_seed": -3})", "random_seed must be a positive integer"},
      {R"({"prompts": ["a"], "no_log": 0})", "no_log must be a boolean value"},
      {R"({"prompts": ["a"], "stop_token": "x"})", "stop_token must be an integer"},
      {R"({"prompts": ["a"], "length_penalty": 1})", "length_penalty must be a float"},
  };
  for (const auto& [body, msg] : cases) {
    inference::GenerateRequest r;
    EXPECT_EQ(inference::parse_generate_request(json::parse(body), r), msg) << body;
  }
  json many = {{"prompts", std::vector<std::string>(129, "a")}};
  inference::GenerateRequest r;
  EXPECT_EQ(inference::parse_generate_request(many, r), "Maximum number of prompts is 128");
  json ok = {{"prompts", {"1 2", ""}}, {"tokens_to_generate", 5}, {"add_BOS", true}, {"top_p", 0.9},
             {"top_p_decay", 0.5}, {"top_p_bound", 0.2}, {"random_seed", 3}, {"logprobs", true}};
  ASSERT_EQ(inference::parse_generate_request(ok, r), "");
  EXPECT_EQ(r.tokens_to_generate, 5);
  EXPECT_TRUE(r.add_BOS && r.logprobs);
  EXPECT_EQ(r.random_seed, 3);
  EXPECT_DOUBLE_EQ(r.top_p_bound, 0.2);
}

// A vanishing temperature is greedy (the limit of softmax(l / T) as T -> 0 is the one-hot argmax),
// not NaN probabilities (l / 1e-320 = inf, inf - inf = NaN picked token 0 before).
TEST(Inference, TinyTemperatureActsAsGreedy) {
  const std::vector<float> l = {0.5f, -1.0f, 2.0f, 1.5f};
  for (double t : {1e-320, 1e-300, 1e-30})
    for (double u : {0.0, 0.3, 0.999999})
      for (int64_t k : {0, 2}) EXPECT_EQ(inference::sample_row(l.data(), 4, k, 0.0, t, 4, u), 2) << t << " " << u;
  EXPECT_EQ(inference::sample_row(l.data(), 4, 0, 0.5, 1e-320, 4, 0.9), 2);
}

// Limits and sampling parameters are refused (GenerationError = HTTP 400) before any row is
// allocated or anything broadcast: 128 prompts x 1e12 tokens must not allocate 1e14 ids.
TEST(Inference, PrepareBatchChecksBeforeAllocating) {
  tokenizers::NullTokenizer tok(256, std::nullopt, -1);
  inference::GenerationLimits lim;
  lim.max_position_embeddings = 64;
  lim.padded_vocab_size = 256;
  auto message = [&](const json& body) -> std::string {
    inference::GenerateRequest r;
    if (std::string e = inference::parse_generate_request(body, r); !e.empty()) return e;
    try {
      (void)inference::prepare_batch(r, tok, lim);
    } catch (const inference::GenerationError& e) {
      return e.what();
    }
    return "";
  };
  const std::string too_long = "Length of prompt + tokens_to_generate longer than allowed";
  const std::vector<std::string> many(128, "1 2 3");
  EXPECT_EQ(message({{"prompts", many}, {"tokens_to_generate", int64_t{1000000000000}}}), too_long);
  EXPECT_EQ(message({{"prompts", many}, {"tokens_to_generate", INT64_MAX}}), too_long);
  EXPECT_EQ(message({{"prompts", {"1 2 3"}}, {"tokens_to_generate", uint64_t{1} << 63}}), too_long);
  EXPECT_EQ(message({{"prompts", {"1 2 3"}}, {"tokens_to_generate", 62}}), too_long);  // 3 + 62 > 64
  EXPECT_EQ(message({{"prompts", {"1 2 3"}}, {"tokens_to_generate", 61}}), "");        // 3 + 61 == 64
  EXPECT_EQ(message({{"prompts", {"1 2 3"}}, {"tokens_to_generate", 3}, {"top_k", 256}}),
            "top_k 256 must be less than the vocabulary size 256 (top-k is larger than vocab size.)");
  EXPECT_EQ(message({{"prompts", {"1 2 3"}}, {"tokens_to_generate", 3}, {"top_k", 255}}), "");
}

// The oracle: transformers' generate(do_sample=False) continuations, token for token, and the
// log-probs of prompt + continuation within 1e-4 (fp32 CPU on both sides; log p = logit - lse
// over 256 logits of magnitude <~ 10 whose float32 sums differ in order only: ~1e-6 relative,
// i.e. ~1e-5 absolute, so 1e-4 is a bound with a 10x margin). Each prompt alone, then both
// batched with Megatron's semantics (the shorter prompt's first 64 tokens must still match).
TEST_P(Flavours, GreedyMatchesTransformers) {
  const std::string dir = kHF + "generation/" + GetParam();
  if (!std::filesystem::exists(dir + "/generation.json"))
    GTEST_SKIP() << dir << "/generation.json not generated yet: run tests/reference/hf/generate_generation_fixtures.py "
                 << "on the GPU machine (tests/reference/hf/README.md)";
  json fx = json::parse(std::ifstream(dir + "/generation.json"));
  hf::HFModelSpec spec = hf::read_hf_config(dir + "/config.json");
  GPTModel model(hf::transformer_config_from_hf(spec), 256, spec.max_position_embeddings, 1);
  hf::load_into_model(model, hf::hf_to_megatron(hf::HFWeights(dir), spec, 256));
  TextGenerator gen(model, nullptr, 1);
  const auto prompts = fx["prompts"].get<std::vector<std::vector<int64_t>>>();
  const auto conts = fx["continuations"].get<std::vector<std::vector<int64_t>>>();
  const auto lps = fx["log_probs"].get<std::vector<std::vector<double>>>();
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int64_t> lengths;
    auto rows = inference::pad_prompts({prompts[i]}, 64, 0, &lengths);
    auto out = gen.generate(rows, lengths, greedy(64));
    std::vector<int64_t> got(out.tokens[0].begin() + prompts[i].size(), out.tokens[0].end());
    ASSERT_EQ(got, conts[i]) << GetParam() << " prompt " << i;
    ASSERT_EQ(out.log_probs[0].size(), lps[i].size());
    double worst = 0;
    for (size_t j = 0; j < lps[i].size(); ++j) worst = std::max(worst, std::abs(out.log_probs[0][j] - lps[i][j]));
    EXPECT_LE(worst, 1e-4) << GetParam() << " prompt " << i;
  }
  std::vector<int64_t> lengths;
  auto rows = inference::pad_prompts(prompts, 64, 0, &lengths);
  auto out = gen.generate(rows, lengths, greedy(64, false));
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int64_t> got(out.tokens[i].begin() + prompts[i].size(), out.tokens[i].begin() + prompts[i].size() + 64);
    EXPECT_EQ(got, conts[i]) << GetParam() << " batched prompt " << i;
  }
}

// The decode step in fixed device buffers (DecodeGraphMode::kDeviceInputs: the step a CUDA graph
// captures, run op by op; the cache position read from memory by kv_cache_write and the
// attention's kv_len) gives the per-op path's tokens, lengths and log-probs bit for bit: the same
// ops on the same rows (the attention over the first offset + 1 cache rows either way). Greedy
// (device argmax), greedy with log-probs (the host-logits path) and seeded top-k / top-p
// sampling; batch 1 and a batch of different prompt lengths; a second call of a shorter length
// (reusing the kept step) and a longer one (replacing it).
TEST_P(Flavours, FixedAddressDecodeStepEqualsPerOpPath) {
  auto model = tiny_model(GetParam());
  TextGenerator eager(*model, nullptr, 11), fixed(*model, nullptr, 11);
  ASSERT_EQ(eager.decode_graph_mode(), inference::DecodeGraphMode::kEager);  // the CPU default
  fixed.set_decode_graph_mode(inference::DecodeGraphMode::kDeviceInputs);
  GenerationParams sampled = greedy(10, true);
  sampled.top_k = 20;
  sampled.top_p = 0.0;
  sampled.temperature = 1.3;
  GenerationParams nucleus = greedy(10, true);
  nucleus.top_k = 0;
  nucleus.top_p = 0.9;
  const std::vector<std::pair<std::vector<int>, GenerationParams>> cases = {
      {{5}, greedy(10, false)},        {{3, 9, 6, 4}, greedy(10, false)}, {{3, 9, 6, 4}, greedy(10, true)},
      {{7}, sampled},                  {{2, 8}, nucleus},                 {{3, 9, 6, 4}, greedy(4, false)},
      {{3, 9, 6, 4}, greedy(30, false)}};
  uint32_t seed = 21;
  for (const auto& [lens, gp] : cases) {
    auto prompts = random_prompts(lens, seed++);
    std::vector<int64_t> lengths;
    auto rows = inference::pad_prompts(prompts, gp.tokens_to_generate, 255, &lengths);
    auto a = eager.generate(rows, lengths, gp);
    auto f = fixed.generate(rows, lengths, gp);
    const std::string what = "batch " + std::to_string(lens.size()) + ", " + std::to_string(gp.tokens_to_generate) +
                             " tokens, top_k " + std::to_string(gp.top_k);
    EXPECT_EQ(a.tokens, f.tokens) << what;
    EXPECT_EQ(a.lengths, f.lengths) << what;
    ASSERT_EQ(a.log_probs.size(), f.log_probs.size()) << what;
    for (size_t i = 0; i < a.log_probs.size(); ++i)
      for (size_t j = 0; j < a.log_probs[i].size(); ++j)
        EXPECT_EQ(a.log_probs[i][j], f.log_probs[i][j]) << what << ": row " << i << " position " << j;
  }
  EXPECT_EQ(fixed.graph_replays(), 0);  // no capture on the CPU
}

// The pipelined greedy loop (TextGenerator::set_decode_pipeline, docs/inference.md "Pipelined
// decode"): with kDeviceInputs on the CPU every fixed-address step is the self-feeding kFed step
// (ops::decode_feed writes the next step's clamped ids and positions + 1 into the input buffer)
// and, once every row is past its prompt, step t + 1 runs before the host reads step t's ids
// (ops::HostReadback). Its tokens and lengths must be the per-op path's, bit for bit (the same ops
// on the same rows; the device feed is the host's clamp_sample), and so must the non-pipelined
// fixed-address loop's: batch 1, batch 4 of equal prompt lengths (pipelined from the first decode
// step), batch 4 of different lengths (per-step uploads until the longest prompt, then
// pipelined), each to the token budget and stopped by a termination token that every row hits
// mid-way (the step launched past the end is discarded); the generators are reused across the
// cases, so each request also checks that the previous one (possibly ended with a discarded
// step) left nothing behind. With vocab_size 128 (< the model's 256 rows) about half the argmaxes
// land above it and are clamped to 127 (on the device by the feed, on the host by clamp_sample).
TEST_P(Flavours, PipelinedGreedyLoopEqualsPerOpPath) {
  auto model = tiny_model(GetParam());
  TextGenerator eager(*model, nullptr, 11), piped(*model, nullptr, 11), stepwise(*model, nullptr, 11);
  ASSERT_TRUE(piped.decode_pipeline());  // the default
  piped.set_decode_graph_mode(inference::DecodeGraphMode::kDeviceInputs);
  stepwise.set_decode_graph_mode(inference::DecodeGraphMode::kDeviceInputs);
  stepwise.set_decode_pipeline(false);
  uint32_t seed = 40;
  int64_t clamped = 0;  // generated 127s of the vocab_size 128 cases
  for (const std::vector<int>& lens : {std::vector<int>{6}, std::vector<int>{7, 7, 7, 7}, std::vector<int>{3, 9, 6, 4}})
    for (int64_t vocab_size : {int64_t{256}, int64_t{128}}) {
      GenerationParams gp = greedy(24, false);
      gp.vocab_size = vocab_size;
      std::vector<int64_t> lengths;
      std::vector<std::vector<int64_t>> rows;
      inference::GenerationOutput budget;
      // A termination id that every row generates (after its prompt), the latest first hit as
      // early as possible: the generation then ends there, before the budget. The prompts are
      // those of the first seed (of 100) that has one.
      int64_t stop_id = -1, stop_at = INT64_MAX;
      for (int tries = 0; tries < 100 && (rows.empty() || stop_at >= static_cast<int64_t>(rows[0].size()) - 2);
           ++tries) {
        stop_at = INT64_MAX;
        rows = inference::pad_prompts(random_prompts(lens, seed++), gp.tokens_to_generate, 255, &lengths);
        budget = eager.generate(rows, lengths, gp);
        for (int64_t t = 0; t < 256; ++t) {
          int64_t last_hit = 0;
          for (size_t i = 0; i < rows.size() && last_hit < INT64_MAX; ++i) {
            int64_t hit = INT64_MAX;
            for (int64_t j = lengths[i]; j < static_cast<int64_t>(budget.tokens[i].size()) && hit == INT64_MAX; ++j)
              if (budget.tokens[i][j] == t) hit = j;
            last_hit = std::max(last_hit, hit);
          }
          if (last_hit < stop_at) stop_at = last_hit, stop_id = t;
        }
      }
      const int64_t max_len = *std::max_element(lengths.begin(), lengths.end());
      ASSERT_LT(stop_at, static_cast<int64_t>(rows[0].size()) - 2) << "no termination id ends this case early";
      for (bool stop : {false, true}) {
        gp.use_eod_token_for_early_termination = stop;
        gp.termination_id = stop ? stop_id : -1;
        const auto a = stop ? eager.generate(rows, lengths, gp) : budget;
        const int64_t ahead_before = piped.pipelined_steps();
        const auto p = piped.generate(rows, lengths, gp);
        const auto w = stepwise.generate(rows, lengths, gp);
        const std::string what = "batch " + std::to_string(lens.size()) + " from length " + std::to_string(lens[0]) +
                                 ", vocab_size " + std::to_string(vocab_size) +
                                 (stop ? ", stop id " + std::to_string(stop_id) : ", to the budget");
        EXPECT_EQ(a.tokens, p.tokens) << what;
        EXPECT_EQ(a.lengths, p.lengths) << what;
        EXPECT_TRUE(p.log_probs.empty()) << what;
        EXPECT_EQ(a.tokens, w.tokens) << what;
        EXPECT_EQ(a.lengths, w.lengths) << what;
        if (stop) EXPECT_EQ(static_cast<int64_t>(a.tokens[0].size()), stop_at + 1) << what;
        if (vocab_size == 128 && !stop)
          for (size_t i = 0; i < rows.size(); ++i)
            clamped += std::count(a.tokens[i].begin() + lengths[i], a.tokens[i].end(), int64_t{127});
        // Steps launched ahead: one in every iteration ctx from the first decode step at or past
        // the longest prompt to the last one, if ctx + 1 is a position (the one launched in the
        // iteration that stops is discarded).
        const int64_t L = static_cast<int64_t>(rows[0].size()), last = static_cast<int64_t>(a.tokens[0].size()) - 1;
        const int64_t c0 = std::max(max_len, *std::min_element(lengths.begin(), lengths.end()) + 1);
        EXPECT_EQ(piped.pipelined_steps() - ahead_before, std::max<int64_t>(0, std::min(last, L - 2) - c0 + 1)) << what;
      }
    }
  EXPECT_GT(clamped, 0);
  EXPECT_EQ(stepwise.pipelined_steps(), 0);
}

// MEGATRON_DECODE_CUDA_GRAPH: 1 turns the pipelined loop off, 2 (and unset) leave it on, any
// other value is refused with a line naming the variable.
TEST(Inference, DecodeGraphEnvironmentSwitch) {
  auto model = tiny_model("llama_tiny");
  struct Restore {  // the caller's value (if any) back at the end
    const char* v = std::getenv("MEGATRON_DECODE_CUDA_GRAPH");
    std::string saved = v ? v : "";
    bool had = v != nullptr;
    ~Restore() {
      if (had) setenv("MEGATRON_DECODE_CUDA_GRAPH", saved.c_str(), 1);
      else unsetenv("MEGATRON_DECODE_CUDA_GRAPH");
    }
  } restore;
  setenv("MEGATRON_DECODE_CUDA_GRAPH", "1", 1);
  EXPECT_FALSE(TextGenerator(*model, nullptr, 1).decode_pipeline());
  setenv("MEGATRON_DECODE_CUDA_GRAPH", "2", 1);
  EXPECT_TRUE(TextGenerator(*model, nullptr, 1).decode_pipeline());
  setenv("MEGATRON_DECODE_CUDA_GRAPH", "3", 1);
  try {
    TextGenerator g(*model, nullptr, 1);
    ADD_FAILURE() << "MEGATRON_DECODE_CUDA_GRAPH=3 accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("MEGATRON_DECODE_CUDA_GRAPH=3: expected 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron
