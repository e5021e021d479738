#include "megatron/core/distributed/param_and_grad_buffer.h"

namespace megatron::distributed {

ParamAndGradBuffer::ParamAndGradBuffer(std::vector<transformer::Parameter>& params, const std::vector<Shape>& shapes,
                                       DType param_dtype, DType grad_dtype, Device device,
                                       bool allocate_grads) {
  MEGATRON_CHECK(params.size() == shapes.size()) << params.size() << " params, " << shapes.size() << " shapes";
  ranges_.resize(params.size());
  int64_t offset = 0;
  for (size_t k = params.size(); k-- > 0;) {  // reverse registration order
    const int64_t n = shape_numel(shapes[k]);
    ranges_[k] = {offset, offset + n};
    offset += n;
  }
  param_data_ = Tensor::zeros({offset}, param_dtype, device);
  if (allocate_grads) grad_data_ = Tensor::zeros({offset}, grad_dtype, device);
  for (size_t k = 0; k < params.size(); ++k) {
    params[k].data = param_data_.flat_slice(ranges_[k].first, shapes[k]);
    if (allocate_grads) params[k].main_grad = grad_data_.flat_slice(ranges_[k].first, shapes[k]);
  }
}

}  // namespace megatron::distributed
