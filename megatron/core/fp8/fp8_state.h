// FP8 state of one model (one pipeline stage): the delayed-scaling metadata of every FP8 GEMM
// operand, Transformer Engine's per-module fp8_meta gathered in one place
// (docs/megatron-reference.md#fp8-delayed-scaling; TE transformer_engine/pytorch/fp8.py FP8GlobalStateManager).
//
// Every FP8 linear layer owns three roles, in TE's order: input (E4M3), weight (E4M3) and
// grad-output (E5M2 in hybrid, E4M3 in e4m3). For role r the state keeps
//   * on the host: Fp8TensorMeta (amax history, scale, scale_inv; fp8_recipe.h does the math);
//   * on the model's device: amax[r] (the max |x| seen this step, written by the quantize
//     kernels without a host round trip), scale[r] and scale_inv[r] (read by the quantize
//     kernels and by cuBLASLt through device pointers).
// Once per training step reduce_and_update() all-reduces (MAX) the step's amaxes over the amax
// group (TP x DP x CP, Megatron's get_amax_reduction_group), records them into the histories,
// updates every scale. On the CPU the host metas are the state. On a GPU the histories live on the
// device too (a ring per role) and the whole update is one kernel (ops::fp8_update_scales):
// no host synchronization and no copies per step; the host metas are refreshed from the device
// only when read through host_scale()/host_meta()/checkpoint_tensors().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/dist_checkpointing/mapping.h"
#include "megatron/core/fp8/fp8_recipe.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::comm {
class ProcessGroup;
}

namespace megatron::fp8 {

/// Roles of one FP8 linear layer (offsets from its base index).
enum Fp8Role : int { kInput = 0, kWeight = 1, kGradOutput = 2, kNumRoles = 3 };

class Fp8State {
 public:
  /// `device`: where the model's tensors live (the device copies of amax/scale follow it).
  /// Throws UserError for an amax history length < 1 (names --fp8-amax-history-len) or a
  /// margin < 0 (--fp8-margin).
  Fp8State(const Fp8Config& cfg, Device device);

  /// Registers a linear layer named `prefix` (e.g. "decoder.layers.0.self_attention.linear_qkv");
  /// returns its base role index. Must be called before the first forward. `expert`: a routed
  /// expert's linear (MoE), held by the expert-parallel ranks of its expert only, so its checkpoint
  /// copy is marked by the expert replica id (checkpoint_tensors).
  int register_linear(const std::string& prefix, bool expert = false);
  /// The base role index of the linear registered as `prefix`, or -1.
  int find_linear(const std::string& prefix) const;

  const Fp8Config& config() const { return cfg_; }
  int num_roles() const { return static_cast<int>(metas_.size()); }
  /// Role r's FP8 dtype (never changes; no device access).
  DType dtype(int role) const { return metas_.at(role).dtype; }
  /// Role r's meta (history, scale, scale_inv), current: on a GPU, after a step boundary, the first
  /// read copies the state back from the device (a device-to-host copy; free on the CPU). Hot
  /// paths use dtype().
  const Fp8TensorMeta& meta(int role) const {
    sync_host();
    return metas_.at(role);
  }
  const Fp8TensorMeta& host_meta(int role) const { return meta(role); }
  const std::string& linear_name(int base) const { return names_.at(base / kNumRoles); }

  /// Device views of role r's scale / scale_inv / current-step amax (float32 [1]).
  Tensor scale(int r);
  Tensor scale_inv(int r);
  Tensor amax(int r);
  /// Device scratch float of role r for the tensorwise recipe's current amax (zero between uses:
  /// ops::fp8_scale_from_amax resets it after reading, so no memset per quantization).
  Tensor current_amax(int r);

  /// Host copies of the current scale/scale_inv of role r (what the device holds).
  float host_scale(int r) const { return host_meta(r).scale; }
  float host_scale_inv(int r) const { return host_meta(r).scale_inv; }

  /// Whether quantizations record their amax (training forward/backward); evaluation forwards
  /// do not feed the histories.
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }

  /// The step boundary: all-reduce (MAX) the device amaxes over `amax_group` (nullptr = this rank
  /// only), record them, update every scale (delayed recipe; the tensorwise recipe keeps its
  /// per-tensor scales and only records), write the new scales to the device, zero the amaxes.
  void reduce_and_update(comm::ProcessGroup* amax_group);

  /// Checkpoint tensors (host copies, float32), per linear `<prefix>._extra_state.fp8.amax_history`
  /// [H, 3] (TE's layout: one column per role), `.scale` [3], `.scale_inv` [3]. replica_id marks
  /// all but one copy of the (amax-group-replicated) state; `expert_replica_id` (>= 0) replaces it
  /// for the linears registered as `expert` (one writer among the ranks holding that expert).
  std::vector<dist_checkpointing::ShardedTensor> checkpoint_tensors(int replica_id = 0, int expert_replica_id = -1) const;
  /// Restores from tensors produced by checkpoint_tensors() and filled by a load (same keys);
  /// tensors whose key is not listed in `loaded_keys` are skipped (an older checkpoint without
  /// FP8 state keeps the fresh state). Copies the scales to the device.
  void restore_checkpoint_tensors(const std::vector<dist_checkpointing::ShardedTensor>& ts,
                                  const std::vector<std::string>& loaded_keys);

  /// CPU models: sets role r's scale (tensorwise recipe) / adds a host-computed amax observation.
  void set_scale(int r, float scale);
  void record_host_amax(int r, float amax);

  // ---- FP8 weight cache (docs/fp8.md, "Weight cache"; TE's is_first_microbatch) ----------
  /// The cast weights of one FP8 linear, reused by every micro-batch of a training step (forward
  /// and backward) instead of re-quantizing the unchanged weight each time. On CUDA `q` is the
  /// FP8 weight [out, in] (forward GEMM) and `q_t` its transpose [in, out] (dgrad GEMM); on the
  /// CPU `q` is the quantized-dequantized float32 weight (used by both GEMMs), `q_t` unused.
  struct WeightCache {
    Tensor q, q_t;
    Tensor s, s_t;                  // blockwise recipe on CUDA: q's / q_t's 128 x 128 scale_inv blocks
    const void* ptr = nullptr;      // the weight's storage the cast was made from
    int64_t numel = 0;
    uint64_t param_version = 0;     // megatron::param_version() at cast time
    uint64_t epoch = 0;             // scale_epoch() at cast time
    bool recorded = false;          // the cast recorded the weight's amax into this step's amax
    bool valid = false;
    int admission = 0;              // kAuto on a GPU: 0 undecided, 1 admitted, -1 not admitted
    /// --fp8-param-gather: the entry IS the FP8 parameter (q views the gathered FP8 weight on
    /// CUDA; the dequantized gathered weight on the CPU), written by post_all_gather_processing
    /// (fp8_param.h) and valid until the next one -- neither the step boundary, the parameter
    /// version nor MEGATRON_FP8_WEIGHT_CACHE invalidates it. `param_scale_inv` is the scale_inv
    /// its bytes were cast with (TE's Float8Tensor._scale_inv), used by the GEMMs.
    bool primary = false;
    float param_scale_inv = 1.0f;
  };
  /// kOff: never cache. kOn: always cache. kAuto (default): on the CPU always; on a GPU not in
  /// the first training step, then each linear is admitted (once, in first-use order) while its
  /// cast (2 bytes per weight element: FP8 + transpose) fits in a budget of the device memory free
  /// after the first step (the memory pool then holds that step's peak) minus a 4 GiB margin --
  /// so the cache never pushes a run that fitted without it out of memory. The budget is one per
  /// device and process, shared by every Fp8State there (e.g. virtual-pipeline model chunks).
  /// The environment sets it at construction: MEGATRON_FP8_WEIGHT_CACHE=0 -> kOff, =1 -> kOn.
  enum class WeightCacheMode { kOff, kOn, kAuto };
  WeightCacheMode weight_cache_mode() const { return cache_mode_; }
  void set_weight_cache_mode(WeightCacheMode m);
  /// Shorthand: true -> kOn, false -> kOff (drops every cached cast).
  void set_weight_cache_enabled(bool on) { set_weight_cache_mode(on ? WeightCacheMode::kOn : WeightCacheMode::kOff); }
  /// Whether the cache may be used at all (mode != kOff).
  bool weight_cache_enabled() const { return cache_mode_ != WeightCacheMode::kOff; }
  /// Whether the linear at `base` keeps its cast now (see WeightCacheMode). `bytes`: the cast's
  /// size; `free_bytes`: the device's free memory (called at most once per state, when the
  /// budget is set), nullptr for host memory (no budget).
  bool weight_cache_admit(int base, int64_t bytes, int64_t (*free_bytes)());
  /// Bytes this state admitted to the cache (kAuto on a GPU), and the budget left on its device
  /// (-1 = not set yet).
  int64_t weight_cache_admitted_bytes() const { return admitted_bytes_; }
  int64_t weight_cache_budget_left() const;
  /// Forgets every device's budget (tests).
  static void reset_weight_cache_budgets();
  /// Training steps completed (reduce_and_update calls).
  int64_t steps_done() const { return steps_done_; }
  /// The cache entry of the linear at `base` (valid or not).
  WeightCache& weight_cache(int base) { return caches_.at(base / kNumRoles); }
  /// True if the cache is on and the entry of `base` was cast from `w` (same storage and size)
  /// at the current parameter version and scale epoch, and -- when `need_recorded` (a training
  /// forward) -- that cast recorded the weight's amax for this step. A cast made by an evaluation
  /// forward (not recorded) is redone by the next training forward, so each step's weight amax
  /// is recorded exactly once.
  bool weight_cache_hit(int base, const Tensor& w, bool need_recorded) const;
  /// Marks the entry of `base` as a fresh cast of `w` (the caller stores q / q_t) and counts it.
  void weight_cache_mark(int base, const Tensor& w, bool recorded);
  /// Drops every cached cast's validity (keeps the memory for the next cast).
  void invalidate_weight_cache();
  /// Bumped whenever scales may change (reduce_and_update, restore_checkpoint_tensors,
  /// invalidate_weight_cache): a cached cast is only valid within one epoch.
  uint64_t scale_epoch() const { return epoch_; }
  /// The weight's dequantization factor for the GEMMs of the linear at `base` (device float [1]):
  /// the FP8 parameter's own scale_inv when it has a valid primary entry, else the weight
  /// role's current scale_inv.
  Tensor weight_scale_inv(int base);
  /// Records the weight role's current scale_inv as the FP8 parameter's (host and device copy).
  void snapshot_param_scale_inv(int base);
  /// Number of weight casts made so far (every cast of a weight role: cache misses, and every
  /// weight quantization when the cache is off). For tests and logs.
  int64_t weight_casts() const { return weight_casts_; }
  void count_weight_cast() { ++weight_casts_; }

 private:
  void ensure_device();
  void push_scales();
  void sync_host() const;  // GPU: device histories/scales -> metas_ (if changed since)

  Fp8Config cfg_;
  Device device_;
  mutable std::vector<Fp8TensorMeta> metas_;
  // GPU: histories [R, H] (ring, logical entry i at (hist_pos_ + i) % H), fp8 max per role.
  Tensor d_hist_, d_fmax_;
  int64_t hist_pos_ = 0;
  mutable bool host_stale_ = false;
  std::vector<std::string> names_;
  std::vector<bool> expert_;  // per linear: registered as a routed expert's
  Tensor d_amax_, d_scale_, d_scale_inv_, d_cur_;  // float32 [R] on device_
  Tensor d_param_si_;  // float32, one slot per linear: FP8 parameters' scale_inv
  bool recording_ = true;
  std::vector<WeightCache> caches_;  // one per linear
  WeightCacheMode cache_mode_ = WeightCacheMode::kAuto;
  int64_t admitted_bytes_ = 0, steps_done_ = 0;
  uint64_t epoch_ = 0;
  int64_t weight_casts_ = 0;
};

/// Turns amax recording off for its lifetime (restored also when an exception leaves the scope):
/// the replay of an activation-recomputed forward quantizes like the original forward, whose amaxes
/// were already recorded (Transformer Engine's recompute phase). `st` may be nullptr (no FP8).
class ScopedNoAmaxRecording {
 public:
  explicit ScopedNoAmaxRecording(Fp8State* st) : st_(st), was_(st && st->recording()) {
    if (st_) st_->set_recording(false);
  }
  ~ScopedNoAmaxRecording() {
    if (st_) st_->set_recording(was_);
  }
  ScopedNoAmaxRecording(const ScopedNoAmaxRecording&) = delete;
  ScopedNoAmaxRecording& operator=(const ScopedNoAmaxRecording&) = delete;

 private:
  Fp8State* st_;
  bool was_;
};

}  // namespace megatron::fp8
