// Tensor::resize_storage_ (PyTorch's untyped_storage().resize_()): frees and reallocates a
// storage's memory under all its views. Expected values are hand counts of bytes (float32 = 4 B).
#include <gtest/gtest.h>

#include "megatron/core/tensor/memory_stats.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron {
namespace {

TEST(TensorResizeStorage, FreesAndRestoresUnderEveryView) {
  Tensor buf = Tensor::zeros({10}, DType::kFloat32);
  Tensor view = buf.flat_slice(4, {2, 3});  // elements 4..9
  const int64_t held = memory_stats(DeviceType::kCPU).allocated;
  buf.resize_storage_(0);
  EXPECT_EQ(memory_stats(DeviceType::kCPU).allocated, held - 40) << "10 float32 = 40 bytes freed";
  EXPECT_EQ(view.storage_bytes(), 0u);
  EXPECT_ANY_THROW((void)view.data_ptr()) << "a view of freed storage must not be readable";
  EXPECT_EQ(view.shape(), (Shape{2, 3})) << "shape and dtype survive";
  buf.resize_storage_(buf.nbytes());
  EXPECT_EQ(memory_stats(DeviceType::kCPU).allocated, held);
  view.fill_(2.5f);  // the view writes into the new memory at its offset
  buf.flat_slice(0, {4}).fill_(1.0f);
  const std::vector<float> want = {1, 1, 1, 1, 2.5f, 2.5f, 2.5f, 2.5f, 2.5f, 2.5f};
  EXPECT_EQ(buf.to_float_vector(), want);
  // Non-owned (from_blob) storage cannot be resized.
  float mem[2] = {0, 0};
  Tensor blob = Tensor::from_blob(mem, {2}, DType::kFloat32);
  EXPECT_ANY_THROW(blob.resize_storage_(0));
}

}  // namespace
}  // namespace megatron
