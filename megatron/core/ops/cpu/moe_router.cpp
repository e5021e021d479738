// The MoE device-router ops (op_table.h, moerouter block) have no CPU fusion: the CPU reference
// declines (returns false, nothing written) and the caller runs the host float64 router and
// permutation (megatron/core/transformer/moe/moe_utils.h), so the CPU results are unchanged.
#include "megatron/core/ops/cpu/cpu_ops.h"

namespace megatron::ops::cpu {

bool moe_router_forward(const Tensor&, const Tensor*, int64_t, int64_t, bool, float, int64_t, int64_t, int64_t, Tensor&,
                        Tensor&, Tensor*) {
  return false;
}
bool moe_permute_map(const Tensor&, const Tensor&, int64_t, Tensor&, Tensor&, Tensor&, Tensor&) { return false; }
bool moe_unpermute(const Tensor&, const Tensor&, Tensor&) { return false; }
bool moe_router_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, bool, float, int64_t,
                         const Tensor*, float, Tensor&) {
  return false;
}

}  // namespace megatron::ops::cpu
