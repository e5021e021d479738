// FP8 primary weights for --fp8-param-gather (docs/fp8.md, "FP8 parameters"): Megatron's
// quantize_param_shard / post_all_gather_processing (megatron/core/fp8_utils.py) over Transformer
// Engine's delayed-scaling cast_master_weights_to_fp8 (transformer_engine/pytorch/tensor/utils.py).
//
// Per training step, after the optimizer step, every data-parallel rank
//   1. casts its updated main-param shard of each FP8 weight to FP8 with the weight role's current
//      scale (quantize_param_shard). As TE does "to keep numerical consistency", the fp32 main
//      param is first rounded to the model dtype (bf16) -- the optimizer has just written exactly
//      that into the model's parameter shard, which is what is cast -- so the FP8 bytes equal what
//      the forward would have cast from the bf16 weight without the flag. The shard's amax is
//      recorded into the weight role's amax of the coming step (TE writes it into amax_history[0]);
//      the step's amax reduction (MAX over TP x DP x CP) makes it the whole weight's amax, and the
//      scales are updated (and the history rolled) at the end of that step as for every role;
//   2. all-gathers the FP8 bytes (the DDP's FP8 buckets);
//   3. post_all_gather_processing: the gathered FP8 weight becomes the linear's weight operand for
//      every GEMM until the next gather (no per-step weight quantization), with its own scale_inv
//      (the scale it was cast with). On CUDA the transposed copy for the dgrad GEMM is made here
//      (TE: _create_transpose on Hopper); on the CPU the emulation keeps the dequantized weight.
#pragma once

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::fp8 {

/// Casts `shard` (model dtype, any shape; this rank's elements of the weight of the linear at
/// `base`) to FP8 into `out` (float8_e4m3, same numel, same device) with the weight role's current
/// scale: out = sat_rne_cast(shard * scale), bit-identical on CPU and CUDA. Records max|shard| into
/// the weight role's step amax (CPU: host, CUDA: device atomic).
void quantize_param_shard(Fp8State& st, int base, const Tensor& shard, Tensor& out);

/// Makes the gathered FP8 weight `w` (float8_e4m3 [out, in]) the weight operand of the linear at
/// `base` (its primary weight-cache entry) with scale_inv = the weight role's current scale_inv.
void post_all_gather_processing(Fp8State& st, int base, const Tensor& w);

/// CPU reference of the dgrad layout (tests): q_t[j, i] = q[i, j] for a 2-D FP8 tensor.
Tensor fp8_transpose_cpu(const Tensor& q);

}  // namespace megatron::fp8
