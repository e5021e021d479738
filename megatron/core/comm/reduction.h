// Element-wise reduction helpers for the CPU backends. Reduced-precision floats (bf16, fp16) are
// widened to fp32 before any arithmetic and rounded (RNE) once at the end, so a bf16 all-reduce
// equals round_bf16(sum of the fp32 values) as on the GPU path with fp32 accumulation -- never a
// sum of raw uint16 bit patterns. Integers accumulate in int64, float64 in double.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"

namespace megatron::comm {

enum class AccType { kF32, kF64, kI64 };

/// Accumulation type of a dtype; throws UserError for dtypes that cannot be reduced (fp8, bool).
AccType acc_type(DType t);
size_t acc_size(AccType a);
/// Widens n elements of `t` at src into the accumulation type at dst.
void to_acc(const void* src, DType t, void* dst, int64_t n);
/// Narrows n accumulated elements back to `t` (RNE for bf16/fp16).
void from_acc(const void* src, DType t, void* dst, int64_t n);
/// acc[i] = op(acc[i], other[i]) for n elements (kAvg sums; finish with divide_acc).
void reduce_acc(void* acc, const void* other, AccType a, int64_t n, ReduceOp op);
/// acc[i] /= count (integers: truncating division, as torch's AVG is float-only).
void divide_acc(void* acc, AccType a, int64_t n, int count);
const char* reduce_op_name(ReduceOp op);
/// "[0, 1, 2]"
std::string ranks_str(const std::vector<int>& ranks);
/// "all_reduce(sum, [4, 8] float32) on group [0, 1]" for messages.
std::string describe(const char* what, const Tensor& t, const std::vector<int>& ranks, const char* extra = nullptr);

}  // namespace megatron::comm
