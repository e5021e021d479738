// Collectives of the world ProcessGroup, run by tests/functional_tests/dist_*.sh under
// `mpirun -np N` (MPI backend) and `megatron_launch --nproc-per-node N` (TCP backend); skipped
// when the binary runs as a single process. Every expected value is a closed-form expression of
// the ranks (hand-computed formulas below). Float comparisons are exact: each input is a small
// integer (or a value chosen to be exactly representable) so every partial sum is exact in fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "test_utils/dist_test_util.h"
#include "megatron/core/comm/process_group.h"
#include "megatron/core/parallel_state.h"

using megatron::DType;
using megatron::Tensor;
using megatron::comm::ReduceOp;
using megatron::testing::dist_world;

namespace {
Tensor iota(int64_t n, float start, float step) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return Tensor::from_vector(v, {n});
}
}  // namespace

TEST(DistCollectives, AllReduceSumMaxMinAvgFloat32) {
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  const int64_t N = 1000;  // not divisible by 3 or 4: uneven ring chunks
  // rank r holds (r+1)*(i+1): sum = (i+1)*n(n+1)/2, max = n(i+1), min = i+1, avg = (i+1)(n+1)/2.
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg}) {
    Tensor t = iota(N, float(r + 1), float(r + 1));
    w->all_reduce(t, op);
    for (int64_t i = 0; i < N; ++i) {
      double base = double(i + 1);
      double expect = op == ReduceOp::kSum   ? base * n * (n + 1) / 2
                      : op == ReduceOp::kMax ? base * n
                      : op == ReduceOp::kMin ? base
                                             : base * (n + 1) / 2.0;
      ASSERT_EQ(t.item_at(i), float(expect)) << "op " << int(op) << " i " << i;
    }
  }
}

TEST(DistCollectives, AllReduceBf16SumsInFp32AndRoundsOnce) {
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  const int n = w->size();
  // rank 0 contributes 256, the others 1. The fp32 sum 255+n rounded once to bf16 (8-bit
  // significand, spacing 2 in [256, 512), ties to even): n=2: 257 -> 256, n=3: 258, n=4: 259 -> 260,
  // n=5: 260, n=6: 261 -> 260, n=8: 263 -> 264. Adding in bf16 step by step would stay at 256.
  const float expected[] = {0, 0, 256, 258, 260, 260, 260, 262, 264};
  ASSERT_LE(n, 8);
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    Tensor t = Tensor::from_vector(std::vector<float>(7, w->rank() == 0 ? 256.f : 1.f), {7}).to(dt);
    w->all_reduce(t, ReduceOp::kSum);
    // fp16 (11-bit significand) represents 255+n exactly.
    float e = dt == DType::kBFloat16 ? expected[n] : float(255 + n);
    for (float v : t.to_float_vector()) ASSERT_EQ(v, e) << megatron::dtype_name(dt) << " n=" << n;
  }
}

TEST(DistCollectives, AllReduceInt64IsExact) {
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  const int64_t big = (int64_t(1) << 53) + 1;  // not representable in double
  Tensor t = Tensor::from_vector_i64({big, int64_t(r), -int64_t(r) * 3}, {3});
  w->all_reduce(t);
  const int64_t* p = t.data<int64_t>();
  EXPECT_EQ(p[0], big * n);
  EXPECT_EQ(p[1], int64_t(n) * (n - 1) / 2);
  EXPECT_EQ(p[2], -3 * int64_t(n) * (n - 1) / 2);
  Tensor m = Tensor::from_vector_i64({int64_t(r) * 10}, {1});
  w->all_reduce(m, ReduceOp::kMax);
  EXPECT_EQ(m.data<int64_t>()[0], 10 * (n - 1));
}

TEST(DistCollectives, AllGatherAndInPlaceAllGather) {
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  const int64_t m = 5;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    Tensor in = iota(m, float(10 * r), 1.f);  // < 256: exact in bf16
    if (dt == DType::kInt64) {
      std::vector<int64_t> v(m);
      for (int64_t i = 0; i < m; ++i) v[i] = 10 * r + i;
      in = Tensor::from_vector_i64(v, {m});
    } else {
      in = in.to(dt);
    }
    Tensor out = Tensor::zeros({n * m}, dt);
    w->all_gather(in, out);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < m; ++i) ASSERT_EQ(out.item_at(q * m + i), 10 * q + i) << q << " " << i;
  }
  // In place: the input is this rank's own slot of the output (the distributed optimizer's case).
  Tensor buf = Tensor::zeros({n * m}, DType::kFloat32);
  Tensor mine = buf.flat_slice(r * m, {m});
  mine.copy_(iota(m, float(7 * r), 1.f));
  w->all_gather(mine, buf);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < m; ++i) ASSERT_EQ(buf.item_at(q * m + i), 7 * q + i);
}

TEST(DistCollectives, ReduceScatterFloat32Bf16AndInPlace) {
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  const int64_t m = 6;
  // in[j] = (r+1) * (j % 5)  ->  sum over ranks = (j % 5) * n(n+1)/2 <= 144: every input and
  // every partial sum is an integer <= 256, exact in bf16 and fp32; rank r receives
  // j in [r*m, (r+1)*m).
  const double tri = n * (n + 1) / 2.0;
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    std::vector<float> v(n * m);
    for (int64_t j = 0; j < n * m; ++j) v[j] = float((r + 1) * (j % 5));
    Tensor in = Tensor::from_vector(v, {n * m}).to(dt);
    Tensor out = Tensor::zeros({m}, dt);
    w->reduce_scatter(in, out);
    for (int64_t i = 0; i < m; ++i)
      ASSERT_EQ(out.item_at(i), float(((r * m + i) % 5) * tri)) << megatron::dtype_name(dt) << " i " << i;
  }
  // Output aliases this rank's slot of the input (DDP with the distributed optimizer).
  Tensor buf = iota(n * m, 0.f, float(r + 1));
  Tensor shard = buf.flat_slice(r * m, {m});
  w->reduce_scatter(buf, shard, ReduceOp::kAvg);
  for (int64_t i = 0; i < m; ++i) ASSERT_EQ(shard.item_at(i), float((r * m + i) * tri / n));
}

TEST(DistCollectives, BroadcastFromEveryRoot) {
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  for (int root = 0; root < w->size(); ++root) {
    Tensor t = iota(33, float(w->rank() * 1000), 1.f);
    w->broadcast(t, root);
    for (int64_t i = 0; i < 33; ++i) ASSERT_EQ(t.item_at(i), float(root * 1000 + i));
  }
}

TEST(DistCollectives, SendRecvRingLargeAsyncDoesNotDeadlock) {
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  const int64_t N = 1 << 20;  // 4 MiB: far beyond any eager/socket buffer
  Tensor out = Tensor::from_vector(std::vector<float>(N, float(r)), {N});
  Tensor in = Tensor::zeros({N}, DType::kFloat32);
  // Everyone posts its send first, then its receive.
  auto s = w->send(out, (r + 1) % n, /*async=*/true);
  auto q = w->recv(in, (r - 1 + n) % n, /*async=*/true);
  q->wait();
  s->wait();
  EXPECT_TRUE(q->is_completed());
  for (int64_t i = 0; i < N; i += 4099) ASSERT_EQ(in.item_at(i), float((r - 1 + n) % n));
}

TEST(DistCollectives, AsyncCollectivesCompleteInAnyWaitOrder) {
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  const int n = w->size();
  std::vector<Tensor> ts;
  std::vector<std::unique_ptr<megatron::comm::Work>> works;
  for (int k = 0; k < 4; ++k) {
    ts.push_back(Tensor::from_vector(std::vector<float>(100000, float(k + 1)), {100000}));
    works.push_back(w->all_reduce(ts.back(), ReduceOp::kSum, /*async=*/true));
  }
  for (int k = 3; k >= 0; --k) works[k]->wait();
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(works[k]->is_completed());
    EXPECT_EQ(ts[k].item_at(99999), float((k + 1) * n));
  }
  w->barrier();
}

TEST(DistCollectives, ParallelStateGroupsCommunicate) {
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  namespace ps = megatron::parallel_state;
  ps::ParallelConfig c;
  c.tensor_model_parallel_size = n % 2 == 0 ? 2 : 1;
  c.pipeline_model_parallel_size = n % 4 == 0 ? 2 : 1;
  ps::initialize_model_parallel(w, c);
  auto L = ps::compute_group_layout(c, n);
  for (const auto& name : ps::group_names()) {
    const std::vector<int>* members = L.group_of(name, r);
    megatron::parallel_state::GroupPtr g;
    if (name == "tp") g = ps::get_tensor_model_parallel_group();
    else if (name == "cp") g = ps::get_context_parallel_group();
    else if (name == "dp") g = ps::get_data_parallel_group();
    else if (name == "dp-cp") g = ps::get_data_parallel_group(true);
    else if (name == "pp") g = ps::get_pipeline_model_parallel_group();
    else if (name == "tp-pp") g = ps::get_model_parallel_group();
    else if (name == "tp-cp") g = ps::get_tensor_and_context_parallel_group();
    else if (name == "tp-dp") g = ps::get_tensor_and_data_parallel_group();
    else if (name == "tp-dp-cp") g = ps::get_tensor_and_data_parallel_group(true);
    else if (name == "embedding") g = ps::get_embedding_group();
    else g = ps::get_position_embedding_group();
    if (!members) {
      EXPECT_EQ(g, nullptr) << name;
      continue;
    }
    ASSERT_NE(g, nullptr) << name;
    EXPECT_EQ(g->ranks(), *members) << name;
    // Sum of the members' global ranks, computed through the group.
    Tensor t = Tensor::from_vector_i64({int64_t(r)}, {1});
    g->all_reduce(t);
    int64_t expect = 0;
    for (int m : *members) expect += m;
    EXPECT_EQ(t.data<int64_t>()[0], expect) << name;
  }
  auto co = ps::rank_coordinates(L, r);
  EXPECT_EQ(ps::get_tensor_model_parallel_rank(), co.tp);
  EXPECT_EQ(ps::get_pipeline_model_parallel_rank(), co.pp);
  EXPECT_EQ(ps::get_data_parallel_rank(), co.dp);
  ps::destroy_model_parallel();
  w->barrier();
}

// Failure modes, enabled by MEGATRON_TEST_DIST_FAILURE (the failure scripts check that the whole
// job ends with a non-zero status and a message, well within the timeout).
TEST(DistFailure, KilledOrHungRankEndsTheJob) {
  const char* mode = std::getenv("MEGATRON_TEST_DIST_FAILURE");
  if (!mode) GTEST_SKIP() << "set MEGATRON_TEST_DIST_FAILURE=kill|hang";
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  w->barrier();
  if (w->rank() == 1) {
    if (std::string(mode) == "kill") std::raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(600));  // "hang": never joins
  }
  Tensor t = Tensor::zeros({16}, DType::kFloat32);
  w->all_reduce(t);  // cannot complete
  FAIL() << "all_reduce completed although rank 1 is gone";
}

TEST(DistCollectives, BackendMatchesLauncher) {
  SKIP_UNLESS_MULTI_RANK();
  const char* expect = std::getenv("MEGATRON_TEST_EXPECT_BACKEND");
  if (!expect) GTEST_SKIP() << "MEGATRON_TEST_EXPECT_BACKEND not set";
  EXPECT_STREQ(dist_world()->backend_name(), expect);
}

TEST(DistCollectives, BatchIsendIrecvExchangeWithBothNeighbours) {
  SKIP_UNLESS_MULTI_RANK();
  auto w = dist_world();
  const int n = w->size(), r = w->rank();
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  const int64_t N = 300000;
  Tensor to_next = Tensor::from_vector(std::vector<float>(N, float(r)), {N});
  Tensor to_prev = Tensor::from_vector(std::vector<float>(N, float(100 + r)), {N});
  Tensor from_prev = Tensor::zeros({N}, DType::kFloat32), from_next = Tensor::zeros({N}, DType::kFloat32);
  using megatron::comm::P2POp;
  auto work = w->batch_isend_irecv({P2POp{P2POp::kSend, &to_next, next}, P2POp{P2POp::kSend, &to_prev, prev},
                                    P2POp{P2POp::kRecv, &from_prev, prev}, P2POp{P2POp::kRecv, &from_next, next}});
  work->wait();
  // With n == 2 next == prev: messages to one peer arrive in posting order.
  EXPECT_EQ(from_prev.item_at(N - 1), float(prev));
  EXPECT_EQ(from_next.item_at(0), float(100 + next));
}
