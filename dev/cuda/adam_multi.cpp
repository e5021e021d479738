// adam_step_multi: every multi-tensor Adam kernel of adam_multi.cu (variants.h adam_kernel: v1 =
// the kernel before Session 11, u2, u4, u2plain, u2chunk, u4chunk) and one adam_step launch per
// tensor (adam_per_tensor), and the grad-norm stage 1 (sum_of_squares_many) with one or two loads
// in flight (reduce_stage1_v1).
//  1. Correctness, on GPT-2 124M's 148 fp32 master params (bf16 model params) plus 6 odd-sized
//     tensors (1 .. 100003 elements, tails of every kind) and one whose pointers are not 16-byte
//     aligned (the element path), with the --clip-grad coefficient applied in the step
//     (grad_scale 0.37): v1 against the CPU reference (ops/cpu/adam.cpp) within 1e-6 of the max
//     (the CPU rounds the bias corrections from fp32, the kernels from fp64: op_table.h), and every
//     other kernel and the per-tensor launches bit-identical to v1 in every param, exp_avg,
//     exp_avg_sq and model param of every tensor (the same per-element fp32 arithmetic,
//     adam_update.cuh; only the element-to-thread mapping and the access hints differ). The
//     sum_of_squares_many of the grads: both stage-1 loops give the same double.
//  2. Speed: each kernel on GPT-2's list and on a LLaMA-3-8B-shaped 4-layer list (1.92e9 params,
//     bf16 model params: 30 bytes a param, 16 read + 14 written), median of --reps launches, with
//     the bandwidth; a device-to-device copy of 2 GiB for the ceiling; the grad-norm stage 1 on
//     the LLaMA grads (4 bytes a param read), both loops, the same double required.
// Timed launches keep stepping the same state; only the first step is checked.
#include <cinttypes>

#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

namespace {

const DType f32 = DType::kFloat32, bf = DType::kBFloat16;

/// One optimizer tensor: master param, grad, exp_avg, exp_avg_sq (fp32), model param (bf16).
struct State {
  Tensor p, g, m, v, mp;
};

std::vector<ops::AdamTensor> table(std::vector<State>& s) {
  std::vector<ops::AdamTensor> t;
  for (size_t i = 0; i < s.size(); ++i)  // every 7th tensor without weight decay (as the norms)
    t.push_back({&s[i].p, &s[i].g, &s[i].m, &s[i].v, &s[i].mp, 6e-4f, i % 7 == 3 ? 0.0f : 0.1f});
  return t;
}

/// All bits of every tensor of s (p, m, v, model param), for the bitwise comparison.
std::vector<std::vector<float>> bits(const std::vector<State>& s) {
  std::vector<std::vector<float>> out;
  for (const auto& x : s)
    for (const Tensor* t : {&x.p, &x.m, &x.v, &x.mp}) out.push_back(t->to_float_vector());
  return out;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

/// The kernels to run: every adam_kernel index, then -2 for the per-tensor launches.
std::vector<int> kernels() {
  std::vector<int> k;
  for (int i = 0; cu::variants::adam_kernel_name(i); ++i) k.push_back(i);
  k.push_back(-2);
  return k;
}

std::string kernel_label(int k) { return k == -2 ? std::string("per-tensor") : cu::variants::adam_kernel_name(k); }

void select(int k) {
  forced().adam_per_tensor = k == -2;
  forced().adam_kernel = k == -2 ? 0 : k;
}

/// sum_of_squares_many over the grads of s with the stage-1 loop from before Session 11
/// (reduce_stage1_v1) and with the default one: PASS iff both give the same double. With reps > 0
/// also times both (and prints the bandwidth over `params` fp32 grads).
void grad_norm_pair(const std::vector<State>& s, const std::string& label, int reps, int64_t params) {
  std::vector<Tensor> grads;
  for (const auto& x : s) grads.push_back(x.g);
  double r[2];
  for (int v1 : {1, 0}) {
    forced().reduce_stage1_v1 = v1;
    r[v1] = cu::sum_of_squares_many(grads);
    if (reps > 0) {
      const double ms = median_ms([&] { cu::sum_of_squares_many(grads); }, reps);
      const std::string nm = "grad norm " + label + (v1 ? " v1" : " 2-in-flight");
      time_line(nm, ms);
      std::printf("BW %-26s %8.3f ms %6.2f TB/s\n", nm.c_str(), ms, 4.0 * params / 1e9 / ms);
    }
  }
  forced().reduce_stage1_v1 = false;
  const bool same = std::memcmp(&r[0], &r[1], sizeof(double)) == 0;
  if (!same) ++failures();
  std::printf("%s sum_of_squares_many stage 1 two loads in flight == v1 (%s): %.17g vs %.17g\n",
              same ? "PASS" : "FAIL", label.c_str(), r[0], r[1]);
}

}  // namespace

int main(int argc, char** argv) {
  Args args(argc, argv);
  // A pool of normal(0, 1) values; tensor i's arrays are scaled windows of it (cheap to make).
  const int64_t kPool = int64_t{1} << 22;
  const std::vector<float> pool = randn(kPool, f32, 1.0f);
  auto window = [&](int64_t n, int64_t at, float scale, bool abs) {
    std::vector<float> v(n);
    for (int64_t j = 0; j < n; ++j) {
      const float x = scale * pool[(at + j * 7) % kPool];
      v[j] = abs ? std::fabs(x) : x;
    }
    return v;
  };

  // ---- 1. correctness on GPT-2's list + odd sizes + a misaligned tensor ----
  std::vector<int64_t> sizes = {50304 * 768, 1024 * 768, 768, 768};
  for (int l = 0; l < 12; ++l)
    for (int64_t n : {768, 768, 3 * 768 * 768, 3 * 768, 768 * 768, 768, 768, 768, 4 * 768 * 768, 4 * 768,
                      4 * 768 * 768, 768})
      sizes.push_back(n);
  const size_t n_gpt2 = sizes.size();
  for (int64_t n : {1, 3, 5, 4099, 8193, 100003, 70001}) sizes.push_back(n);  // the last one misaligned
  std::vector<std::vector<float>> init[4];
  for (size_t i = 0; i < sizes.size(); ++i) {
    init[0].push_back(window(sizes[i], 11 * i + 1, 0.02f, false));
    init[1].push_back(window(sizes[i], 13 * i + 2, 1e-3f, false));
    init[2].push_back(window(sizes[i], 17 * i + 3, 1e-4f, false));
    init[3].push_back(window(sizes[i], 19 * i + 4, 1e-6f, true));
  }
  // A tensor of n elements on d; the last one of the list (on the GPU) 4 bytes past a 16-byte boundary.
  auto alloc = [&](size_t i, DType dt, Device d) {
    const int64_t n = sizes[i];
    return d.is_cuda() && i + 1 == sizes.size() ? Tensor::zeros({n + 1}, dt, d).flat_slice(1, {n})
                                                : Tensor::empty({n}, dt, d);
  };
  auto state = [&](Device d) {
    std::vector<State> s;
    for (size_t i = 0; i < sizes.size(); ++i) {
      State x{alloc(i, f32, d), alloc(i, f32, d), alloc(i, f32, d), alloc(i, f32, d), alloc(i, bf, d)};
      Tensor* dst[4] = {&x.p, &x.g, &x.m, &x.v};
      for (int a = 0; a < 4; ++a) dst[a]->copy_(make(init[a][i], {sizes[i]}, f32, Device::cpu()));
      s.push_back(std::move(x));
    }
    return s;
  };
  // A device copy of s (uploaded once, copied on the device for every kernel).
  auto clone = [&](const std::vector<State>& s) {
    std::vector<State> c;
    for (size_t i = 0; i < s.size(); ++i) {
      const Device G = Device::cuda();
      State x{alloc(i, f32, G), alloc(i, f32, G), alloc(i, f32, G), alloc(i, f32, G), alloc(i, bf, G)};
      x.p.copy_(s[i].p), x.g.copy_(s[i].g), x.m.copy_(s[i].m), x.v.copy_(s[i].v);
      c.push_back(std::move(x));
    }
    return c;
  };
  ops::AdamParams hp;
  hp.step = 10;
  hp.grad_scale = 0.37f;  // the clip coefficient path
  std::vector<State> ref = state(Device::cpu());
  cpu::adam_step_multi(table(ref), hp);
  const std::vector<State> start = state(Device::cuda());
  std::vector<std::vector<float>> v1_bits;
  const std::string list = std::to_string(n_gpt2) + "+" + std::to_string(sizes.size() - n_gpt2) + " tensors";
  for (int k : kernels()) {
    select(k);
    std::vector<State> s = clone(start);
    auto t = table(s);
    cu::adam_step_multi(t, hp);
    const std::string nm = "adam " + kernel_label(k);
    if (k == 0) {
      check(nm + " param (embedding)", s[0].p, ref[0].p, 1e-6);
      check(nm + " exp_avg_sq (layer 11 fc2 bias)", s[n_gpt2 - 1].v, ref[n_gpt2 - 1].v, 1e-6);
      check(nm + " model param bf16 (layer 0 qkv)", s[6].mp, ref[6].mp, 1e-2);
      check(nm + " param (100003, tail)", s[sizes.size() - 2].p, ref[sizes.size() - 2].p, 1e-6);
      check(nm + " param (misaligned)", s.back().p, ref.back().p, 1e-6);
      v1_bits = bits(s);
    } else {
      const bool same = same_bits(bits(s), v1_bits);
      if (!same) ++failures();
      std::printf("%s adam %s bit-identical to v1 (%s, every p/m/v/model param)\n", same ? "PASS" : "FAIL",
                  kernel_label(k).c_str(), list.c_str());
    }
    time_line("adam GPT-2 " + kernel_label(k), median_ms([&] { cu::adam_step_multi(t, hp); }, args.reps));
  }
  select(-1);  // back to the automatic choice
  grad_norm_pair(start, list, 0, 0);

  // ---- 2. speed on the LLaMA-3-8B-shaped 4-layer list ----
  std::vector<int64_t> ll = {128256LL * 4096};  // embedding
  for (int l = 0; l < 4; ++l)
    for (int64_t n : {4096LL, 6144LL * 4096, 4096LL * 4096, 4096LL, 2 * 14336LL * 4096, 4096LL * 14336})
      ll.push_back(n);  // input norm, qkv, proj, pre-mlp norm, fc1 (gate+up), fc2
  ll.push_back(4096);                // final norm
  ll.push_back(128256LL * 4096);     // output layer
  int64_t total = 0;
  for (int64_t n : ll) total += n;
  {
    const Device G = Device::cuda();
    std::vector<State> s;
    const int64_t kChunkInit = int64_t{1} << 22;
    Tensor rnd = make(pool, {kPool}, f32, G);  // random grads: windows of the pool
    for (int64_t n : ll) {
      State x{Tensor::empty({n}, f32, G), Tensor::empty({n}, f32, G), Tensor::empty({n}, f32, G),
              Tensor::empty({n}, f32, G), Tensor::empty({n}, bf, G)};
      cu::fill(x.p, 0.01f);  // device tensors: Tensor::fill_ is host-only
      cu::fill(x.m, 1e-4f);
      cu::fill(x.v, 1e-6f);
      for (int64_t o = 0; o < n; o += kChunkInit) {
        const int64_t len = std::min(kChunkInit, n - o);
        Tensor dst = x.g.flat_slice(o, {len});
        dst.copy_(rnd.flat_slice(0, {len}));
      }
      s.push_back(std::move(x));
    }
    auto t = table(s);
    ops::AdamParams lp;
    lp.step = 10;
    const double gb = 30.0 * static_cast<double>(total) / 1e9;
    std::printf("INFO LLaMA-3-8B-shaped 4 layers: %zu tensors, %" PRId64 " params, %.1f GB moved per Adam step\n",
                ll.size(), total, gb);
    for (int k : kernels()) {
      select(k);
      const double ms = median_ms([&] { cu::adam_step_multi(t, lp); }, args.reps);
      time_line("adam LLaMA " + kernel_label(k), ms);
      std::printf("BW adam LLaMA %-12s %8.3f ms %6.2f TB/s\n", kernel_label(k).c_str(), ms, gb / ms);
    }
    select(-1);
    {
      // Up to 2 GiB of fp32, within the two tensors (the LLaMA list's largest has 525 M elements).
      const int64_t n = std::min<int64_t>(int64_t{1} << 29, std::min(s[0].p.numel(), s.back().p.numel()));
      Tensor a = s[0].p.flat_slice(0, {n}), b = s.back().p.flat_slice(0, {n});
      const double ms = median_ms([&] { b.copy_(a); }, args.reps);
      std::printf("BW copy (device to device, %.2f GB) %8.3f ms %6.2f TB/s\n", 4.0 * n / 1e9, ms, 2.0 * 4.0 * n / 1e9 / ms);
      std::fflush(stdout);
    }
    grad_norm_pair(s, "LLaMA", args.reps, total);
  }
  return finish();
}
