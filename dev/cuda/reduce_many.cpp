// sum_of_squares_many (the global gradient norm): the multi-tensor stage-1 launches (automatic)
// against one stage-1 launch per tensor (reduce_per_tensor), on GPT-2 124M's 148 fp32 main
// gradients (the 4 shapes per layer x 12 layers + embeddings, sizes below), checked against the
// CPU reference (ops/cpu/elementwise.cpp) within 1e-12 relative (double accumulation of fp32
// squares; only the order differs), and the two variants bit-identical to each other (the
// partials are the same blocks summed in the same order).
#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

int main(int argc, char** argv) {
  Args args(argc, argv);
  std::vector<int64_t> sizes = {50304 * 768, 1024 * 768, 768, 768};
  for (int l = 0; l < 12; ++l)
    for (int64_t n : {768, 768, 3 * 768 * 768, 3 * 768, 768 * 768, 768, 768, 768, 4 * 768 * 768, 4 * 768,
                      4 * 768 * 768, 768})
      sizes.push_back(n);
  std::vector<Tensor> host_ts, ts;
  for (int64_t n : sizes) {
    host_ts.push_back(make(randn(n, DType::kFloat32, 0.01f), {n}, DType::kFloat32, Device::cpu()));
    ts.push_back(host_ts.back().to(Device::cuda()));
  }
  const double ref = cpu::sum_of_squares_many(host_ts);
  double got[2] = {0, 0};
  for (int per : {0, 1}) {
    forced().reduce_per_tensor = per;
    const std::string nm = std::string("sum_of_squares_many (") + std::to_string(ts.size()) + " tensors) " +
                           (per ? "per tensor (forced)" : "shipped");
    got[per] = cu::sum_of_squares_many(ts);
    const double err = std::fabs(got[per] - ref) / ref;
    if (!(err <= 1e-12)) ++failures();
    std::printf("%s %-44s rel err %.3e (tol 1e-12)\n", err <= 1e-12 ? "PASS" : "FAIL", nm.c_str(),
                err);
    time_line(nm, median_ms([&] { cu::sum_of_squares_many(ts); }, args.reps));
  }
  forced().reduce_per_tensor = false;
  const bool same = std::memcmp(&got[0], &got[1], sizeof(double)) == 0;
  if (!same) ++failures();
  std::printf("%s multi-tensor and per-tensor launches bit-identical (%.17g vs %.17g)\n", same ? "PASS" : "FAIL", got[0],
              got[1]);
  return finish();
}
