// Context parallelism building blocks (megatron/core/transformer/context_parallel.h):
//  * the log-sum-exp merge op against hand-computed values;
//  * get_batch_on_this_cp_rank / cp_rank_global_positions against Megatron's layout written out
//    by hand (rank r keeps chunks r and 2*CP-1-r of 2*CP);
//  * ring attention (and the a2a variant for CP 1, 2), forward and backward, for CP = 1, 2, 3, 4, 6 in-process (one thread per CP
//    rank, a point-to-point mailbox group), against plain full-sequence attention computed by
//    PyTorch (tests/reference/model/gen_cp_fixtures.py): causal, and Megatron's
//    --reset-attention-mask document mask; GQA (4 heads, 2 K/V groups).
// Tolerance 1e-5 relative to the largest magnitude (the project's CPU-vs-reference bound): fp32
// kernels against an fp64 reference; the ring only changes the order of fp32 sums.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>

#include "test_utils/fixture_util.h"
#include "megatron/core/transformer/context_parallel.h"
#include "megatron/core/utils/errors.h"

namespace megatron {
namespace {

using testing::Fixture;
using testing::max_rel_error;

// ---------------------------------------------------------------------------------------------
// An in-process group of threads with point-to-point messages (MPI semantics: a receive is
// matched, in posting order, with the sender's messages to this rank in sending order).
// ---------------------------------------------------------------------------------------------
struct Mailbox {
  explicit Mailbox(int n) : ch(n, std::vector<std::vector<std::vector<char>>>(n)) {}
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<std::vector<std::vector<char>>>> ch;  // [src][dst] -> messages
};

class DoneWork final : public comm::Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

class RecvWork final : public comm::Work {
 public:
  RecvWork(Mailbox& mb, int src, int dst, size_t ticket, Tensor t)
      : mb_(mb), src_(src), dst_(dst), ticket_(ticket), t_(std::move(t)) {}
  void wait() override {
    if (done_) return;
    std::unique_lock<std::mutex> l(mb_.mu);
    mb_.cv.wait(l, [&] { return mb_.ch[src_][dst_].size() > ticket_; });
    const auto& m = mb_.ch[src_][dst_][ticket_];
    MEGATRON_CHECK(m.size() == t_.nbytes()) << "message of " << m.size() << " bytes for " << t_.str();
    std::memcpy(t_.data_ptr(), m.data(), m.size());
    done_ = true;
  }
  bool is_completed() override { return done_; }

 private:
  Mailbox& mb_;
  int src_, dst_;
  size_t ticket_;
  Tensor t_;
  bool done_ = false;
};

class ThreadP2PGroup final : public comm::ProcessGroup {
 public:
  ThreadP2PGroup(std::shared_ptr<Mailbox> mb, int rank, int size)
      : mb_(std::move(mb)), rank_(rank), size_(size), recvs_(size, 0) {
    for (int i = 0; i < size; ++i) ranks_.push_back(i);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& ranks() const override { return ranks_; }
  std::unique_ptr<comm::Work> send(const Tensor& t, int peer, bool) override {
    MEGATRON_CHECK(peer != rank_ && peer >= 0 && peer < size_) << "peer " << peer;
    const char* p = static_cast<const char*>(t.data_ptr());
    {
      std::lock_guard<std::mutex> l(mb_->mu);
      mb_->ch[rank_][peer].emplace_back(p, p + t.nbytes());
    }
    mb_->cv.notify_all();
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<comm::Work> recv(Tensor& t, int peer, bool async) override {
    MEGATRON_CHECK(peer != rank_ && peer >= 0 && peer < size_) << "peer " << peer;
    auto w = std::make_unique<RecvWork>(*mb_, peer, rank_, recvs_[peer]++, t);
    if (!async) w->wait();
    return w;
  }
  std::unique_ptr<comm::Work> all_reduce(Tensor&, comm::ReduceOp, bool) override { unused(); }
  std::unique_ptr<comm::Work> all_gather(const Tensor&, Tensor&, bool) override { unused(); }
  std::unique_ptr<comm::Work> reduce_scatter(const Tensor&, Tensor&, comm::ReduceOp, bool) override {
    unused();
  }
  std::unique_ptr<comm::Work> broadcast(Tensor&, int, bool) override { unused(); }
  void barrier() override { unused(); }

 private:
  [[noreturn]] static void unused() { MEGATRON_CHECK(false) << "collective not used by ring attention"; }
  std::shared_ptr<Mailbox> mb_;
  int rank_, size_;
  std::vector<int> ranks_;
  std::vector<size_t> recvs_;
};

/// Runs fn(rank, group) on n threads; returns the first failure message (empty = none).
std::string run_ring_ranks(int n, const std::function<void(int, comm::ProcessGroup&)>& fn) {
  auto mb = std::make_shared<Mailbox>(n);
  std::vector<std::string> err(n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      ThreadP2PGroup g(mb, r, n);
      try {
        fn(r, g);
      } catch (const std::exception& e) {
        err[r] = "rank " + std::to_string(r) + ": " + e.what();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : err)
    if (!e.empty()) return e;
  return {};
}

// ---------------------------------------------------------------------------------------------

TEST(ContextParallel, AttentionMergeMatchesHandComputation) {
  // One row (s=b=np=1, d=2): partial A has lse log(1), out (1, 2); partial B has lse log(3),
  // out (5, -2). Union: lse log(4), out = 1/4 (1, 2) + 3/4 (5, -2) = (4, -1).
  Tensor acc = Tensor::from_vector({1.f, 2.f}, {1, 1, 1, 2});
  Tensor acc_lse = Tensor::from_vector({0.f}, {1, 1, 1});
  Tensor part = Tensor::from_vector({5.f, -2.f}, {1, 1, 1, 2});
  Tensor part_lse = Tensor::from_vector({std::log(3.f)}, {1, 1, 1});
  ops::attention_merge_(acc, acc_lse, part, part_lse);
  EXPECT_NEAR(acc.item_at(0), 4.0, 1e-6);
  EXPECT_NEAR(acc.item_at(1), -1.0, 1e-6);
  EXPECT_NEAR(acc_lse.item(), std::log(4.0), 1e-6);
  // A fresh accumulator (0, -inf) takes the partial as is; two -inf rows stay (0, -inf).
  const float ninf = -std::numeric_limits<float>::infinity();
  Tensor a2 = Tensor::zeros({2, 1, 1, 2}, DType::kFloat32);
  Tensor l2 = Tensor::from_vector({ninf, ninf}, {1, 1, 2});
  Tensor p2 = Tensor::from_vector({7.f, 8.f, 9.f, 10.f}, {2, 1, 1, 2});
  Tensor pl2 = Tensor::from_vector({1.5f, ninf}, {1, 1, 2});
  ops::attention_merge_(a2, l2, p2, pl2);
  EXPECT_EQ(a2.to_float_vector(), (std::vector<float>{7.f, 8.f, 0.f, 0.f}));
  EXPECT_FLOAT_EQ(l2.item_at(0), 1.5f);
  EXPECT_EQ(l2.item_at(1), -std::numeric_limits<double>::infinity());
}

TEST(ContextParallel, GetBatchKeepsChunksRAndMirror) {
  // s = 8, CP = 2: chunks of 2; rank 0 keeps chunks 0 and 3 = positions {0,1,6,7}, rank 1 keeps
  // chunks 1 and 2 = {2,3,4,5} (Megatron's get_batch_on_this_cp_rank).
  const int64_t b = 2, s = 8;
  std::vector<int64_t> tok(b * s), pos(b * s);
  std::vector<float> lm(b * s);
  for (int64_t i = 0; i < b * s; ++i) tok[i] = 100 * (i / s) + i % s, pos[i] = 50 + i % s, lm[i] = float(i);
  datasets::GPTBatch batch;
  batch.tokens = Tensor::from_vector_i64(tok, {b, s});
  batch.labels = Tensor::from_vector_i64(tok, {b, s});
  batch.loss_mask = Tensor::from_vector(lm, {b, s});
  batch.position_ids = Tensor::from_vector_i64(pos, {b, s});
  Tensor mask = Tensor::empty({b, 1, s, s}, DType::kUInt8);
  for (int64_t i = 0; i < mask.numel(); ++i) mask.data<uint8_t>()[i] = static_cast<uint8_t>(i % 251);
  batch.attention_mask = mask;
  const std::vector<std::vector<int64_t>> keep = {{0, 1, 6, 7}, {2, 3, 4, 5}};
  for (int r = 0; r < 2; ++r) {
    const auto out = transformer::get_batch_on_this_cp_rank(batch, 2, r);
    ASSERT_EQ(out.tokens.shape(), (Shape{b, 4}));
    ASSERT_EQ(out.attention_mask.shape(), (Shape{b, 1, 4, s}));
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t j = 0; j < 4; ++j) {
        const int64_t g = keep[r][j];
        EXPECT_EQ(out.tokens.data<int64_t>()[bi * 4 + j], 100 * bi + g);
        EXPECT_EQ(out.labels.data<int64_t>()[bi * 4 + j], 100 * bi + g);
        EXPECT_EQ(out.position_ids.data<int64_t>()[bi * 4 + j], 50 + g);
        EXPECT_EQ(out.loss_mask.data<float>()[bi * 4 + j], float(bi * s + g));
        for (int64_t col = 0; col < s; ++col)
          EXPECT_EQ(out.attention_mask.data<uint8_t>()[(bi * 4 + j) * s + col], ((bi * s + g) * s + col) % 251);
      }
  }
  // CP = 4, s = 16: rank 1 keeps chunks 1 and 6 = {2, 3, 12, 13}; positions default to 0..s-1.
  datasets::GPTBatch b16;
  std::vector<int64_t> t16(16);
  for (int i = 0; i < 16; ++i) t16[i] = i;
  b16.tokens = Tensor::from_vector_i64(t16, {1, 16});
  const auto o16 = transformer::get_batch_on_this_cp_rank(b16, 4, 1);
  EXPECT_EQ(o16.position_ids.to_float_vector(), (std::vector<float>{2, 3, 12, 13}));
  EXPECT_EQ(o16.tokens.to_float_vector(), (std::vector<float>{2, 3, 12, 13}));
  // Sequence-first global positions for RoPE: [s_local, b].
  Tensor gp = transformer::cp_rank_global_positions(4, 2, 4, 1, Device::cpu());
  EXPECT_EQ(gp.shape(), (Shape{4, 2}));
  EXPECT_EQ(gp.to_float_vector(), (std::vector<float>{2, 2, 3, 3, 12, 12, 13, 13}));
  // s not a multiple of 2*CP: a UserError naming --seq-length.
  datasets::GPTBatch bad;
  bad.tokens = Tensor::from_vector_i64(std::vector<int64_t>(6, 0), {1, 6});
  try {
    transformer::get_batch_on_this_cp_rank(bad, 2, 0);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--seq-length"), std::string::npos) << e.what();
  }
}

/// Rows of a sequence-first tensor [s, ...] that CP rank r holds: chunks r and 2cp-1-r.
Tensor rank_rows(const Tensor& t, int cp, int r) {
  const int64_t s = t.size(0), c = s / (2 * cp);
  Shape sh = t.shape();
  sh[0] = 2 * c;
  Tensor out = Tensor::empty(sh, t.dtype());
  Tensor a = out.narrow0(0, c), b = out.narrow0(c, c);
  a.copy_(t.narrow0(r * c, c));
  b.copy_(t.narrow0((2 * cp - 1 - r) * c, c));
  return out;
}

void check_ring(const std::string& name, int cp, const std::string& comm = "p2p") {
  Fixture fx("cp_attention");
  auto get = [&](const std::string& k) { return fx.get(name + "/" + k); };
  const Tensor q = get("q"), k = get("k"), v = get("v"), mask64 = get("mask"), out_ref = get("out"),
               lse_ref = get("lse"), dout = get("dout"), dq_ref = get("dq"), dk_ref = get("dk"), dv_ref = get("dv");
  const bool use_mask = name == "cp_attention_reset";
  const int64_t s = q.size(0), b = q.size(1), np = q.size(2), c = s / (2 * cp);
  std::vector<std::string> report(cp);
  const std::string err = run_ring_ranks(cp, [&](int r, comm::ProcessGroup& g) {
    Tensor ql = rank_rows(q, cp, r), kl = rank_rows(k, cp, r), vl = rank_rows(v, cp, r);
    ops::AttentionParams p;
    p.softmax_scale = 1.0f / std::sqrt(8.0f);
    p.causal = true;
    Tensor mask;
    if (use_mask) {  // the query rows of this rank over all s keys: [b, 1, 2c, s]
      mask = Tensor::empty({b, 1, 2 * c, s}, DType::kUInt8);
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t i = 0; i < 2 * c; ++i) {
          const int64_t gi = i < c ? r * c + i : (2 * cp - 1 - r) * c + (i - c);
          for (int64_t j = 0; j < s; ++j)
            mask.data<uint8_t>()[(bi * 2 * c + i) * s + j] = mask64.data<int64_t>()[(bi * s + gi) * s + j] != 0;
        }
      p.attention_mask = &mask;
    }
    Tensor out = Tensor::empty(ql.shape(), DType::kFloat32);
    transformer::ContextParallelAttnCtx ctx;
    transformer::context_parallel_attention_forward(ql, kl, vl, p, g, comm, out, ctx);
    std::ostringstream os;
    os << "rank " << r << ": out " << max_rel_error(out, rank_rows(out_ref, cp, r));
    double lse_err = 0, lse_max = 1;
    for (int a = 0; a < 2 && comm == "p2p"; ++a) {
      const int64_t gc = a == 0 ? r : 2 * cp - 1 - r;
      for (int64_t bh = 0; bh < b * np; ++bh)
        for (int64_t i = 0; i < c; ++i) {
          const double want = lse_ref.data<float>()[bh * s + gc * c + i];
          lse_err = std::max(lse_err, std::fabs(ctx.lse[a].data<float>()[bh * c + i] - want));
          lse_max = std::max(lse_max, std::fabs(want));
        }
    }
    os << " lse " << lse_err / lse_max;
    Tensor dq = Tensor::empty(ql.shape(), DType::kFloat32), dk = Tensor::empty(kl.shape(), DType::kFloat32),
           dv = Tensor::empty(vl.shape(), DType::kFloat32);
    transformer::context_parallel_attention_backward(rank_rows(dout, cp, r), ql, kl, vl, out, p, g, comm, ctx, dq, dk,
                                                     dv);
    os << " dq " << max_rel_error(dq, rank_rows(dq_ref, cp, r)) << " dk " << max_rel_error(dk, rank_rows(dk_ref, cp, r))
       << " dv " << max_rel_error(dv, rank_rows(dv_ref, cp, r));
    report[r] = os.str();
  });
  ASSERT_TRUE(err.empty()) << err;
  for (int r = 0; r < cp; ++r) {
    // Every number after a name is a relative error; all must be <= 1e-5.
    std::istringstream is(report[r]);
    std::string word;
    is >> word >> word;  // "rank" "<r>:"
    std::string what;
    double e = 0;
    while (is >> what >> e) EXPECT_LE(e, 1e-5) << name << " CP" << cp << " " << report[r];
  }
}

TEST(ContextParallel, RingAttentionCausalMatchesPyTorch) {
  for (int cp : {1, 2, 3, 4, 6}) check_ring("cp_attention_causal", cp);
}

TEST(ContextParallel, RingAttentionResetMaskMatchesPyTorch) {
  for (int cp : {1, 2, 3}) check_ring("cp_attention_reset", cp);
}

TEST(ContextParallel, AllToAllAttentionCausalMatchesPyTorch) {
  // a2a splits the 4 heads / 2 K/V groups of the fixture over CP: CP 1 and 2.
  for (int cp : {1, 2}) check_ring("cp_attention_causal", cp, "a2a");
}

TEST(ContextParallel, UnsupportedCommTypesAreUserErrors) {
  Tensor q = Tensor::zeros({4, 1, 2, 8}, DType::kFloat32), k = Tensor::zeros({4, 1, 1, 8}, DType::kFloat32);
  Tensor out = Tensor::empty(q.shape(), DType::kFloat32);
  transformer::ContextParallelAttnCtx ctx;
  ops::AttentionParams p;
  auto g = comm::make_single_rank_group();
  try {
    transformer::context_parallel_attention_forward(q, k, k, p, *g, "allgather", out, ctx);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--cp-comm-type"), std::string::npos) << e.what();
  }
  // a2a with a mask: UserError naming the flag.
  Tensor mask = Tensor::zeros({1, 1, 4, 4}, DType::kUInt8);
  p.attention_mask = &mask;
  try {
    transformer::context_parallel_attention_forward(q, k, k, p, *g, "a2a", out, ctx);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--cp-comm-type a2a"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron
