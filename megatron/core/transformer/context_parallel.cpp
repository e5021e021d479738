#include "megatron/core/transformer/context_parallel.h"

#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "megatron/core/utils/errors.h"

namespace megatron::transformer {

namespace {

/// Global chunk index of local half `half` (0 or 1) of CP rank `r`.
int64_t global_chunk(int r, int half, int cp) { return half == 0 ? r : 2 * cp - 1 - r; }

/// Copies, for every batch row bi, rows [row0, row0 + rows) of the per-batch [s, width] block of
/// `src` ([b, ..., s, width] flattened) into dst [b, ..., rows, width]. Device-agnostic (copy_).
void copy_rows(const Tensor& src, int64_t b, int64_t s, int64_t width, int64_t row0, int64_t rows, Tensor& dst,
               int64_t dst_rows, int64_t dst_row0) {
  for (int64_t bi = 0; bi < b; ++bi) {
    Tensor from = src.flat_slice((bi * s + row0) * width, {rows * width});
    Tensor to = dst.flat_slice((bi * dst_rows + dst_row0) * width, {rows * width});
    to.copy_(from);
  }
}

/// Sub-mask [b, 1, c, c] of mask [b, 1, 2c, S]: local query rows [qa*c, qa*c + c), global key
/// columns [gk*c, gk*c + c).
Tensor sub_mask(const Tensor& mask, int64_t b, int64_t c, int64_t S, int qa, int64_t gk) {
  Tensor out = Tensor::empty({b, 1, c, c}, mask.dtype(), mask.device());
  if (mask.is_cpu()) {
    const auto* m = static_cast<const uint8_t*>(mask.data_ptr());
    auto* o = static_cast<uint8_t*>(out.data_ptr());
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t i = 0; i < c; ++i)
        std::memcpy(o + (bi * c + i) * c, m + (bi * 2 * c + qa * c + i) * S + gk * c, static_cast<size_t>(c));
    return out;
  }
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < c; ++i) {
      Tensor to = out.flat_slice((bi * c + i) * c, {c});
      to.copy_(mask.flat_slice((bi * 2 * c + qa * c + i) * S + gk * c, {c}));
    }
  return out;
}

/// One attention call of a ring step: local query chunk qa against rows [k0*c, (k0+kn)*c) of
/// the K/V block held at this step, causal or full; gk = global chunk of the first key row.
struct Call {
  int qa;
  int64_t k0, kn;
  bool causal;
  int64_t gk;
};

/// The calls of the step at which this rank (r) holds the K/V block of rank src (file comment
/// of context_parallel.h). With an explicit mask every (query chunk, key chunk) pair is run
/// under its sub-mask.
std::vector<Call> plan(int r, int src, int cp, bool masked) {
  const int64_t g0 = global_chunk(src, 0, cp), g1 = global_chunk(src, 1, cp);
  if (masked) return {{0, 0, 1, false, g0}, {0, 1, 1, false, g1}, {1, 0, 1, false, g0}, {1, 1, 1, false, g1}};
  if (src == r) return {{0, 0, 1, true, g0}, {1, 0, 1, false, g0}, {1, 1, 1, true, g1}};
  if (src < r) return {{0, 0, 1, false, g0}, {1, 0, 1, false, g0}};
  return {{1, 0, 2, false, g0}};
}

/// Kernel parameters of one call: causal flag, sub-mask, and a dropout stream of its own.
ops::AttentionParams call_params(const ops::AttentionParams& p, const Call& call, int r, int cp, Tensor& mask_keep,
                                 int64_t b, int64_t c) {
  ops::AttentionParams pc = p;
  pc.causal = call.causal;
  pc.attention_mask = nullptr;
  if (p.attention_mask) {
    mask_keep = sub_mask(*p.attention_mask, b, c, 2 * c * cp, call.qa, call.gk);
    pc.attention_mask = &mask_keep;
  }
  if (p.dropout_p > 0.0f) {
    const uint64_t key = static_cast<uint64_t>(global_chunk(r, call.qa, cp) * 2 * cp + call.gk) + 1;
    pc.seed = p.seed + 0x9E3779B97F4A7C15ULL * key;
  }
  return pc;
}

struct Dims {
  int64_t c, b, np, ng, d;
};

Dims check(const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionParams& p,
           distributed::ProcessGroup& g, const std::string& comm_type) {
  if (comm_type != "p2p")
    user_error("--cp-comm-type ", comm_type, ": only p2p (ring exchange of K/V) is implemented; use --cp-comm-type p2p");
  MEGATRON_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() && q.size(0) == k.size(0) &&
                 q.size(1) == k.size(1) && q.size(3) == k.size(3) && q.size(2) % k.size(2) == 0 && q.size(0) % 2 == 0)
      << "context-parallel attention q " << q.str() << " k " << k.str() << " v " << v.str();
  MEGATRON_CHECK(p.causal) << "context-parallel attention is causal (the ring skips future blocks)";
  Dims dm{q.size(0) / 2, q.size(1), q.size(2), k.size(2), q.size(3)};
  if (p.attention_mask) {
    MEGATRON_CHECK(p.attention_mask->numel() == dm.b * 2 * dm.c * 2 * dm.c * g.size() &&
                   dtype_size(p.attention_mask->dtype()) == 1)
        << "context-parallel attention mask " << p.attention_mask->str() << " for q " << q.str() << " and CP "
        << g.size() << " (expected [b, 1, s_local, s_local * CP])";
  }
  return dm;
}

/// K and V stacked into one buffer [2 * 2c, b, ng, d] so that one message moves both.
Tensor pack_kv(const Tensor& k, const Tensor& v) {
  const int64_t n = k.size(0);
  Shape s = k.shape();
  s[0] = 2 * n;
  Tensor kv = Tensor::empty(s, k.dtype(), k.device());
  Tensor kp = kv.narrow0(0, n), vp = kv.narrow0(n, n);
  kp.copy_(k);
  vp.copy_(v);
  return kv;
}

/// Posts "send `out` to the next rank, receive `in` from the previous one" on the CP ring.
std::unique_ptr<distributed::Work> ring_exchange(distributed::ProcessGroup& g, Tensor& out, Tensor& in) {
  const int r = g.rank(), n = g.size();
  std::vector<distributed::P2POp> ops = {{distributed::P2POp::kSend, &out, (r + 1) % n},
                                         {distributed::P2POp::kRecv, &in, (r - 1 + n) % n}};
  return g.batch_isend_irecv(ops);
}

}  // namespace

datasets::GPTBatch get_batch_on_this_cp_rank(const datasets::GPTBatch& batch, int cp_size, int cp_rank) {
  if (cp_size <= 1) return batch;
  MEGATRON_CHECK(cp_rank >= 0 && cp_rank < cp_size) << "cp rank " << cp_rank << " of " << cp_size;
  MEGATRON_CHECK(batch.tokens.dim() == 2) << "tokens " << batch.tokens.str();
  const int64_t b = batch.tokens.size(0), s = batch.tokens.size(1);
  if (s % (2 * cp_size) != 0)
    user_error("--seq-length (", s, ") must be a multiple of 2 x --context-parallel-size (", cp_size, ")");
  const int64_t c = s / (2 * cp_size);
  const int64_t g0 = global_chunk(cp_rank, 0, cp_size), g1 = global_chunk(cp_rank, 1, cp_size);
  // [b, s] (or [b, 1, s, width]: rows are the query dim) -> the two kept chunks along s.
  auto slice = [&](const Tensor& t, int64_t width) -> Tensor {
    if (!t.defined()) return t;
    MEGATRON_CHECK(t.numel() == b * s * width) << "batch tensor " << t.str() << " for tokens " << batch.tokens.str();
    Shape shape = t.shape();
    shape[shape.size() == 2 ? 1 : 2] = 2 * c;
    Tensor out = Tensor::empty(shape, t.dtype(), t.device());
    copy_rows(t, b, s, width, g0 * c, c, out, 2 * c, 0);
    copy_rows(t, b, s, width, g1 * c, c, out, 2 * c, c);
    return out;
  };
  datasets::GPTBatch out;
  out.tokens = slice(batch.tokens, 1);
  out.labels = slice(batch.labels, 1);
  out.loss_mask = slice(batch.loss_mask, 1);
  Tensor pos = batch.position_ids;
  if (!pos.defined()) {
    std::vector<int64_t> v(static_cast<size_t>(b * s));
    for (int64_t i = 0; i < b * s; ++i) v[i] = i % s;
    pos = Tensor::from_vector_i64(v, {b, s}).to(batch.tokens.device());
  }
  out.position_ids = slice(pos, 1);
  if (batch.attention_mask.defined()) {
    MEGATRON_CHECK(batch.attention_mask.dim() == 4 && batch.attention_mask.size(2) == s &&
                   batch.attention_mask.size(3) == s)
        << "attention mask " << batch.attention_mask.str() << " for seq " << s;
    out.attention_mask = slice(batch.attention_mask, s);
  }
  return out;
}

Tensor cp_rank_global_positions(int64_t s_local, int64_t b, int cp_size, int cp_rank, Device device) {
  MEGATRON_CHECK(s_local % 2 == 0 || cp_size == 1) << "local sequence " << s_local << " with CP " << cp_size;
  std::vector<int64_t> v(static_cast<size_t>(s_local * b));
  const int64_t c = cp_size == 1 ? s_local : s_local / 2;
  for (int64_t i = 0; i < s_local; ++i) {
    const int64_t pos = cp_size == 1 ? i : global_chunk(cp_rank, static_cast<int>(i / c), cp_size) * c + i % c;
    for (int64_t bi = 0; bi < b; ++bi) v[i * b + bi] = pos;
  }
  return Tensor::from_vector_i64(v, {s_local, b}).to(device);
}

void context_parallel_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const ops::AttentionParams& p, distributed::ProcessGroup& cp_group,
                                        const std::string& comm_type, Tensor& out, ContextParallelAttnCtx& ctx) {
  const Dims dm = check(q, k, v, p, cp_group, comm_type);
  MEGATRON_CHECK(out.shape() == q.shape()) << "out " << out.str() << " for q " << q.str();
  const int r = cp_group.rank(), cp = cp_group.size();
  const int64_t c = dm.c;
  const Device dev = q.device();
  std::array<Tensor, 2> acc;
  for (int a = 0; a < 2; ++a) {
    acc[a] = Tensor::zeros({c, dm.b, dm.np, dm.d}, DType::kFloat32, dev);
    ctx.lse[a] = Tensor::empty({dm.b, dm.np, c}, DType::kFloat32, dev);
    ops::fill(ctx.lse[a], -std::numeric_limits<float>::infinity());
  }
  Tensor kv = pack_kv(k, v);
  for (int i = 0; i < cp; ++i) {
    const int src = (r - i + cp) % cp;
    // Post the exchange for the next step before computing on the current block.
    Tensor kv_next;
    std::unique_ptr<distributed::Work> work;
    if (i + 1 < cp) {
      kv_next = Tensor::empty(kv.shape(), kv.dtype(), dev);
      work = ring_exchange(cp_group, kv, kv_next);
    }
    const Tensor kb = kv.narrow0(0, 2 * c), vb = kv.narrow0(2 * c, 2 * c);
    for (const Call& call : plan(r, src, cp, p.attention_mask != nullptr)) {
      Tensor mask;
      const ops::AttentionParams pc = call_params(p, call, r, cp, mask, dm.b, c);
      const Tensor qa = q.narrow0(call.qa * c, c);
      const Tensor kk = kb.narrow0(call.k0 * c, call.kn * c), vv = vb.narrow0(call.k0 * c, call.kn * c);
      Tensor part = Tensor::empty(qa.shape(), q.dtype(), dev);
      Tensor part_lse = Tensor::empty({dm.b, dm.np, c}, DType::kFloat32, dev);
      ops::attention_forward(qa, kk, vv, pc, part, part_lse);
      ops::attention_merge_(acc[call.qa], ctx.lse[call.qa], part, part_lse);
    }
    if (work) {
      work->wait();
      kv = kv_next;
    }
  }
  for (int a = 0; a < 2; ++a) {
    Tensor dst = out.narrow0(a * c, c);
    ops::cast(acc[a], dst);
  }
}

void context_parallel_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const ops::AttentionParams& p,
                                         distributed::ProcessGroup& cp_group, const std::string& comm_type,
                                         const ContextParallelAttnCtx& ctx, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Dims dm = check(q, k, v, p, cp_group, comm_type);
  MEGATRON_CHECK(dout.shape() == q.shape() && out.shape() == q.shape() && dq.shape() == q.shape() &&
                 dk.shape() == k.shape() && dv.shape() == v.shape() && ctx.lse[0].defined() && ctx.lse[1].defined())
      << "context-parallel attention backward dout " << dout.str() << " dq " << dq.str() << " dk " << dk.str();
  const int r = cp_group.rank(), cp = cp_group.size();
  const int64_t c = dm.c, n = 2 * c;
  const Device dev = q.device();
  Shape kv_acc_shape = k.shape();
  kv_acc_shape[0] = 2 * n;  // dK rows [0, n), dV rows [n, 2n)
  Tensor dq_acc = Tensor::zeros(q.shape(), DType::kFloat32, dev);
  Tensor kv = pack_kv(k, v);
  // The dK/dV accumulator of the block held at step i travels with the block: it arrives from
  // the previous rank (which held the block at step i-1) and leaves for the next one.
  Tensor acc_sent, acc_in;
  std::unique_ptr<distributed::Work> acc_work;
  for (int i = 0; i < cp; ++i) {
    const int src = (r - i + cp) % cp;
    Tensor kv_next;
    std::unique_ptr<distributed::Work> kv_work;
    if (i + 1 < cp) {
      kv_next = Tensor::empty(kv.shape(), kv.dtype(), dev);
      kv_work = ring_exchange(cp_group, kv, kv_next);
    }
    const Tensor kb = kv.narrow0(0, n), vb = kv.narrow0(n, n);
    Tensor contrib = Tensor::zeros(kv_acc_shape, DType::kFloat32, dev);
    for (const Call& call : plan(r, src, cp, p.attention_mask != nullptr)) {
      Tensor mask;
      const ops::AttentionParams pc = call_params(p, call, r, cp, mask, dm.b, c);
      const Tensor qa = q.narrow0(call.qa * c, c), da = dout.narrow0(call.qa * c, c), oa = out.narrow0(call.qa * c, c);
      const Tensor kk = kb.narrow0(call.k0 * c, call.kn * c), vv = vb.narrow0(call.k0 * c, call.kn * c);
      Tensor dq_p = Tensor::empty(qa.shape(), q.dtype(), dev);
      Tensor dk_p = Tensor::empty(kk.shape(), k.dtype(), dev), dv_p = Tensor::empty(vv.shape(), v.dtype(), dev);
      ops::attention_backward(da, qa, kk, vv, oa, ctx.lse[call.qa], pc, dq_p, dk_p, dv_p);
      Tensor dq_dst = dq_acc.narrow0(call.qa * c, c);
      Tensor dk_dst = contrib.narrow0(call.k0 * c, call.kn * c), dv_dst = contrib.narrow0(n + call.k0 * c, call.kn * c);
      ops::add_(dq_dst, dq_p);
      ops::add_(dk_dst, dk_p);
      ops::add_(dv_dst, dv_p);
    }
    if (acc_work) {
      acc_work->wait();
      ops::add_(contrib, acc_in);
    }
    if (cp > 1) {
      acc_sent = contrib;
      acc_in = Tensor::empty(kv_acc_shape, DType::kFloat32, dev);
      acc_work = ring_exchange(cp_group, acc_sent, acc_in);
    } else {
      acc_in = contrib;
    }
    if (kv_work) {
      kv_work->wait();
      kv = kv_next;
    }
  }
  // After CP steps the accumulator of block (r + 1) mod CP left for its owner, and this rank's
  // own block's accumulator arrived from the previous rank.
  if (acc_work) acc_work->wait();
  ops::cast(dq_acc, dq);
  const Tensor dk_src = acc_in.narrow0(0, n), dv_src = acc_in.narrow0(n, n);
  ops::cast(dk_src, dk);
  ops::cast(dv_src, dv);
}

}  // namespace megatron::transformer
