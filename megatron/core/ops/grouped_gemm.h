// Shape check shared by the CPU reference and the CUDA backend of the grouped GEMM ops
// (grouped_linear_forward / grouped_linear_backward, op_table.h).
#pragma once
#include <cstdint>
#include <vector>

#include "megatron/core/tensor/tensor.h"
#include "megatron/core/utils/errors.h"

namespace megatron::ops {

/// Checks one grouped call: one weight per count, every weight 2-D [out, in] of one shape and x's
/// dtype, counts >= 0 summing to x's rows, x 2-D [N, in]. Throws (internal check) naming `op`.
inline void check_grouped_linear(const char* op, const Tensor& x, const std::vector<Tensor>& ws,
                                 const std::vector<int64_t>& counts) {
  MEGATRON_CHECK(ws.size() == counts.size() && !ws.empty())
      << op << ": " << ws.size() << " weights for " << counts.size() << " counts";
  int64_t total = 0;
  for (size_t e = 0; e < ws.size(); ++e) {
    MEGATRON_CHECK(counts[e] >= 0 && ws[e].dim() == 2 && ws[e].shape() == ws.front().shape() &&
                   ws[e].dtype() == x.dtype())
        << op << ": expert " << e << " weight " << ws[e].str() << " count " << counts[e] << " for x " << x.str();
    total += counts[e];
  }
  MEGATRON_CHECK(x.dim() == 2 && total == x.size(0) && x.size(1) == ws.front().size(1))
      << op << ": counts sum to " << total << " for x " << x.str() << " and weights " << ws.front().str();
}

/// check_grouped_linear plus y [N, out] for grouped_linear_forward.
inline void check_grouped_forward(const Tensor& x, const std::vector<Tensor>& ws, const std::vector<int64_t>& counts,
                                  const Tensor& y) {
  check_grouped_linear("grouped_linear_forward", x, ws, counts);
  MEGATRON_CHECK(y.dim() == 2 && y.size(0) == x.size(0) && y.size(1) == ws.front().size(0))
      << "grouped_linear_forward: y " << y.str();
}

/// Calls fn(e, first_row, rows) for every expert e with rows = counts[e] > 0, first_row being the
/// sum of the counts before it (the expert-major row blocks of a grouped call).
template <class Fn>
void for_each_expert_rows(const std::vector<int64_t>& counts, Fn&& fn) {
  int64_t off = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] > 0) fn(e, off, counts[e]);
    off += counts[e];
  }
}

/// The per-expert loop of grouped_linear_forward: linear(x rows, ws[e], nullptr, y rows) for every
/// expert with rows (linear: a backend's linear_forward).
template <class Linear>
void per_expert_forward(const Tensor& x, const std::vector<Tensor>& ws, const std::vector<int64_t>& counts, Tensor& y,
                        Linear&& linear) {
  for_each_expert_rows(counts, [&](size_t e, int64_t off, int64_t n) {
    Tensor ye = y.narrow0(off, n);
    linear(x.narrow0(off, n), ws[e], nullptr, ye);
  });
}

}  // namespace megatron::ops
