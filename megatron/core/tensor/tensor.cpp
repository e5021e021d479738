#include "megatron/core/tensor/tensor.h"

#include "megatron/core/tensor/memory_stats.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

namespace megatron {

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, int) override {
    if (bytes == 0) bytes = 64;
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) user_error("out of host memory allocating ", bytes, " bytes");
    return p;
  }
  void deallocate(void* p, size_t, int) override { std::free(p); }
  void copy(void* dst, Device, const void* src, Device, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void memzero(void* p, size_t bytes, int) override {
    if (bytes) std::memset(p, 0, bytes);
  }
};

CpuAllocator g_cpu_alloc;
Allocator* g_allocators[2] = {&g_cpu_alloc, nullptr};

}  // namespace

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

void register_allocator(DeviceType type, Allocator* alloc) {
  g_allocators[static_cast<int>(type)] = alloc;
}

bool backend_available(DeviceType type) { return g_allocators[static_cast<int>(type)] != nullptr; }

Allocator& allocator_for(DeviceType type) {
  Allocator* a = g_allocators[static_cast<int>(type)];
  if (!a)
    user_error("CUDA was requested but no CUDA backend is registered: this build has none (rebuild with CUDA) or no GPU is visible (check nvidia-smi / CUDA_VISIBLE_DEVICES), or run on CPU");
  return *a;
}

Storage::~Storage() {
  if (owned && ptr) {
    allocator_for(device.type).deallocate(ptr, bytes, device.index);
    detail::count_free(device.type, bytes);
  }
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape) MEGATRON_CHECK(d >= 0) << "negative dimension in " << shape_str(shape);
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  auto st = std::make_shared<Storage>();
  st->bytes = t.nbytes();
  st->device = device;
  st->ptr = allocator_for(device.type).allocate(st->bytes, device.index);
  detail::count_alloc(device.type, st->bytes);
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  auto st = std::make_shared<Storage>();
  st->ptr = data;
  st->bytes = t.nbytes();
  st->device = device;
  st->owned = false;
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape) {
  MEGATRON_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape))
      << "from_vector: " << v.size() << " values for shape " << shape_str(shape);
  Tensor t = empty(shape, DType::kFloat32);
  if (!v.empty()) std::memcpy(t.data_ptr(), v.data(), v.size() * 4);
  return t;
}

Tensor Tensor::from_vector_i64(const std::vector<int64_t>& v, const Shape& shape) {
  MEGATRON_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape))
      << "from_vector_i64: " << v.size() << " values for shape " << shape_str(shape);
  Tensor t = empty(shape, DType::kInt64);
  if (!v.empty()) std::memcpy(t.data_ptr(), v.data(), v.size() * 8);
  return t;
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  if (d < 0) d += n;
  MEGATRON_CHECK(d >= 0 && d < n) << "size(" << d << ") of " << str();
  return shape_[static_cast<size_t>(d)];
}

void* Tensor::data_ptr() const {
  MEGATRON_CHECK(storage_) << "data_ptr() of an undefined tensor";
  MEGATRON_CHECK(storage_->bytes != 0 || numel_ == 0)
      << "data_ptr() of " << shape_str(shape_) << " whose storage was freed (resize_storage_(0))";
  return static_cast<char*>(storage_->ptr) + offset_;
}

void Tensor::resize_storage_(size_t bytes) {
  MEGATRON_CHECK(storage_ && storage_->owned) << "resize_storage_ needs an owned storage";
  Storage& st = *storage_;
  if (st.bytes == bytes && (st.ptr || bytes == 0)) return;
  Allocator& a = allocator_for(st.device.type);
  if (st.ptr) {
    a.deallocate(st.ptr, st.bytes, st.device.index);
    detail::count_free(st.device.type, st.bytes);
    st.ptr = nullptr;
  }
  st.bytes = 0;
  if (bytes == 0) return;
  st.ptr = a.allocate(bytes, st.device.index);
  st.bytes = bytes;
  detail::count_alloc(st.device.type, bytes);
}

Tensor Tensor::view(Shape shape) const {
  int64_t known = 1;
  int neg = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MEGATRON_CHECK(neg < 0) << "view: more than one -1 in " << shape_str(shape);
      neg = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (neg >= 0) {
    MEGATRON_CHECK(known > 0 && numel_ % known == 0) << "view " << shape_str(shape) << " of " << str();
    shape[static_cast<size_t>(neg)] = numel_ / known;
  }
  MEGATRON_CHECK(shape_numel(shape) == numel_) << "view " << shape_str(shape) << " of " << str();
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::narrow0(int64_t start, int64_t len) const {
  MEGATRON_CHECK(dim() >= 1 && start >= 0 && len >= 0 && start + len <= shape_[0])
      << "narrow0(" << start << ", " << len << ") of " << str();
  Tensor t = *this;
  int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  t.offset_ = offset_ + static_cast<size_t>(start * row) * dtype_size(dtype_);
  t.shape_[0] = len;
  t.numel_ = row * len;
  return t;
}

Tensor Tensor::flat_slice(int64_t offset, const Shape& shape) const {
  int64_t n = shape_numel(shape);
  MEGATRON_CHECK(offset >= 0 && offset + n <= numel_)
      << "flat_slice(" << offset << ", " << shape_str(shape) << ") of " << str();
  Tensor t = *this;
  t.offset_ = offset_ + static_cast<size_t>(offset) * dtype_size(dtype_);
  t.shape_ = shape;
  t.numel_ = n;
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_(*this);
  return t;
}

void Tensor::copy_(const Tensor& src) {
  MEGATRON_CHECK(src.numel() == numel_ && src.dtype() == dtype_)
      << "copy_ from " << src.str() << " into " << str();
  Device d = device(), s = src.device();
  // Copies involving CUDA go through the CUDA allocator (it handles host<->device too).
  Allocator& a = allocator_for(d.is_cuda() || s.is_cuda() ? DeviceType::kCUDA : DeviceType::kCPU);
  a.copy(data_ptr(), d, src.data_ptr(), s, nbytes());
}

void Tensor::zero_() {
  if (!defined() || numel_ == 0) return;
  allocator_for(device().type).memzero(data_ptr(), nbytes(), device().index);
}

void cpu_convert_to_float(const void* src, DType t, float* dst, int64_t n) {
  switch (t) {
    case DType::kFloat32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::kBFloat16: {
      auto p = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(p[i]);
      return;
    }
    case DType::kFloat16: {
      auto p = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_bits_to_float(p[i]);
      return;
    }
    case DType::kFloat8E4M3: {
      auto p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = e4m3_bits_to_float(p[i]);
      return;
    }
    case DType::kFloat8E5M2: {
      auto p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = e5m2_bits_to_float(p[i]);
      return;
    }
    case DType::kFloat64: {
      auto p = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(p[i]);
      return;
    }
    case DType::kInt32: {
      auto p = static_cast<const int32_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(p[i]);
      return;
    }
    case DType::kInt64: {
      auto p = static_cast<const int64_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(p[i]);
      return;
    }
    default: MEGATRON_CHECK(false) << "cpu_convert_to_float: unsupported dtype " << dtype_name(t);
  }
}

void cpu_convert_from_float(const float* src, void* dst, DType t, int64_t n) {
  switch (t) {
    case DType::kFloat32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::kBFloat16: {
      auto p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16_bits(src[i]);
      return;
    }
    case DType::kFloat16: {
      auto p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_fp16_bits(src[i]);
      return;
    }
    case DType::kFloat8E4M3: {
      auto p = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_e4m3_bits(src[i]);
      return;
    }
    case DType::kFloat8E5M2: {
      auto p = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_e5m2_bits(src[i]);
      return;
    }
    case DType::kFloat64: {
      auto p = static_cast<double*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = src[i];
      return;
    }
    default: MEGATRON_CHECK(false) << "cpu_convert_from_float: unsupported dtype " << dtype_name(t);
  }
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  MEGATRON_CHECK(is_cpu()) << "Tensor::to(dtype) on " << str()
                           << ": use ops::cast for device tensors";
  Tensor out = empty(shape_, dtype, Device::cpu());
  std::vector<float> tmp(static_cast<size_t>(numel_));
  cpu_convert_to_float(data_ptr(), dtype_, tmp.data(), numel_);
  cpu_convert_from_float(tmp.data(), out.data_ptr(), dtype, numel_);
  return out;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_(*this);
  return t;
}

void Tensor::fill_(float v) {
  MEGATRON_CHECK(is_cpu()) << "fill_ on " << str() << ": use ops::fill for device tensors";
  std::vector<float> tmp(static_cast<size_t>(numel_), v);
  cpu_convert_from_float(tmp.data(), data_ptr(), dtype_, numel_);
}

std::vector<float> Tensor::to_float_vector() const {
  Tensor c = to(Device::cpu());
  std::vector<float> out(static_cast<size_t>(numel_));
  cpu_convert_to_float(c.data_ptr(), dtype_, out.data(), numel_);
  return out;
}

double Tensor::item_at(int64_t i) const {
  MEGATRON_CHECK(is_cpu() && i >= 0 && i < numel_) << "item_at(" << i << ") of " << str();
  const char* p = static_cast<const char*>(data_ptr()) + static_cast<size_t>(i) * dtype_size(dtype_);
  switch (dtype_) {
    case DType::kFloat32: return *reinterpret_cast<const float*>(p);
    case DType::kFloat64: return *reinterpret_cast<const double*>(p);
    case DType::kBFloat16: return bf16_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
    case DType::kFloat16: return fp16_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
    case DType::kFloat8E4M3: return e4m3_bits_to_float(*reinterpret_cast<const uint8_t*>(p));
    case DType::kFloat8E5M2: return e5m2_bits_to_float(*reinterpret_cast<const uint8_t*>(p));
    case DType::kInt8: return *reinterpret_cast<const int8_t*>(p);
    case DType::kUInt8: return *reinterpret_cast<const uint8_t*>(p);
    case DType::kBool: return *reinterpret_cast<const uint8_t*>(p);
    case DType::kInt16: return *reinterpret_cast<const int16_t*>(p);
    case DType::kUInt16: return *reinterpret_cast<const uint16_t*>(p);
    case DType::kInt32: return *reinterpret_cast<const int32_t*>(p);
    case DType::kInt64: return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
  }
  return 0;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor" + shape_str(shape_) + " " + dtype_name(dtype_) + " " + device().str();
}

}  // namespace megatron
