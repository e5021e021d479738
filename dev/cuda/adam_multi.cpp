// adam_step_multi: the multi-tensor kernel (one launch per model-param dtype, automatic) against
// one adam_step launch per tensor (adam_per_tensor), on GPT-2 124M's 148 fp32 master params with
// bf16 model params, checked against the CPU reference (ops/cpu/adam.cpp) within 1e-6 of the
// max (the CPU rounds the bias corrections from fp32, the kernels from fp64: op_table.h) and
// bit-identical to each other (the same per-element arithmetic). Timed launches keep stepping
// the same state; only the first step is checked.
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
  const DType f32 = DType::kFloat32, bf = DType::kBFloat16;
  const Device C = Device::cpu(), G = Device::cuda();
  struct State { Tensor p, g, m, v, mp; };
  std::vector<std::vector<float>> init_p, init_g, init_m, init_v;
  for (int64_t n : sizes) {
    init_p.push_back(randn(n, f32, 0.02f));
    init_g.push_back(randn(n, f32, 1e-3f));
    init_m.push_back(randn(n, f32, 1e-4f));
    auto v = randn(n, f32, 1e-6f);
    for (auto& x : v) x = std::fabs(x);
    init_v.push_back(v);
  }
  auto state = [&](Device d) {
    std::vector<State> s;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t n = sizes[i];
      s.push_back({make(init_p[i], {n}, f32, d), make(init_g[i], {n}, f32, d), make(init_m[i], {n}, f32, d),
                   make(init_v[i], {n}, f32, d), Tensor::empty({n}, bf, d)});
    }
    return s;
  };
  auto table = [&](std::vector<State>& s) {
    std::vector<ops::AdamTensor> t;
    for (auto& x : s) t.push_back({&x.p, &x.g, &x.m, &x.v, &x.mp, 6e-4f, 0.1f});
    return t;
  };
  ops::AdamParams hp;
  hp.step = 10;
  std::vector<State> ref = state(C);
  cpu::adam_step_multi(table(ref), hp);
  std::vector<float> first[2];
  for (int per : {0, 1}) {
    forced().adam_per_tensor = per;
    const std::string nm = std::string("adam_step_multi (") + std::to_string(sizes.size()) + " tensors) " +
                           (per ? "per tensor (forced)" : "shipped");
    std::vector<State> s = state(G);
    auto t = table(s);
    cu::adam_step_multi(t, hp);
    check(nm + " param (embedding)", s[0].p, ref[0].p, 1e-6);
    check(nm + " exp_avg_sq (last)", s.back().v, ref.back().v, 1e-6);
    check(nm + " model param bf16 (layer 0 qkv)", s[6].mp, ref[6].mp, 1e-2);
    first[per] = s[6].p.to_float_vector();
    time_line(nm, median_ms([&] { cu::adam_step_multi(t, hp); }, args.reps));
  }
  forced().adam_per_tensor = false;
  const bool same = first[0] == first[1];
  if (!same) ++failures();
  std::printf("%s multi-tensor and per-tensor Adam bit-identical (layer 0 qkv params)\n", same ? "PASS" : "FAIL");
  return finish();
}
