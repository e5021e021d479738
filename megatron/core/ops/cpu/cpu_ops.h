// CPU reference implementations of every op in the op table (megatron/core/ops/op_table.h; same
// signatures without default arguments, generated from the table; the documentation is there).
// fp32 math, OpenMP over rows, OpenBLAS sgemm for GEMMs; bfloat16/float16/fp8 tensors are
// converted to fp32 on load and rounded to nearest even on store. These kernels are the numerical
// ground truth for the CUDA backend and what CPU training runs. Callers use megatron::ops::
// (dispatch.cpp), not these directly.
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cpu {

#define MEGATRON_OP_DEFAULT(v)
#define MEGATRON_OP(ret, name, params, args, dev) ret name params;
#include "megatron/core/ops/op_table.h"
#undef MEGATRON_OP
#undef MEGATRON_OP_DEFAULT

}  // namespace megatron::ops::cpu
