// The micro-batch handed from the data loader to the model (Megatron's get_batch output).
#pragma once

#include "megatron/core/tensor/tensor.h"

namespace megatron::datasets {

/// One micro-batch, batch-first as Megatron's data loader yields it (the model transposes to
/// sequence-first [s, b] internally).
///  tokens        int64   [b, s]
///  labels        int64   [b, s]
///  loss_mask     float32 [b, s]
///  position_ids  int64   [b, s]
///  attention_mask uint8  [b, 1, s, s], 1 = masked out (Megatron's bool mask, True = masked);
///                undefined when --no-create-attention-mask-in-dataloader or when the plain
///                causal mask applies (no --reset-attention-mask).
struct GPTBatch {
  Tensor tokens;
  Tensor labels;
  Tensor loss_mask;
  Tensor position_ids;
  Tensor attention_mask;
};

}  // namespace megatron::datasets
