// NCCL backend collectives on CUDA tensors. Run by tests/gpu/run_nccl_tests.sh on a 2-GPU machine
// (megatron_launch --nproc-per-node 2 with MEGATRON_TEST_DIST_BACKEND=nccl); skipped elsewhere.
// Expected values are closed forms of the ranks; inputs are small integers, exact in every dtype
// used, so comparisons are exact.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "test_utils/dist_test_util.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/tensor/memory_stats.h"

using megatron::Device;
using megatron::DType;
using megatron::Tensor;
using megatron::comm::P2POp;
using megatron::comm::ReduceOp;
using megatron::testing::dist_world;

namespace {
bool nccl_world() {
  const char* b = std::getenv("MEGATRON_TEST_DIST_BACKEND");
  return b && std::string(b) == "nccl" && megatron::backend_available(megatron::DeviceType::kCUDA);
}
Device dev() {
  const char* lr = std::getenv("LOCAL_RANK");
  return Device::cuda(lr ? std::atoi(lr) : 0);
}
Tensor cuda_vec(const std::vector<float>& v, DType dt = DType::kFloat32) {
  return Tensor::from_vector(v, {int64_t(v.size())}).to(dt).to(dev());
}
std::vector<float> host(const Tensor& t) { return t.to_float_vector(); }
}  // namespace

#define SKIP_UNLESS_NCCL()                                                                  \
  do {                                                                                      \
    if (!nccl_world()) GTEST_SKIP() << "needs MEGATRON_TEST_DIST_BACKEND=nccl and GPUs";    \
    SKIP_UNLESS_MULTI_RANK();                                                               \
  } while (0)

TEST(DistNccl, AllReduceDtypesAndOps) {
  SKIP_UNLESS_NCCL();
  auto w = dist_world();
  ASSERT_STREQ(w->backend_name(), "nccl");
  const int n = w->size(), r = w->rank();
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Tensor t = cuda_vec({float(r + 1), float(2 * (r + 1)), 3.f}, dt);
    w->all_reduce(t);
    auto h = host(t);
    EXPECT_EQ(h[0], float(n * (n + 1) / 2)) << megatron::dtype_name(dt);
    EXPECT_EQ(h[1], float(n * (n + 1)));
    EXPECT_EQ(h[2], float(3 * n));
  }
  Tensor m = cuda_vec({float(r), float(-r)});
  w->all_reduce(m, ReduceOp::kMax);
  EXPECT_EQ(host(m)[0], float(n - 1));
  EXPECT_EQ(host(m)[1], 0.f);
  Tensor a = cuda_vec({float(2 * r)});
  w->all_reduce(a, ReduceOp::kAvg);
  EXPECT_EQ(host(a)[0], float(n - 1));
  Tensor i = Tensor::from_vector_i64({(int64_t(1) << 53) + 1}, {1}).to(dev());
  w->all_reduce(i);
  EXPECT_EQ(i.to(Device::cpu()).data<int64_t>()[0], ((int64_t(1) << 53) + 1) * n);
}

TEST(DistNccl, AllGatherReduceScatterBroadcast) {
  SKIP_UNLESS_NCCL();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  Tensor in = cuda_vec({float(10 * r), float(10 * r + 1)}, DType::kBFloat16);
  Tensor out = Tensor::zeros({2 * n}, DType::kBFloat16, dev());
  w->all_gather(in, out);
  auto g = host(out);
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(g[2 * q], float(10 * q));
    EXPECT_EQ(g[2 * q + 1], float(10 * q + 1));
  }
  std::vector<float> v(2 * n);
  for (int j = 0; j < 2 * n; ++j) v[j] = float((r + 1) * j);
  Tensor rs_in = cuda_vec(v);
  Tensor rs_out = Tensor::zeros({2}, DType::kFloat32, dev());
  w->reduce_scatter(rs_in, rs_out);
  auto h = host(rs_out);
  EXPECT_EQ(h[0], float(2 * r * n * (n + 1) / 2));
  EXPECT_EQ(h[1], float((2 * r + 1) * n * (n + 1) / 2));
  Tensor b = cuda_vec({float(r + 5)});
  w->broadcast(b, n - 1);
  EXPECT_EQ(host(b)[0], float(n - 1 + 5));
}

TEST(DistNccl, BatchIsendIrecvRingAndAsync) {
  SKIP_UNLESS_NCCL();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  const int64_t N = 1 << 22;
  Tensor s = Tensor::from_vector(std::vector<float>(N, float(r)), {N}).to(dev());
  Tensor q = Tensor::zeros({N}, DType::kFloat32, dev());
  auto work = w->batch_isend_irecv({P2POp{P2POp::kSend, &s, (r + 1) % n}, P2POp{P2POp::kRecv, &q, (r - 1 + n) % n}});
  work->wait();
  EXPECT_EQ(host(q)[N - 1], float((r - 1 + n) % n));
  std::vector<Tensor> ts;
  std::vector<std::unique_ptr<megatron::comm::Work>> ws;
  for (int k = 0; k < 3; ++k) {
    ts.push_back(cuda_vec(std::vector<float>(1000, float(k + 1))));
    ws.push_back(w->all_reduce(ts.back(), ReduceOp::kSum, true));
  }
  for (int k = 2; k >= 0; --k) ws[k]->wait();
  for (int k = 0; k < 3; ++k) EXPECT_EQ(host(ts[k])[999], float((k + 1) * n));
  w->barrier();
}

TEST(DistNccl, SplitIntoParallelStateGroups) {
  SKIP_UNLESS_NCCL();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  namespace ps = megatron::parallel_state;
  ps::ParallelConfig c;
  c.tensor_model_parallel_size = n;  // TP over all ranks, DP 1
  ps::initialize_model_parallel(w, c);
  auto tp = ps::get_tensor_model_parallel_group();
  ASSERT_EQ(tp->size(), n);
  Tensor t = cuda_vec({float(r)});
  tp->all_reduce(t);
  EXPECT_EQ(host(t)[0], float(n * (n - 1) / 2));
  EXPECT_EQ(ps::get_data_parallel_world_size(), 1);
  ps::destroy_model_parallel();
}

// The training loop's host scalars (loss sums, grad-norm partial sums, token counts) are CPU
// tensors; the NCCL group stages them through the GPU. Expected values: closed forms of the ranks.
TEST(DistNccl, HostTensorsAreStagedThroughTheGpu) {
  SKIP_UNLESS_NCCL();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  Tensor d = Tensor::empty({2}, DType::kFloat64);
  d.data<double>()[0] = 0.5 + r;
  d.data<double>()[1] = 1e15 * (r + 1);  // beyond fp32 precision: must stay fp64
  auto work = w->all_reduce(d, ReduceOp::kSum, /*async=*/true);
  EXPECT_TRUE(work->is_completed());  // staged operations finish before returning
  EXPECT_EQ(d.data<double>()[0], 0.5 * n + n * (n - 1) / 2.0);
  EXPECT_EQ(d.data<double>()[1], 1e15 * n * (n + 1) / 2.0);
  Tensor m = Tensor::from_vector({float(r)}, {1});
  w->all_reduce(m, ReduceOp::kMax);
  EXPECT_EQ(m.data<float>()[0], float(n - 1));
  Tensor b = Tensor::from_vector({float(10 + r)}, {1});
  w->broadcast(b, 0);
  EXPECT_EQ(b.data<float>()[0], 10.f);
  Tensor in = Tensor::from_vector({float(r)}, {1});
  Tensor out = Tensor::zeros({n}, DType::kFloat32);
  w->all_gather(in, out);
  for (int q = 0; q < n; ++q) EXPECT_EQ(out.data<float>()[q], float(q));
}

// A split into one-rank groups needs no communicator: every rank gets its own single-rank group.
TEST(DistNccl, SplitIntoSingletonsNeedsNoCommunicator) {
  SKIP_UNLESS_NCCL();
  auto w = dist_world();
  std::vector<std::vector<int>> groups;
  for (int q = 0; q < w->size(); ++q) groups.push_back({q});
  auto g = w->split(groups);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->size(), 1);
  EXPECT_STREQ(g->backend_name(), "single");
  EXPECT_EQ(g->ranks(), std::vector<int>{w->rank()});
}

TEST(DistNcclFailure, HungRankEndsTheJob) {
  const char* mode = std::getenv("MEGATRON_TEST_DIST_FAILURE");
  if (!mode) GTEST_SKIP() << "set MEGATRON_TEST_DIST_FAILURE=hang";
  SKIP_UNLESS_NCCL();
  auto w = dist_world();
  w->barrier();
  if (w->rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(600));
  Tensor t = cuda_vec({1.f});
  w->all_reduce(t);
  host(t);  // blocks on the stream until the watchdog ends the job
  FAIL() << "all_reduce completed although rank 1 never joined";
}

// The tensors of a collective are not kept alive behind the caller's back: once a synchronous
// operation returned (or an async one was waited for), dropping the caller's references frees the
// memory at once (stream-ordered). The old backend handed every operation's tensors to the
// watchdog, polled once a second, so TP + sequence parallelism accumulated a second's worth of
// gathered activations (LLaMA-3-8B TP2 out of memory on an H200). Expected: the tensor
// allocator's live bytes (megatron::memory_stats) return exactly to the value before.
TEST(DistNccl, CollectiveTensorsAreReleasedWhenTheCallerDropsThem) {
  SKIP_UNLESS_NCCL();
  auto w = dist_world();
  const int n = w->size();
  const int64_t elems = 8 << 20;  // 16 MiB of bf16 per rank
  const int64_t before = megatron::memory_stats(megatron::DeviceType::kCUDA).allocated;
  {
    Tensor in = Tensor::zeros({elems}, DType::kBFloat16, dev());
    Tensor out = Tensor::empty({elems * n}, DType::kBFloat16, dev());
    w->all_gather(in, out);
    Tensor rs = Tensor::empty({elems / n}, DType::kBFloat16, dev());
    w->reduce_scatter(in, rs);
    w->all_reduce(in);
  }
  EXPECT_EQ(megatron::memory_stats(megatron::DeviceType::kCUDA).allocated, before)
      << "synchronous collectives kept their tensors alive after the caller dropped them";
  {
    Tensor in = Tensor::zeros({elems}, DType::kBFloat16, dev());
    auto work = w->all_reduce(in, ReduceOp::kSum, /*async=*/true);
    work->wait();
  }
  EXPECT_EQ(megatron::memory_stats(megatron::DeviceType::kCUDA).allocated, before)
      << "a waited-for async collective kept its tensor alive";
  {
    // Dropped without wait(): kept until completion, then released by the watchdog.
    Tensor in = Tensor::zeros({elems}, DType::kBFloat16, dev());
    auto work = w->all_reduce(in, ReduceOp::kSum, /*async=*/true);
    in = Tensor();
    work.reset();
  }
  for (int i = 0; i < 100 && megatron::memory_stats(megatron::DeviceType::kCUDA).allocated != before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(megatron::memory_stats(megatron::DeviceType::kCUDA).allocated, before)
      << "an async collective dropped without wait() was never released";
  w->barrier();
}
