// Device dispatch for megatron/core/ops/ops.h, generated from the op table (ops/op_table.h):
// every op runs on the device of its dispatch argument; CPU tensors go to ops/cpu (reference
// kernels), CUDA tensors to ops/cuda when the build has the CUDA backend (MEGATRON_WITH_CUDA),
// else a UserError says to rebuild with it.
#include "megatron/core/ops/ops.h"

#include "megatron/core/ops/cpu/cpu_ops.h"
#ifdef MEGATRON_WITH_CUDA
#include "megatron/core/ops/cuda/cuda_ops.h"
#endif

namespace megatron::ops {

namespace {
[[noreturn, maybe_unused]] void no_cuda(const char* op) {
  user_error("ops::", op, ": a CUDA tensor reached a build without the CUDA backend; rebuild with -DMEGATRON_CUDA=ON");
}

// The device of a dispatch argument. A list goes where its first element is (an empty list to
// the CPU reference, which returns the neutral result); each backend checks the rest.
bool on_cuda(const Tensor& t) { return t.is_cuda(); }
bool on_cuda(const std::vector<Tensor>& ts) { return !ts.empty() && ts.front().is_cuda(); }
bool on_cuda(const std::vector<AdamTensor>& ts) { return !ts.empty() && ts.front().param && ts.front().param->is_cuda(); }
}  // namespace

#define MEGATRON_OP_DEFAULT(v)
#ifdef MEGATRON_WITH_CUDA
#define MEGATRON_OP(ret, name, params, args, dev) \
  ret name params { return on_cuda(dev) ? cuda::name args : cpu::name args; }
#else
#define MEGATRON_OP(ret, name, params, args, dev) \
  ret name params {                               \
    if (on_cuda(dev)) no_cuda(#name);             \
    return cpu::name args;                        \
  }
#endif
#include "megatron/core/ops/op_table.h"
#undef MEGATRON_OP
#undef MEGATRON_OP_DEFAULT

}  // namespace megatron::ops
