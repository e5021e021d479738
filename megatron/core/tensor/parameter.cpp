#include "megatron/core/tensor/parameter.h"

namespace megatron {

size_t ParamRegistry::add(Parameter p, Shape local_shape) {
  MEGATRON_CHECK(static_cast<int64_t>(local_shape.size()) == static_cast<int64_t>(p.global_shape.size()))
      << p.name << ": local " << shape_str(local_shape) << " vs global " << shape_str(p.global_shape);
  params_.push_back(std::move(p));
  local_shapes_.push_back(std::move(local_shape));
  return params_.size() - 1;
}

}  // namespace megatron
