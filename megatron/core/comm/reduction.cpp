#include "megatron/core/comm/reduction.h"

#include <algorithm>
#include <sstream>

namespace megatron::comm {

AccType acc_type(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
      return AccType::kF32;
    case DType::kFloat64:
      return AccType::kF64;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
    case DType::kUInt16:
    case DType::kInt32:
    case DType::kInt64:
      return AccType::kI64;
    default:
      user_error("cannot reduce tensors of dtype ", dtype_name(t), " (use float32/bfloat16/float16/int64)");
  }
}

size_t acc_size(AccType a) { return a == AccType::kF32 ? 4 : 8; }

namespace {
template <class T>
void widen_int(const void* src, int64_t* dst, int64_t n) {
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<int64_t>(s[i]);
}
template <class T>
void narrow_int(const int64_t* src, void* dst, int64_t n) {
  T* d = static_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(src[i]);
}
template <class T>
void reduce_typed(T* a, const T* b, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (int64_t i = 0; i < n; ++i) a[i] += b[i];
      break;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) a[i] = (b[i] > a[i] || b[i] != b[i]) ? b[i] : a[i];
      break;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) a[i] = (b[i] < a[i] || b[i] != b[i]) ? b[i] : a[i];
      break;
  }
}
}  // namespace

void to_acc(const void* src, DType t, void* dst, int64_t n) {
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
      cpu_convert_to_float(src, t, static_cast<float*>(dst), n);
      return;
    case DType::kFloat64:
      std::copy_n(static_cast<const double*>(src), n, static_cast<double*>(dst));
      return;
    case DType::kInt8: return widen_int<int8_t>(src, static_cast<int64_t*>(dst), n);
    case DType::kUInt8: return widen_int<uint8_t>(src, static_cast<int64_t*>(dst), n);
    case DType::kInt16: return widen_int<int16_t>(src, static_cast<int64_t*>(dst), n);
    case DType::kUInt16: return widen_int<uint16_t>(src, static_cast<int64_t*>(dst), n);
    case DType::kInt32: return widen_int<int32_t>(src, static_cast<int64_t*>(dst), n);
    case DType::kInt64: return widen_int<int64_t>(src, static_cast<int64_t*>(dst), n);
    default: acc_type(t);
  }
}

void from_acc(const void* src, DType t, void* dst, int64_t n) {
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
      cpu_convert_from_float(static_cast<const float*>(src), dst, t, n);
      return;
    case DType::kFloat64:
      std::copy_n(static_cast<const double*>(src), n, static_cast<double*>(dst));
      return;
    case DType::kInt8: return narrow_int<int8_t>(static_cast<const int64_t*>(src), dst, n);
    case DType::kUInt8: return narrow_int<uint8_t>(static_cast<const int64_t*>(src), dst, n);
    case DType::kInt16: return narrow_int<int16_t>(static_cast<const int64_t*>(src), dst, n);
    case DType::kUInt16: return narrow_int<uint16_t>(static_cast<const int64_t*>(src), dst, n);
    case DType::kInt32: return narrow_int<int32_t>(static_cast<const int64_t*>(src), dst, n);
    case DType::kInt64: return narrow_int<int64_t>(static_cast<const int64_t*>(src), dst, n);
    default: acc_type(t);
  }
}

void reduce_acc(void* acc, const void* other, AccType a, int64_t n, ReduceOp op) {
  switch (a) {
    case AccType::kF32: return reduce_typed(static_cast<float*>(acc), static_cast<const float*>(other), n, op);
    case AccType::kF64: return reduce_typed(static_cast<double*>(acc), static_cast<const double*>(other), n, op);
    case AccType::kI64: return reduce_typed(static_cast<int64_t*>(acc), static_cast<const int64_t*>(other), n, op);
  }
}

void divide_acc(void* acc, AccType a, int64_t n, int count) {
  switch (a) {
    case AccType::kF32: {
      float* p = static_cast<float*>(acc);
      for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<float>(count);
      return;
    }
    case AccType::kF64: {
      double* p = static_cast<double*>(acc);
      for (int64_t i = 0; i < n; ++i) p[i] /= count;
      return;
    }
    case AccType::kI64: {
      int64_t* p = static_cast<int64_t*>(acc);
      for (int64_t i = 0; i < n; ++i) p[i] /= count;
      return;
    }
  }
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kAvg: return "avg";
  }
  return "?";
}

std::string ranks_str(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

std::string describe(const char* what, const Tensor& t, const std::vector<int>& ranks, const char* extra) {
  std::ostringstream os;
  os << what << "(";
  if (extra) os << extra << ", ";
  os << shape_str(t.shape()) << " " << dtype_name(t.dtype()) << ") on group [";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

}  // namespace megatron::comm
