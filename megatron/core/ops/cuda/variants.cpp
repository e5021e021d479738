// The comparison-variant settings of the CUDA ops (variants.h).
#include "megatron/core/ops/cuda/variants.h"

namespace megatron::ops::cuda::variants {

Forced& forced() {
  static Forced f;
  return f;
}

}  // namespace megatron::ops::cuda::variants
