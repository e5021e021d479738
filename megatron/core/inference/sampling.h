// Token sampling of text generation (Megatron's megatron/inference/text_generation/sampling.py
// `sample`): greedy when top_k == 1, otherwise temperature, then top-k or top-p filtering, then a
// draw from the softmax of what is left.
//
// The random number generator (documented in docs/inference.md): std::mt19937_64 (its sequence is
// fixed by the C++ standard, so every platform and compiler draws the same numbers) seeded with
// the request's random_seed (else --seed at start-up and the state left by earlier requests, as
// Megatron's torch.random.manual_seed / global generator). One 64-bit draw per sequence of the
// batch per generated position, in batch order, whatever the sampling mode; the draw u in [0, 1)
// (53 high bits) picks the first token whose cumulative probability (vocabulary order, double)
// exceeds u. The draws are therefore reproducible across runs and tensor-parallel sizes (only TP
// rank 0 samples, from the gathered logits), but they are not torch.multinomial's draws.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace megatron::inference {

/// The generation RNG (see the file comment).
class SamplingRng {
 public:
  explicit SamplingRng(uint64_t seed = 1234) : gen_(seed) {}
  void manual_seed(uint64_t seed) { gen_.seed(seed); }
  /// Uniform double in [0, 1) from the top 53 bits of one 64-bit draw.
  double uniform() { return static_cast<double>(gen_() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  std::mt19937_64 gen_;
};

/// Megatron's sample(logits, top_k, top_p, temperature, vocab_size) for one row of `vocab`
/// float32 logits (the full, gathered padded vocabulary): top_k == 1 -> argmax (first maximum;
/// temperature ignored); otherwise (logits - max) / temperature (stable for any tiny positive
/// temperature, which then acts as greedy), then top_k > 1 keeps the logits >= the
/// k-th largest (ties included) or top_p > 0 keeps the smallest prefix of the descending order
/// whose probability mass reaches top_p (Megatron's shifted filter: the token that crosses top_p
/// is kept, the first always), then one draw from the softmax of the kept logits (`rng`, see the
/// file comment; top_k == 1 draws nothing but the caller still advances the RNG per row, see
/// TextGenerator). The result is clamped to [0, vocab_size - 1] (padding rows are never
/// returned), as Megatron. Throws UserError for top_k > 1 together with top_p > 0, top_k >= vocab,
/// top_p > 1 or temperature <= 0.
int64_t sample_row(const float* logits, int64_t vocab, int64_t top_k, double top_p, double temperature,
                   int64_t vocab_size, double u);

/// sample_row's clamp of a sampled index into [0, min(vocab_size, vocab) - 1] (vocab_size <= 0:
/// the whole padded vocabulary of `vocab` rows).
int64_t clamp_sample(int64_t token, int64_t vocab, int64_t vocab_size);

/// log_softmax(logits)[index] in double precision (log-probability of one token from one row).
double log_prob_of(const float* logits, int64_t vocab, int64_t index);

}  // namespace megatron::inference
