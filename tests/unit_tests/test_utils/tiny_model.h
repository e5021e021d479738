// The tiny GPT and LLaMA models of the unit tests, defined once: TransformerConfigs for tests that
// build GPTModel directly and the pretrain_gpt flag list for tests that go through Arguments.
// Each test states what it changes on top (TP size, dtypes, FP8, recompute, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/transformer/transformer_config.h"

namespace megatron::testing {

/// Dropout of a tiny config: kOff (0, for deterministic comparisons against references and
/// between layouts) or kDefault (TransformerConfig's default 0.1, for tests that exercise it).
enum class TinyDropout { kOff, kDefault };

/// A tiny GPT (Megatron's GPT flavour: learned absolute positions, LayerNorm, GeLU MLP with
/// ffn = 4 h, linear biases, tied embedding and output weights): `num_layers` layers of hidden
/// size `hidden` with `heads` attention heads, fp32. Sizes are in elements; nothing is validated
/// here (GPTModel's constructor calls finalize()).
inline transformer::TransformerConfig tiny_gpt_config(int64_t hidden = 32, TinyDropout dropout = TinyDropout::kOff,
                                                      int64_t num_layers = 2, int64_t heads = 4) {
  transformer::TransformerConfig c;
  c.num_layers = num_layers;
  c.hidden_size = hidden;
  c.num_attention_heads = heads;
  if (dropout == TinyDropout::kOff) c.hidden_dropout = c.attention_dropout = 0.0f;
  return c;
}

/// Turns `c` into Megatron's LLaMA flavour (examples/llama): grouped-query attention with
/// `query_groups` K/V heads, SwiGLU MLP of `ffn_hidden` (per half), RMSNorm, no linear biases,
/// rotary positions, untied output layer.
inline void make_llama(transformer::TransformerConfig& c, int64_t query_groups, int64_t ffn_hidden) {
  c.num_query_groups = query_groups;
  c.ffn_hidden_size = ffn_hidden;
  c.normalization = transformer::Normalization::kRMSNorm;
  c.gated_linear_unit = true;
  c.add_bias_linear = false;
  c.position_embedding_type = transformer::PositionEmbeddingType::kRope;
  c.share_embeddings_and_output_weights = false;
}

/// tiny_gpt_config(hidden, dropout) (2 layers, 4 heads) made LLaMA by make_llama(query_groups,
/// ffn_hidden).
inline transformer::TransformerConfig tiny_llama_config(int64_t hidden = 32, int64_t query_groups = 2,
                                                        int64_t ffn_hidden = 64,
                                                        TinyDropout dropout = TinyDropout::kOff) {
  transformer::TransformerConfig c = tiny_gpt_config(hidden, dropout);
  make_llama(c, query_groups, ffn_hidden);
  return c;
}

/// The smallest valid pretrain_gpt command line: a 2-layer GPT (hidden 64, 4 heads, seq 32, mbs 2,
/// gbs 8, vocab 128), 10 iterations on mock data, learning rate `lr`.
inline std::vector<std::string> tiny_gpt_flags(const char* lr) {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
          "--train-iters", "10", "--lr", lr, "--mock-data", "--tokenizer-type", "NullTokenizer",
          "--vocab-size", "128"};
}

}  // namespace megatron::testing
