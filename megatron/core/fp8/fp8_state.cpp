#include "megatron/core/fp8/fp8_state.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/param_version.h"
#include "megatron/core/ops/ops.h"

namespace megatron::fp8 {

Fp8State::Fp8State(const Fp8Config& cfg, Device device) : cfg_(cfg), device_(device) {
  if (cfg_.amax_history_len < 1)
    user_error("--fp8-amax-history-len must be >= 1 (got ", cfg_.amax_history_len, ")");
  if (cfg_.margin < 0) user_error("--fp8-margin must be >= 0 (got ", cfg_.margin, ")");
  if (const char* e = std::getenv("MEGATRON_FP8_WEIGHT_CACHE")) {
    if (!std::strcmp(e, "0")) cache_mode_ = WeightCacheMode::kOff;
    else if (!std::strcmp(e, "1")) cache_mode_ = WeightCacheMode::kOn;
    else if (*e)
      user_error("MEGATRON_FP8_WEIGHT_CACHE=", e, ": expected 0 (off) or 1 (cache every FP8 weight); unset it for "
                 "the automatic, memory-sized cache");
  }
}

void Fp8State::set_weight_cache_mode(WeightCacheMode m) {
  cache_mode_ = m;
  if (m == WeightCacheMode::kOff)
    for (auto& c : caches_)
      if (!c.primary) c = WeightCache{};  // FP8 parameters are not a cache
}

int Fp8State::find_linear(const std::string& prefix) const {
  for (size_t l = 0; l < names_.size(); ++l)
    if (names_[l] == prefix) return static_cast<int>(l) * kNumRoles;
  return -1;
}

namespace {
// Weight-cache budgets (bytes left) per device, shared by every Fp8State of the process.
std::mutex g_budget_mu;
std::map<int, int64_t> g_budget;
int budget_key(Device d) { return d.is_cpu() ? -1 : d.index; }
}  // namespace

void Fp8State::reset_weight_cache_budgets() {
  std::lock_guard<std::mutex> g(g_budget_mu);
  g_budget.clear();
}

int64_t Fp8State::weight_cache_budget_left() const {
  std::lock_guard<std::mutex> g(g_budget_mu);
  auto it = g_budget.find(budget_key(device_));
  return it == g_budget.end() ? -1 : it->second;
}

bool Fp8State::weight_cache_admit(int base, int64_t bytes, int64_t (*free_bytes)()) {
  if (cache_mode_ == WeightCacheMode::kOff) return false;
  if (cache_mode_ == WeightCacheMode::kOn || !free_bytes) return true;
  WeightCache& c = caches_.at(base / kNumRoles);
  if (c.admission != 0) return c.admission > 0;
  if (steps_done_ == 0) return false;  // the first step runs without the cache: its peak is measured
  constexpr int64_t kMargin = int64_t(4) << 30;
  std::lock_guard<std::mutex> g(g_budget_mu);
  auto it = g_budget.find(budget_key(device_));
  if (it == g_budget.end()) it = g_budget.emplace(budget_key(device_), std::max<int64_t>(0, free_bytes() - kMargin)).first;
  c.admission = bytes <= it->second ? 1 : -1;
  if (c.admission > 0) {
    it->second -= bytes;
    admitted_bytes_ += bytes;
  }
  return c.admission > 0;
}

bool Fp8State::weight_cache_hit(int base, const Tensor& w, bool need_recorded) const {
  const WeightCache& c = caches_.at(base / kNumRoles);
  if (c.primary) return c.valid;
  if (cache_mode_ == WeightCacheMode::kOff) return false;
  return c.valid && c.ptr == w.data_ptr() && c.numel == w.numel() && c.param_version == param_version() &&
         c.epoch == epoch_ && (c.recorded || !need_recorded);
}

void Fp8State::weight_cache_mark(int base, const Tensor& w, bool recorded) {
  WeightCache& c = caches_.at(base / kNumRoles);
  c.ptr = w.data_ptr();
  c.numel = w.numel();
  c.param_version = param_version();
  c.epoch = epoch_;
  c.recorded = recorded;
  c.valid = cache_mode_ != WeightCacheMode::kOff;
}

void Fp8State::invalidate_weight_cache() {
  ++epoch_;
  for (auto& c : caches_)
    if (!c.primary) c.valid = false;
}

int Fp8State::register_linear(const std::string& prefix, bool expert) {
  MEGATRON_CHECK(!d_amax_.defined()) << "Fp8State::register_linear(" << prefix << ") after the first use";
  const int base = static_cast<int>(metas_.size());
  names_.push_back(prefix);
  expert_.push_back(expert);
  metas_.emplace_back(cfg_.amax_history_len, fp8_dtype_for(cfg_.format, false));  // input
  metas_.emplace_back(cfg_.amax_history_len, fp8_dtype_for(cfg_.format, false));  // weight
  metas_.emplace_back(cfg_.amax_history_len, fp8_dtype_for(cfg_.format, true));   // grad-output
  caches_.emplace_back();
  return base;
}

namespace {
// Each role's amax/scale/scale_inv sits in its own 256-byte slot: cuBLASLt reads the scale
// pointers with aligned loads (a 4-byte-aligned scale pointer gives CUBLAS_STATUS_NOT_SUPPORTED
// on the H200).
constexpr int64_t kSlot = 64;
}  // namespace

void Fp8State::ensure_device() {
  if (d_amax_.defined()) return;
  const int64_t n = std::max<int64_t>(1, num_roles()) * kSlot;
  d_amax_ = Tensor::zeros({n}, DType::kFloat32, device_);
  d_scale_ = Tensor::zeros({n}, DType::kFloat32, device_);
  d_scale_inv_ = Tensor::zeros({n}, DType::kFloat32, device_);
  d_cur_ = Tensor::zeros({n}, DType::kFloat32, device_);
  d_param_si_ = Tensor::zeros({std::max<int64_t>(1, static_cast<int64_t>(names_.size())) * kSlot}, DType::kFloat32, device_);
  push_scales();
}

void Fp8State::push_scales() {
  std::vector<float> s(d_scale_.numel(), 1.0f), si(d_scale_.numel(), 1.0f);
  for (size_t r = 0; r < metas_.size(); ++r) {
    s[r * kSlot] = metas_[r].scale;
    si[r * kSlot] = metas_[r].scale_inv;
  }
  d_scale_.copy_(Tensor::from_vector(s, {d_scale_.numel()}));
  d_scale_inv_.copy_(Tensor::from_vector(si, {d_scale_inv_.numel()}));
  if (!device_.is_cpu() && !metas_.empty()) {
    // The histories in logical order (ring position 0) and each role's FP8 max.
    const int64_t H = cfg_.amax_history_len, R = num_roles();
    std::vector<float> h(static_cast<size_t>(R * H)), fm(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t i = 0; i < H; ++i) h[r * H + i] = metas_[r].amax_history[i];
      fm[r] = fp8_max(metas_[r].dtype);
    }
    if (!d_hist_.defined()) {
      d_hist_ = Tensor::empty({R * H}, DType::kFloat32, device_);
      d_fmax_ = Tensor::empty({R}, DType::kFloat32, device_);
    }
    d_hist_.copy_(Tensor::from_vector(h, {R * H}));
    d_fmax_.copy_(Tensor::from_vector(fm, {R}));
    hist_pos_ = 0;
  }
  host_stale_ = false;
}

void Fp8State::sync_host() const {
  if (!host_stale_) return;
  const int64_t H = cfg_.amax_history_len, R = num_roles();
  const std::vector<float> h = d_hist_.to_float_vector(), s = d_scale_.to_float_vector(),
                           si = d_scale_inv_.to_float_vector();
  for (int64_t r = 0; r < R; ++r) {
    Fp8TensorMeta& m = metas_[r];
    for (int64_t i = 0; i < H; ++i) m.amax_history[i] = h[r * H + (hist_pos_ + i) % H];
    m.scale = s[r * kSlot];
    m.scale_inv = si[r * kSlot];
  }
  host_stale_ = false;
}

Tensor Fp8State::scale(int r) {
  ensure_device();
  return d_scale_.flat_slice(r * kSlot, {1});
}
Tensor Fp8State::scale_inv(int r) {
  ensure_device();
  return d_scale_inv_.flat_slice(r * kSlot, {1});
}
Tensor Fp8State::amax(int r) {
  ensure_device();
  return d_amax_.flat_slice(r * kSlot, {1});
}
Tensor Fp8State::current_amax(int r) {
  ensure_device();
  return d_cur_.flat_slice(r * kSlot, {1});
}

Tensor Fp8State::weight_scale_inv(int base) {
  const WeightCache& c = caches_.at(base / kNumRoles);
  if (!(c.primary && c.valid)) return scale_inv(base + kWeight);
  ensure_device();
  return d_param_si_.flat_slice((base / kNumRoles) * kSlot, {1});
}

void Fp8State::snapshot_param_scale_inv(int base) {
  ensure_device();
  // The host value is the CPU path's (dequantize_cpu); on a GPU the device copy below is what the GEMMs read.
  caches_.at(base / kNumRoles).param_scale_inv = metas_.at(base + kWeight).scale_inv;
  d_param_si_.flat_slice((base / kNumRoles) * kSlot, {1}).copy_(scale_inv(base + kWeight));
}

void Fp8State::set_scale(int r, float s) {
  ensure_device();
  MEGATRON_CHECK(device_.is_cpu()) << "Fp8State::set_scale is the CPU path";
  metas_.at(r).scale = s;
  metas_.at(r).scale_inv = 1.0f / s;
  d_scale_.data<float>()[r * kSlot] = s;
  d_scale_inv_.data<float>()[r * kSlot] = 1.0f / s;
}

void Fp8State::record_host_amax(int r, float a) {
  ensure_device();
  MEGATRON_CHECK(device_.is_cpu()) << "Fp8State::record_host_amax is the CPU path";
  float& slot = d_amax_.data<float>()[r * kSlot];
  if (std::isnan(a) || a > slot) slot = a;
}

void Fp8State::reduce_and_update(comm::ProcessGroup* group) {
  if (metas_.empty()) return;
  ensure_device();
  if (group && group->size() > 1) group->all_reduce(d_amax_, comm::ReduceOp::kMax)->wait();
  if (!device_.is_cpu()) {
    // Record + update + roll of every role in one kernel on the device; the host copies go stale.
    // (The CPU keeps its metas on the host and updates them below, Fp8TensorMeta::update.)
    const int H = cfg_.amax_history_len;
    ops::fp8_update_scales(d_amax_, kSlot, static_cast<float*>(d_hist_.data_ptr()), H, hist_pos_, num_roles(),
                           static_cast<const float*>(d_fmax_.data_ptr()), cfg_.margin,
                           cfg_.amax_compute_algo == AmaxComputeAlgo::kMax, cfg_.recipe == Fp8Recipe::kDelayed,
                           static_cast<float*>(d_scale_.data_ptr()), static_cast<float*>(d_scale_inv_.data_ptr()));
    hist_pos_ = (hist_pos_ + 1) % H;
    host_stale_ = true;
    ++steps_done_;
    invalidate_weight_cache();
    return;
  }
  std::vector<float> amax = d_amax_.to_float_vector();  // one device-to-host copy per step
  for (size_t r = 0; r < metas_.size(); ++r) {
    Fp8TensorMeta& m = metas_[r];
    m.record_amax(amax[r * kSlot]);
    if (cfg_.recipe == Fp8Recipe::kDelayed) {
      m.update(cfg_);
    } else {
      // Tensorwise: the scales came from each tensor itself; keep the history rolling for the
      // checkpoint and logs only.
      std::rotate(m.amax_history.begin(), m.amax_history.begin() + 1, m.amax_history.end());
      m.amax_history[0] = 0.0f;
    }
  }
  d_amax_.zero_();
  if (cfg_.recipe == Fp8Recipe::kDelayed) push_scales();
  ++steps_done_;
  // A new step: the next training forward casts the weights again (with the new scales, and
  // recording the new step's weight amax), as TE does on is_first_microbatch.
  invalidate_weight_cache();
}

std::vector<dist_checkpointing::ShardedTensor> Fp8State::checkpoint_tensors(int replica_id, int expert_replica_id) const {
  using dist_checkpointing::ShardedTensor;
  sync_host();
  std::vector<ShardedTensor> out;
  const int64_t H = cfg_.amax_history_len;
  for (size_t l = 0; l < names_.size(); ++l) {
    std::vector<float> hist(static_cast<size_t>(H) * kNumRoles), sc(kNumRoles), si(kNumRoles);
    for (int j = 0; j < kNumRoles; ++j) {
      const Fp8TensorMeta& m = metas_[l * kNumRoles + j];
      for (int64_t h = 0; h < H; ++h) hist[h * kNumRoles + j] = m.amax_history[h];
      sc[j] = m.scale;
      si[j] = m.scale_inv;
    }
    const std::string k = names_[l] + "._extra_state.fp8.";
    const int rep = expert_[l] && expert_replica_id >= 0 ? expert_replica_id : replica_id;
    out.push_back(ShardedTensor::from_tensor(k + "amax_history", Tensor::from_vector(hist, {H, kNumRoles}), rep));
    out.push_back(ShardedTensor::from_tensor(k + "scale", Tensor::from_vector(sc, {kNumRoles}), rep));
    out.push_back(ShardedTensor::from_tensor(k + "scale_inv", Tensor::from_vector(si, {kNumRoles}), rep));
  }
  return out;
}

void Fp8State::restore_checkpoint_tensors(const std::vector<dist_checkpointing::ShardedTensor>& ts,
                                          const std::vector<std::string>& loaded_keys) {
  sync_host();  // roles not in the checkpoint keep their current state
  const int64_t H = cfg_.amax_history_len;
  for (size_t l = 0; l < names_.size(); ++l) {
    const std::string k = names_[l] + "._extra_state.fp8.";
    for (const auto& t : ts) {
      if (std::find(loaded_keys.begin(), loaded_keys.end(), t.key) == loaded_keys.end()) continue;
      if (t.key.rfind(k, 0) != 0) continue;
      const std::string what = t.key.substr(k.size());
      std::vector<float> v = t.data.to_float_vector();
      for (int j = 0; j < kNumRoles; ++j) {
        Fp8TensorMeta& m = metas_[l * kNumRoles + j];
        if (what == "amax_history") {
          MEGATRON_CHECK(static_cast<int64_t>(v.size()) == H * kNumRoles) << t.key;
          for (int64_t h = 0; h < H; ++h) m.amax_history[h] = v[h * kNumRoles + j];
        } else if (what == "scale") {
          m.scale = v.at(j);
        } else if (what == "scale_inv") {
          m.scale_inv = v.at(j);
        }
      }
    }
  }
  if (d_amax_.defined()) push_scales();
  invalidate_weight_cache();
}

}  // namespace megatron::fp8
