// CPU reference of ops.h attention_merge_: the log-sum-exp merge of two partial attention
// results over disjoint key sets (online softmax; FlashAttention's rescaling, used by ring
// attention across context-parallel ranks). fp32 throughout.
#include <algorithm>
#include <cmath>
#include <limits>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

void attention_merge_(Tensor& acc_out, Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse) {
  MEGATRON_CHECK(acc_out.dim() == 4 && acc_out.dtype() == DType::kFloat32 && part_out.shape() == acc_out.shape() &&
                 acc_lse.dtype() == DType::kFloat32 && part_lse.dtype() == DType::kFloat32 &&
                 acc_lse.numel() == acc_out.size(0) * acc_out.size(1) * acc_out.size(2) &&
                 part_lse.numel() == acc_lse.numel())
      << "attention_merge_ acc_out " << acc_out.str() << " acc_lse " << acc_lse.str() << " part_out "
      << part_out.str() << " part_lse " << part_lse.str();
  const int64_t s = acc_out.size(0), b = acc_out.size(1), np = acc_out.size(2), d = acc_out.size(3);
  FloatIn po(part_out);
  float* O = acc_out.data<float>();
  float* L = acc_lse.data<float>();
  const float* PL = part_lse.data<float>();
  const float ninf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for if (acc_out.numel() > (1 << 16))
  for (int64_t row = 0; row < s * b * np; ++row) {
    // row = (i * b + bi) * np + h of [s, b, np]; lse index (bi * np + h) * s + i.
    const int64_t i = row / (b * np), bi = (row / np) % b, h = row % np;
    const int64_t li = (bi * np + h) * s + i;
    const float a = L[li], p = PL[li];
    const float m = std::max(a, p);
    if (m == ninf) continue;  // no visible key on either side
    const double ea = std::exp(static_cast<double>(a) - m), ep = std::exp(static_cast<double>(p) - m);
    const double sum = ea + ep;
    const float wa = static_cast<float>(ea / sum), wp = static_cast<float>(ep / sum);
    float* o = O + row * d;
    const float* q = po.data() + row * d;
    for (int64_t c = 0; c < d; ++c) o[c] = o[c] * wa + q[c] * wp;
    L[li] = m + static_cast<float>(std::log(sum));
  }
}

}  // namespace megatron::ops::cpu
