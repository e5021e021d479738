// DistributedDataParallel: bucketed gradient reduction over the model's contiguous gradient
// buffer (Megatron's megatron/core/distributed/distributed_data_parallel.py and
// param_and_grad_buffer.py; docs/megatron-reference.md#ddp-buffers, #distributed-optimizer).
//
// * Buckets: parameters are taken in buffer order (the reverse of registration order, ≈ the
//   order backward finishes them); a bucket is closed once it holds >= bucket_size elements.
//   Without --overlap-grad-reduce and without an explicit bucket size there is one bucket;
//   with it the default size is max(40,000,000, 1,000,000 x DP) elements.
// * Reduction: grads are pre-scaled by 1/DP (DP = the dp-cp group; none with
//   --calculate-per-token-loss) and SUM-reduced: all-reduce, or with --use-distributed-optimizer
//   a reduce-scatter leaving rank r the reduced slice r of each bucket.
// * Overlap: register_grad_ready(i) marks parameter i's gradient final for this iteration; when
//   every parameter of a bucket is ready the bucket's collective is launched asynchronously.
//   finish_grad_sync() waits for all buckets (launching any that were not launched).
// * Distributed optimizer: each bucket of n elements is cut into DP equal slices of
//   ceil(n/DP) elements (the last padded by a staging copy when n is not divisible; Megatron pads
//   the buffer itself to lcm(DP, 128) instead, which only changes where padding lives);
//   start_param_sync() all-gathers the updated parameter slices.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "megatron/core/distributed/param_and_grad_buffer.h"
#include "megatron/core/comm/process_group.h"
#include "megatron/core/tensor/parameter.h"

namespace megatron::distributed {

/// Megatron's DistributedDataParallelConfig (the fields we implement).
struct DistributedDataParallelConfig {
  bool overlap_grad_reduce = false;        // --overlap-grad-reduce
  bool overlap_param_gather = false;       // --overlap-param-gather (needs the distributed optimizer)
  bool use_distributed_optimizer = false;  // --use-distributed-optimizer
  std::optional<int64_t> bucket_size;      // --ddp-bucket-size (elements)
  bool average_in_collective = false;      // --ddp-average-in-collective: AVG instead of pre-scale + SUM
  bool calculate_per_token_loss = false;   // --calculate-per-token-loss: no 1/DP pre-scale
  /// Tied embeddings split over pipeline stages (PP > 1): with the distributed optimizer the
  /// word embedding ("embedding.word_embeddings.weight") and its last-stage copy (`shared`) get
  /// a bucket of their own, so both stages cut them into the same DP slices and the embedding
  /// all-reduce after the reduce-scatter adds matching reduced slices (Megatron's
  /// _does_param_require_new_bucket for shared_embedding params).
  bool shared_embedding_own_bucket = false;
};

/// One bucket: a contiguous element range of the buffers and the parameters inside it.
struct Bucket {
  int64_t start = 0, end = 0;       // [start, end) in buffer elements
  std::vector<size_t> params;       // registration indices
  /// Distributed optimizer: this rank's slice [shard_start, shard_end) (buffer elements,
  /// clipped to the bucket; may be empty on the last ranks of a small bucket).
  int64_t shard_start = 0, shard_end = 0;
  int64_t slice = 0;                // ceil((end - start) / DP)
  /// --fp8-param-gather: the bucket holds FP8 primary weights only; its parameter all-gather
  /// moves their FP8 bytes (fp8/fp8_param.h) instead of the model-dtype values.
  bool fp8 = false;
};

class DistributedDataParallel {
 public:
  /// `buffers`/`params` are the model's (Parameter::main_grad must view buffers.grad_data() for
  /// the parameters the buffer holds, ParamAndGradBuffer::has; the others are ignored);
  /// `dp_group` is the data-parallel group with context parallelism (dp-cp). Throws UserError
  /// for --overlap-param-gather without --use-distributed-optimizer.
  ///
  /// Expert-parallel buffer (Megatron's expert_parallel_buffers): `dp_group` is the
  /// expert-data-parallel group (expt-dp) and `expert_dp_cp_size` the size of the dp-cp group.
  /// Megatron's expert_gradient_scaling_factor then applies: grads pre-scaled by 1/(DP x CP) and
  /// summed over expt-dp (each expert already holds the gradient of every token of its EP group),
  /// or with --ddp-average-in-collective scaled by expt-DP/(DP x CP) and averaged; 1 with
  /// --calculate-per-token-loss.
  DistributedDataParallel(const DistributedDataParallelConfig& config, ParamAndGradBuffer& buffers,
                          std::vector<Parameter>& params, std::shared_ptr<comm::ProcessGroup> dp_group,
                          std::optional<int> expert_dp_cp_size = std::nullopt);
  ~DistributedDataParallel();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const DistributedDataParallelConfig& config() const { return config_; }
  /// Whether this DDP reduces an expert-parallel buffer (over expt-dp).
  bool expert_parallel() const { return expert_dp_cp_size_.has_value(); }
  /// Whether parameter i (registration index into parameters()) is in this DDP's buffer.
  bool holds(size_t i) const { return buffers_.has(i); }
  comm::ProcessGroup& dp_group() const { return *dp_group_; }
  std::vector<Parameter>& parameters() { return params_; }
  Tensor& grad_buffer() { return buffers_.grad_data(); }
  Tensor& param_buffer() { return buffers_.param_data(); }
  ParamAndGradBuffer& buffers() { return buffers_; }

  /// Zeros the grad buffer and resets the per-iteration bucket state. `zero_data` false: the
  /// bucket state only (the overlapped optimizer step has already queued the zeroing of the
  /// buffer, MegatronOptimizer::take_zeroed_grads).
  void zero_grad_buffer(bool zero_data = true);
  /// Overlap: parameter `param_index`'s gradient is complete; launches its bucket when full
  /// (ignored for a parameter this DDP's buffer does not hold).
  void register_grad_ready(size_t param_index);
  /// Launches every bucket not yet launched (asynchronously).
  void start_grad_sync();
  /// Waits until every bucket is reduced (launching the missing ones first).
  void finish_grad_sync();
  /// Distributed optimizer: all-gathers every bucket's parameter slices (async when
  /// overlap_param_gather; finish_param_sync() waits). FP8 buckets (--fp8-param-gather): this
  /// rank first casts its shard of each FP8 weight (the model-dtype values the optimizer just
  /// wrote) to FP8 (fp8::quantize_param_shard), the FP8 bytes are gathered, and once they arrive
  /// each FP8 weight becomes its linear's weight operand (fp8::post_all_gather_processing).
  void start_param_sync();
  void finish_param_sync();
  /// --fp8-param-gather: makes every FP8 weight's Parameter::data whole and current (before a
  /// checkpoint save or a parameter dump; not needed for training): reallocates the model-dtype
  /// copy if it was released, writes this rank's shard from the fp32 main shard rounded to the
  /// model dtype (exactly what the model-dtype copy held without the flag) and all-gathers it.
  /// release_model_dtype_fp8_params() frees it again.
  void gather_model_dtype_params();
  /// --fp8-param-gather: frees the FP8 weights' model-dtype copy (ParamAndGradBuffer::
  /// release_fp8_model_data); every FP8 bucket's shard must have its fp32 main shard here
  /// (fp8_main_param), since those are then the only full-precision values. No-op without FP8 weights.
  void release_model_dtype_fp8_params();
  /// --fp8-param-gather: the fp32 main param of buffer elements [start, start + n) (this rank's
  /// shard of one FP8 weight), made from the model-dtype values and held here (shared with the
  /// optimizer, which updates it in place: distributed_optimizer_params). start_param_sync casts
  /// it, rounded to the model dtype, to FP8.
  Tensor fp8_main_param(int64_t start, int64_t n);
  /// Bytes received by this rank's parameter all-gathers so far (output buffer sizes, padding
  /// included), all buckets / the FP8 buckets only.
  int64_t param_gather_bytes() const { return param_gather_bytes_; }
  int64_t param_gather_bytes_fp8() const { return param_gather_bytes_fp8_; }

 private:
  void launch(size_t bucket);
  void wait_param(size_t bucket);
  void gather_bucket(size_t bucket, bool fp8_bytes);
  DistributedDataParallelConfig config_;
  ParamAndGradBuffer& buffers_;
  std::vector<Parameter>& params_;
  std::shared_ptr<comm::ProcessGroup> dp_group_;
  std::optional<int> expert_dp_cp_size_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_param_;
  struct BucketState;
  std::vector<std::unique_ptr<BucketState>> state_;
  bool warned_ = false;
  int64_t param_gather_bytes_ = 0, param_gather_bytes_fp8_ = 0;
  std::map<int64_t, Tensor> fp8_main_;  // buffer element -> fp32 main shard (fp8_main_param)
  /// Model-dtype values of FP8 weight elements [lo, hi) from their fp32 main shard, or an
  /// undefined tensor when none is held for `lo`.
  Tensor fp8_model_dtype_shard(int64_t lo, int64_t hi);
};

}  // namespace megatron::distributed
