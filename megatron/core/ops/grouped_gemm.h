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

}  // namespace megatron::ops
