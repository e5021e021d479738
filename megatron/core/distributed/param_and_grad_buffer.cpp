#include "megatron/core/distributed/param_and_grad_buffer.h"

namespace megatron::distributed {

ParamAndGradBuffer::ParamAndGradBuffer(std::vector<transformer::Parameter>& params, const std::vector<Shape>& shapes,
                                       DType param_dtype, DType grad_dtype, Device device,
                                       bool allocate_grads, const std::vector<bool>& fp8_weights) {
  MEGATRON_CHECK(params.size() == shapes.size()) << params.size() << " params, " << shapes.size() << " shapes";
  MEGATRON_CHECK(fp8_weights.empty() || fp8_weights.size() == params.size())
      << fp8_weights.size() << " FP8 flags for " << params.size() << " params";
  auto is_fp8 = [&](size_t k) { return !fp8_weights.empty() && fp8_weights[k]; };
  ranges_.resize(params.size());
  int64_t offset = 0;
  for (int group = 0; group < 2; ++group) {  // other parameters, then the FP8 weights
    if (group == 1) fp8_start_ = offset;
    for (size_t k = params.size(); k-- > 0;) {  // reverse registration order
      if (is_fp8(k) != (group == 1)) continue;
      const int64_t n = shape_numel(shapes[k]);
      ranges_[k] = {offset, offset + n};
      offset += n;
    }
  }
  param_data_ = Tensor::zeros({offset}, param_dtype, device);
  if (allocate_grads) grad_data_ = Tensor::zeros({offset}, grad_dtype, device);
  if (offset > fp8_start_) fp8_data_ = Tensor::zeros({offset - fp8_start_}, DType::kFloat8E4M3, device);
  for (size_t k = 0; k < params.size(); ++k) {
    params[k].data = param_data_.flat_slice(ranges_[k].first, shapes[k]);
    if (allocate_grads) params[k].main_grad = grad_data_.flat_slice(ranges_[k].first, shapes[k]);
    if (is_fp8(k)) params[k].fp8_data = fp8_data_.flat_slice(ranges_[k].first - fp8_start_, shapes[k]);
  }
}

}  // namespace megatron::distributed
