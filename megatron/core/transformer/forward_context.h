// What every transformer module's forward needs besides its input: train/eval mode, the
// attention mask, and the dropout random streams (seed + a per-call offset counter, so a
// recomputed forward can replay the same masks by restoring the counter).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::transformer {

class InferenceContext;

struct ForwardContext {
  bool training = true;
  /// uint8 [b, 1, s, s], 1 = masked out; undefined = causal mask.
  Tensor attention_mask;
  /// Seed of dropout outside TP regions (hidden/embedding dropout; same on all TP ranks).
  uint64_t seed = 0;
  /// Seed of dropout inside TP regions (attention dropout; seed + 2718 + tp_rank).
  uint64_t tp_seed = 0;
  /// Next dropout stream offset; each dropout call takes one.
  uint64_t rng_offset = 0;
  uint64_t next_offset() { return rng_offset++; }
  /// PyTorch's torch.is_grad_enabled(): false in the first forward of a fully recomputed layer
  /// chunk (Megatron's CheckpointFunction runs it under torch.no_grad()), true in its replay in
  /// backward. The MoE router then skips the aux losses, the z-loss, their metric records and
  /// the expert-bias token counts, which the replay does once (Megatron's router.py gates them on
  /// self.training and torch.is_grad_enabled()). Dropout and jitter draws are unaffected.
  bool grad_enabled = true;
  /// Context parallelism (context_parallel.h): the CP group (null or size 1 = none; the
  /// sequence of this forward is then this rank's two chunks) and --cp-comm-type.
  std::shared_ptr<comm::ProcessGroup> cp_group;
  std::string cp_comm_type = "p2p";
  /// RoPE positions int64 [s, b]; undefined = 0..s-1. With CP: the global positions of this
  /// rank's chunks (cp_rank_global_positions).
  Tensor rotary_position_ids;
  /// Incremental decoding (inference_context.h; Megatron's inference_context argument): every
  /// self-attention appends its keys/values to this cache and attends to all cached tokens.
  /// nullptr = a plain forward.
  InferenceContext* inference_context = nullptr;
};

}  // namespace megatron::transformer
