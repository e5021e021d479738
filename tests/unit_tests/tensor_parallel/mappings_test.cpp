// Tensor/sequence-parallel mappings over the world group (mpirun / megatron_launch; skipped as a
// single process). Expected values: element (i, j) of rank r's input is 100*r + 10*i + j (small
// integers, exact in fp32), so every gathered / reduced / split element has a closed form.
#include <gtest/gtest.h>

#include "test_utils/dist_test_util.h"
#include "megatron/core/tensor_parallel/mappings.h"

namespace megatron {
namespace {

Tensor make(int r, int64_t rows, int64_t cols) {
  std::vector<float> v(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v[i * cols + j] = float(100 * r + 10 * i + j);
  return Tensor::from_vector(v, {rows, cols});
}

TEST(DistMappings, SequenceAndTensorParallelRegions) {
  SKIP_UNLESS_MULTI_RANK();
  auto g = testing::dist_world();
  const int T = g->size(), r = g->rank();
  const int64_t rows = 2, cols = 3;
  Tensor x = make(r, rows, cols);
  // gather along dim 0: block q = rank q's rows.
  Tensor ga = tensor_parallel::gather_along_first_dim(x, *g);
  ASSERT_EQ(ga.shape(), (Shape{rows * T, cols}));
  for (int q = 0; q < T; ++q)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) EXPECT_EQ(ga.item_at((q * rows + i) * cols + j), 100 * q + 10 * i + j);
  // reduce-scatter along dim 0 of a [T*rows, cols] input: rank r gets rows [r*rows, (r+1)*rows)
  // summed over ranks: sum_q (100 q + 10 i + j) = 100 T(T-1)/2 + T (10 i + j), i global row.
  Tensor big = make(r, rows * T, cols);
  Tensor rs = tensor_parallel::reduce_scatter_along_first_dim(big, *g);
  ASSERT_EQ(rs.shape(), (Shape{rows, cols}));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      EXPECT_EQ(rs.item_at(i * cols + j), 100.0 * T * (T - 1) / 2 + T * (10.0 * (r * rows + i) + j));
  // split along dim 0 (no communication).
  Tensor sp = tensor_parallel::split_along_first_dim(big, *g);
  for (int64_t i = 0; i < rows; ++i) EXPECT_EQ(sp.item_at(i * cols), 100 * r + 10 * (r * rows + i));
  // gather along the last dim: row i = [rank 0's row i, rank 1's row i, ...].
  Tensor gl = tensor_parallel::gather_along_last_dim(x, *g);
  ASSERT_EQ(gl.shape(), (Shape{rows, cols * T}));
  for (int64_t i = 0; i < rows; ++i)
    for (int q = 0; q < T; ++q)
      for (int64_t j = 0; j < cols; ++j) EXPECT_EQ(gl.item_at(i * cols * T + q * cols + j), 100 * q + 10 * i + j);
  // split along the last dim inverts it.
  Tensor sl = tensor_parallel::split_along_last_dim(gl, *g);
  EXPECT_EQ(sl.to_float_vector(), x.to_float_vector());
  // all-reduce copy leaves the input untouched.
  Tensor ar = tensor_parallel::all_reduce_copy(x, *g);
  EXPECT_EQ(ar.item_at(0), 100.0 * T * (T - 1) / 2);
  EXPECT_EQ(x.item_at(0), 100.0 * r);
  // Indivisible sequence length: a clear error.
  if (T > 1) EXPECT_THROW(tensor_parallel::split_along_first_dim(make(r, T + 1, 1), *g), UserError);
}

}  // namespace
}  // namespace megatron
