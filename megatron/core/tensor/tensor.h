// Tensor: a contiguous, row-major, n-dimensional array on one device.
//
// Design (see docs/architecture.md): there are no strides. A Tensor is (storage, byte offset,
// shape, dtype). Views share storage; reshape() and slicing along dim 0 / of a flat range are
// free; everything else copies. This keeps every kernel simple and lets the data-parallel
// wrapper own one flat parameter buffer and one flat gradient buffer that modules view into.
//
// Memory comes from a per-device Allocator. The CPU allocator is built in (64-byte aligned);
// the CUDA backend registers its stream-ordered pool at start-up (megatron/core/ops/cuda).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/tensor/dtype.h"
#include "megatron/core/utils/errors.h"

namespace megatron {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };

/// A device: CPU, or CUDA device `index`.
struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::kCUDA, i}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

/// Allocates raw device memory. Implementations must be thread-safe.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, int device_index) = 0;
  virtual void deallocate(void* p, size_t bytes, int device_index) = 0;
  /// Copies `bytes` between any two devices this backend knows (dst/src device given).
  virtual void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) = 0;
  /// Sets `bytes` bytes to zero.
  virtual void memzero(void* p, size_t bytes, int device_index) = 0;
};

/// Registers the allocator of a device type (the CUDA backend calls this at start-up).
void register_allocator(DeviceType type, Allocator* alloc);
/// The allocator for `type`; throws UserError if that backend is not compiled in / available.
Allocator& allocator_for(DeviceType type);
/// True if a backend for `type` is registered.
bool backend_available(DeviceType type);

using Shape = std::vector<int64_t>;
/// Number of elements of a shape (1 for a scalar shape {}).
int64_t shape_numel(const Shape& s);
/// "[2, 3, 4]"
std::string shape_str(const Shape& s);

/// Owning block of device memory.
struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  bool owned = true;
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;

  /// Uninitialized tensor. Shape entries must be >= 0.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  /// Zero-filled tensor.
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  /// Non-owning tensor over caller memory (caller keeps it alive).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());
  /// CPU float32 tensor with the given values (size must equal shape_numel(shape)).
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape);
  /// CPU int64 tensor with the given values.
  static Tensor from_vector_i64(const std::vector<int64_t>& v, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  /// Size of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }

  void* data_ptr() const;
  /// Typed pointer; checks that sizeof(T) matches the element size.
  template <class T>
  T* data() const {
    MEGATRON_CHECK(sizeof(T) == dtype_size(dtype_)) << "data<T>() size mismatch for " << str();
    return static_cast<T*>(data_ptr());
  }

  /// Same storage, new shape (numel must match). One dim may be -1.
  Tensor view(Shape shape) const;
  /// Rows [start, start+len) along dim 0 (shares storage).
  Tensor narrow0(int64_t start, int64_t len) const;
  /// Elements [offset, offset + numel(shape)) of the flat tensor, viewed as `shape`.
  Tensor flat_slice(int64_t offset, const Shape& shape) const;

  /// Copy to another device (same dtype). Returns *this when already there.
  Tensor to(Device device) const;
  /// Converted copy (rounding to nearest even for reduced float formats). CPU or CUDA.
  Tensor to(DType dtype) const;
  Tensor clone() const;
  /// Copies src into this tensor (same numel and dtype; any devices).
  void copy_(const Tensor& src);
  void zero_();
  /// Fills a float tensor with `v` (CPU only, or via ops on CUDA).
  void fill_(float v);

  /// Reads all elements as float (any float dtype, any device; slow path for tests/logging).
  std::vector<float> to_float_vector() const;
  /// Element i as double (CPU tensors; any dtype).
  double item_at(int64_t i) const;
  double item() const { return item_at(0); }

  /// "Tensor[2, 3] bfloat16 cpu"
  std::string str() const;
  /// True when both tensors view the same storage.
  bool shares_storage(const Tensor& o) const { return storage_ == o.storage_; }
  /// Frees (bytes == 0) or reallocates (uninitialized, `bytes` bytes) the memory of this tensor's
  /// storage in place: every view of the storage sees the change (PyTorch's
  /// untyped_storage().resize_(), which Megatron uses to drop and restore parameter/grad buffers).
  /// Views must not be read while the storage is freed (data_ptr() then checks). Owned storage
  /// only (a from_blob tensor throws).
  void resize_storage_(size_t bytes);
  /// Bytes of memory the storage holds now (0 when freed by resize_storage_ or undefined).
  size_t storage_bytes() const { return storage_ ? storage_->bytes : 0; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kFloat32;
};

/// Converts `n` elements of type `src_t` at `src` to float into `dst` (CPU).
void cpu_convert_to_float(const void* src, DType src_t, float* dst, int64_t n);
/// Converts `n` floats into `dst_t` at `dst` with RNE rounding (CPU).
void cpu_convert_from_float(const float* src, void* dst, DType dst_t, int64_t n);

}  // namespace megatron
