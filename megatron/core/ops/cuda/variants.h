// Internal: forces the comparison kernel variants of the CUDA ops, for the dev/cuda drivers only.
//
// Several CUDA ops keep an older kernel next to the one they choose by default, either as the
// fallback for shapes the newer kernel does not take (norm, cross-entropy statistics, embedding
// backward, flash attention) or as the baseline a speed-up was measured against (per-tensor Adam
// and reduction launches, the fused cross entropy without its shared-memory row stash). The op
// functions choose between them automatically; nothing in the shipped programs sets these
// fields, so with the defaults below every op takes its automatic choice. The drivers in
// dev/cuda/ (dev/cuda/README.md) set a field, call the op, and compare the two variants against
// the CPU reference and in time. Not thread-safe: set it before launching, from one thread.
//
// Not an interface: the fields move with the kernels. docs/cuda.md, "Kernel variants".
#pragma once

namespace megatron::ops::cuda::variants {

/// Which comparison variant the CUDA ops take instead of their automatic choice. Each field's
/// default is the automatic choice.
struct Forced {
  bool norm_fwd_v1 = false;      ///< norm.cu: norm_fwd_kernel at every shape (not the register kernel)
  bool norm_bwd_v1 = false;      ///< norm.cu: the shared-memory-atomics backward at every shape
  bool norm_fwd_no_pipe = false;  ///< norm.cu: the register forward without the cp.async row pipeline
  bool norm_bwd_no_pipe = false;  ///< norm.cu: the register backward without the cp.async row pipeline
  bool norm_fwd_row_many = false;  ///< norm.cu: the block-per-row forward also for many rows (1024 < h <= 8192; timing only)
  bool norm_bwd_no_row = false;  ///< norm.cu: 1024 < h <= 8192 bf16 rows take norm_bwd_kernel, not the row-block kernel
  bool ce_stats_v1 = false;      ///< embedding_ce.cu: one load per iteration in cross_entropy_stats
  bool embed_bwd_v1 = false;     ///< embedding_ce.cu: embedding backward with scalar atomics only
  bool ce_fused_no_stash = false;  ///< embedding_ce.cu: fused cross entropy re-reads the row from L2
  bool ce_fused_no_bulk = false;  ///< embedding_ce.cu: fused cross entropy loads the row by threads, not one bulk copy
  bool flash_v1 = false;         ///< attention.cu: the first (simple) flash kernels at every shape
  int flash_small = -1;          ///< attention.cu: -1 by head dim, 1 / 0 force the 4- / 8-warp kernels
  bool flash_dq_two_pass = false;  ///< attention.cu: the flash backward's dQ from its second kernel (no atomics), as in deterministic mode
  bool reduce_per_tensor = false;  ///< elementwise.cu: one stage-1 launch per tensor in the *_many reductions
  bool adam_per_tensor = false;  ///< adam_multi.cu: one Adam launch per tensor (not the multi-tensor kernel)
  /// adam_multi.cu: which multi-tensor Adam kernel, -1 = automatic (MEGATRON_ADAM_KERNEL, else
  /// the default), else an index into adam_kernel_name() (0 = v1, the kernel before Session 11).
  int adam_kernel = -1;
  bool rope_no_table = false;  ///< rope.cu: the vector RoPE kernel computes each channel's angle (no per-call cos/sin table)
  bool reduce_stage1_v1 = false;  ///< elementwise.cu: reduction stage 1 with one load in flight (MEGATRON_REDUCE_V1)
};

/// The process-wide settings (defined in variants.cpp; all defaults in shipped programs).
Forced& forced();

/// The multi-tensor Adam kernels that Forced::adam_kernel and MEGATRON_ADAM_KERNEL select, by
/// index (adam_multi.cu): "v1", "u2", "u4", "u2plain", "u2chunk", "u4chunk"; nullptr past the end.
const char* adam_kernel_name(int index);

}  // namespace megatron::ops::cuda::variants
