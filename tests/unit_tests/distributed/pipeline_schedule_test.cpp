// The 1F1B pipeline schedule with PP = world size (2-4 ranks under mpirun / megatron_launch) on a
// toy model: stage s computes out = tanh(in · W_s), the last stage's loss is Σ(out ⊙ target)/M.
// Reference: the same stages run one after another in one process for every micro-batch
// (hand-written forward/backward of the formula above). The schedule only reorders micro-batches
// and moves tensors, so losses and the accumulated dW must match to fp32 rounding (tolerance
// 1e-6 relative to the largest magnitude; they are in fact bit-identical).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "dist_test_util.h"
#include "megatron/core/pipeline_parallel/schedules.h"

namespace megatron {
namespace {

constexpr int kRows = 3, kH = 8;

std::vector<float> weight(int s) {
  std::vector<float> w(kH * kH);
  for (int i = 0; i < kH; ++i)
    for (int j = 0; j < kH; ++j) w[i * kH + j] = 0.3f * std::sin(1.0f + 31.0f * s + 7.0f * i + j);
  return w;
}
std::vector<float> data_in(int m) {
  std::vector<float> x(kRows * kH);
  for (int k = 0; k < kRows * kH; ++k) x[k] = std::cos(13.0f * m + k);
  return x;
}
std::vector<float> target(int m) {
  std::vector<float> t(kRows * kH);
  for (int k = 0; k < kRows * kH; ++k) t[k] = std::sin(5.0f * m + 0.1f * k);
  return t;
}

// One stage of the toy model with per-micro-batch saved activations.
struct ToyStage : pipeline_parallel::PipelineStage {
  int s, S, M;
  std::vector<float> w, dw;
  std::map<int, std::pair<std::vector<float>, std::vector<float>>> saved;  // mb -> (in, out)
  std::vector<int> order;  // forward/backward trace: +mb forward, -(mb+1) backward
  ToyStage(int stage, int stages, int m) : s(stage), S(stages), M(m), w(weight(stage)), dw(kH * kH, 0.f) {}
  Tensor forward_step(int mb, const Tensor& input) override {
    order.push_back(mb);
    std::vector<float> in = s == 0 ? data_in(mb) : input.to_float_vector();
    std::vector<float> out(kRows * kH, 0.f);
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < kH; ++j) {
        float z = 0;
        for (int i = 0; i < kH; ++i) z += in[r * kH + i] * w[i * kH + j];
        out[r * kH + j] = std::tanh(z);
      }
    saved[mb] = {in, out};
    if (s == S - 1) {
      auto t = target(mb);
      float loss = 0;
      for (int k = 0; k < kRows * kH; ++k) loss += out[k] * t[k];
      return Tensor::from_vector({loss / M}, {1});
    }
    return Tensor::from_vector(out, {kRows, kH});
  }
  Tensor backward_step(int mb, const Tensor& out_grad) override {
    order.push_back(-(mb + 1));
    auto [in, out] = saved.at(mb);
    saved.erase(mb);
    std::vector<float> dout(kRows * kH);
    if (s == S - 1) {
      auto t = target(mb);
      for (int k = 0; k < kRows * kH; ++k) dout[k] = t[k] / M;
    } else {
      dout = out_grad.to_float_vector();
    }
    std::vector<float> dz(kRows * kH), din(kRows * kH, 0.f);
    for (int k = 0; k < kRows * kH; ++k) dz[k] = dout[k] * (1 - out[k] * out[k]);
    for (int r = 0; r < kRows; ++r)
      for (int i = 0; i < kH; ++i)
        for (int j = 0; j < kH; ++j) {
          dw[i * kH + j] += in[r * kH + i] * dz[r * kH + j];
          din[r * kH + i] += dz[r * kH + j] * w[i * kH + j];
        }
    if (s == 0) return {};
    return Tensor::from_vector(din, {kRows, kH});
  }
};

TEST(DistPipeline, OneFOneBMatchesSequentialRun) {
  SKIP_UNLESS_MULTI_RANK();
  auto world = testing::dist_world();
  const int S = world->size(), r = world->rank();
  for (int M : {1, 2, S, 2 * S + 1}) {
    // Reference: all stages in this process, micro-batch by micro-batch.
    std::vector<std::unique_ptr<ToyStage>> ref;
    for (int s = 0; s < S; ++s) ref.push_back(std::make_unique<ToyStage>(s, S, M));
    std::vector<float> ref_losses;
    for (int mb = 0; mb < M; ++mb) {
      Tensor x;
      for (int s = 0; s < S; ++s) x = ref[s]->forward_step(mb, x);
      ref_losses.push_back(float(x.item()));
      Tensor g;
      for (int s = S - 1; s >= 0; --s) g = ref[s]->backward_step(mb, g);
    }
    ToyStage mine(r, S, M);
    pipeline_parallel::P2PCommunicator p2p(world, {kRows, kH}, DType::kFloat32);
    auto losses = pipeline_parallel::forward_backward_pipelining_without_interleaving(mine, M, p2p);
    if (r == S - 1) {
      ASSERT_EQ(int(losses.size()), M);
      for (int mb = 0; mb < M; ++mb) EXPECT_NEAR(losses[mb].item(), ref_losses[mb], 1e-6 * std::fabs(ref_losses[mb]) + 1e-7);
    } else {
      EXPECT_TRUE(losses.empty());
    }
    float mx = 0, err = 0;
    for (int k = 0; k < kH * kH; ++k) {
      mx = std::max(mx, std::fabs(ref[r]->dw[k]));
      err = std::max(err, std::fabs(mine.dw[k] - ref[r]->dw[k]));
    }
    EXPECT_LE(err, 1e-6 * mx) << "dW of stage " << r << ", M=" << M;
    // Schedule shape (megatron.md §9.4): min(S - r - 1, M) warm-up forwards come first.
    const int warmup = std::min(S - r - 1, M);
    for (int i = 0; i < warmup; ++i) EXPECT_EQ(mine.order[i], i) << "warm-up forward " << i;
    if (warmup < M) EXPECT_EQ(mine.order[warmup], warmup) << "first steady-state forward";
    if (warmup < M) EXPECT_EQ(mine.order[warmup + 1], -1) << "then the backward of micro-batch 0";
    EXPECT_EQ(int(mine.order.size()), 2 * M);
  }
}

struct VirtualToy : pipeline_parallel::VirtualPipelineStage {
  std::vector<std::unique_ptr<ToyStage>> chunks;
  std::vector<std::pair<char, int>> trace;  // ('F'|'B', chunk)
  VirtualToy(int rank, int P, int V, int M) {
    for (int c = 0; c < V; ++c) chunks.push_back(std::make_unique<ToyStage>(c * P + rank, P * V, M));
  }
  Tensor forward_step(int c, int mb, const Tensor& in) override {
    trace.push_back({'F', c});
    return chunks[c]->forward_step(mb, in);
  }
  Tensor backward_step(int c, int mb, const Tensor& g) override {
    trace.push_back({'B', c});
    return chunks[c]->backward_step(mb, g);
  }
};

TEST(DistPipeline, InterleavedMatchesSequentialRun) {
  SKIP_UNLESS_MULTI_RANK();
  auto world = testing::dist_world();
  const int P = world->size(), r = world->rank();
  pipeline_parallel::InterleavedPipeline pipe(world, {kRows, kH}, DType::kFloat32);
  struct Case { int V, M, G; };
  for (Case cs : {Case{2, P, 0}, Case{2, 2 * P, 0}, Case{3, 2 * P, 0}, Case{2, 2 * P + P, 2 * P}}) {
    const int V = cs.V, M = cs.M, S = P * V;
    std::vector<std::unique_ptr<ToyStage>> ref;
    for (int s = 0; s < S; ++s) ref.push_back(std::make_unique<ToyStage>(s, S, M));
    std::vector<float> ref_losses;
    for (int mb = 0; mb < M; ++mb) {
      Tensor x;
      for (int s = 0; s < S; ++s) x = ref[s]->forward_step(mb, x);
      ref_losses.push_back(float(x.item()));
      Tensor g;
      for (int s = S - 1; s >= 0; --s) g = ref[s]->backward_step(mb, g);
    }
    VirtualToy mine(r, P, V, M);
    auto losses = pipe.run(mine, M, V, cs.G);
    const int G = cs.G ? cs.G : P;
    if (r == P - 1) {
      // Losses arrive in schedule-table order of the last chunk = micro-batch order.
      ASSERT_EQ(int(losses.size()), M);
      for (int mb = 0; mb < M; ++mb) EXPECT_NEAR(losses[mb].item(), ref_losses[mb], 1e-6 * std::fabs(ref_losses[mb]) + 1e-7);
    }
    for (int c = 0; c < V; ++c) {
      const auto& got = mine.chunks[c]->dw;
      const auto& want = ref[c * P + r]->dw;
      float mx = 0, err = 0;
      for (int k = 0; k < kH * kH; ++k) mx = std::max(mx, std::fabs(want[k])), err = std::max(err, std::fabs(got[k] - want[k]));
      EXPECT_LE(err, 1e-6 * mx) << "dW of chunk " << c << " (model stage " << c * P + r << "), V=" << V << " M=" << M;
    }
    // Megatron's warm-up: (P - r - 1)*2 + (V - 1)*G forwards (capped at M*V) before the first backward.
    const int warmup = std::min((P - r - 1) * 2 + (V - 1) * G, M * V);
    for (int i = 0; i < warmup; ++i) EXPECT_EQ(mine.trace[i].first, 'F') << i;
    if (warmup < M * V) EXPECT_EQ(mine.trace[warmup + 1].first, 'B');
    EXPECT_EQ(int(mine.trace.size()), 2 * M * V);
  }
}

TEST(PipelineSchedule, ScheduleTableFollowsMegatron) {
  // get_schedule_table(M=5, V=2, G=2) written out from Megatron's definition: groups of G
  // starting at 0, 2, 4; the group whose end reaches M ([4]) takes what is left; each group goes
  // through chunk 0 then chunk 1.
  using P = std::pair<int, int>;
  EXPECT_EQ(pipeline_parallel::get_schedule_table(5, 2, 2),
            (std::vector<P>{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {3, 0}, {2, 1}, {3, 1}, {4, 0}, {4, 1}}));
  EXPECT_EQ(pipeline_parallel::get_schedule_table(4, 2, 4),
            (std::vector<P>{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1}}));
}

}  // namespace
}  // namespace megatron
