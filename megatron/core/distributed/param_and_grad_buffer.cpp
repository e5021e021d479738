#include "megatron/core/distributed/param_and_grad_buffer.h"

namespace megatron::distributed {

ParamAndGradBuffer::ParamAndGradBuffer(std::vector<Parameter>& params, const std::vector<Shape>& shapes,
                                       DType param_dtype, DType grad_dtype, Device device,
                                       bool allocate_grads, const std::vector<bool>& fp8_weights,
                                       const std::vector<bool>& include) {
  MEGATRON_CHECK(params.size() == shapes.size()) << params.size() << " params, " << shapes.size() << " shapes";
  MEGATRON_CHECK(fp8_weights.empty() || fp8_weights.size() == params.size())
      << fp8_weights.size() << " FP8 flags for " << params.size() << " params";
  MEGATRON_CHECK(include.empty() || include.size() == params.size())
      << include.size() << " include flags for " << params.size() << " params";
  auto is_fp8 = [&](size_t k) { return !fp8_weights.empty() && fp8_weights[k]; };
  auto held = [&](size_t k) { return include.empty() || include[k]; };
  ranges_.assign(params.size(), {-1, -1});
  int64_t offset = 0;
  for (int group = 0; group < 2; ++group) {  // other parameters, then the FP8 weights
    if (group == 1) fp8_start_ = offset;
    for (size_t k = params.size(); k-- > 0;) {  // reverse registration order
      if (!held(k) || is_fp8(k) != (group == 1)) continue;
      const int64_t n = shape_numel(shapes[k]);
      ranges_[k] = {offset, offset + n};
      offset += n;
    }
  }
  numel_ = offset;
  param_data_ = Tensor::zeros({fp8_start_}, param_dtype, device);
  if (allocate_grads) grad_data_ = Tensor::zeros({offset}, grad_dtype, device);
  if (offset > fp8_start_) {
    fp8_data_ = Tensor::zeros({offset - fp8_start_}, DType::kFloat8E4M3, device);
    fp8_model_data_ = Tensor::zeros({offset - fp8_start_}, param_dtype, device);
  }
  for (size_t k = 0; k < params.size(); ++k) {
    if (!held(k)) continue;
    params[k].data = is_fp8(k) ? fp8_model_data_.flat_slice(ranges_[k].first - fp8_start_, shapes[k])
                               : param_data_.flat_slice(ranges_[k].first, shapes[k]);
    if (allocate_grads) params[k].main_grad = grad_data_.flat_slice(ranges_[k].first, shapes[k]);
    if (is_fp8(k)) params[k].fp8_data = fp8_data_.flat_slice(ranges_[k].first - fp8_start_, shapes[k]);
  }
}

Tensor ParamAndGradBuffer::model_data(int64_t start, int64_t n) {
  MEGATRON_CHECK(start >= 0 && n >= 0 && start + n <= numel_ && (start + n <= fp8_start_ || start >= fp8_start_))
      << "model_data [" << start << ", " << start + n << ") of " << numel_ << " (FP8 weights from " << fp8_start_ << ")";
  return start >= fp8_start_ && n > 0 ? fp8_model_data_.flat_slice(start - fp8_start_, {n}) : param_data_.flat_slice(start, {n});
}

void ParamAndGradBuffer::release_fp8_model_data() {
  if (fp8_model_data_.defined()) fp8_model_data_.resize_storage_(0);
}

bool ParamAndGradBuffer::materialize_fp8_model_data() {
  if (!fp8_model_data_.defined() || fp8_model_data_.storage_bytes() != 0) return false;
  fp8_model_data_.resize_storage_(fp8_model_data_.nbytes());
  return true;
}

bool ParamAndGradBuffer::fp8_model_data_held() const {
  return fp8_model_data_.defined() && fp8_model_data_.storage_bytes() != 0;
}

int64_t ParamAndGradBuffer::param_bytes_held() const {
  return static_cast<int64_t>(param_data_.storage_bytes() + fp8_data_.storage_bytes() + fp8_model_data_.storage_bytes());
}

}  // namespace megatron::distributed
