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
           comm::ProcessGroup& g, const std::string& comm_type) {
  if (comm_type != "p2p" && comm_type != "a2a")
    user_error("--cp-comm-type ", comm_type, ": only p2p (ring exchange of K/V) and a2a (all-to-all) are implemented");
  if (comm_type == "a2a") {
    if (q.size(2) % g.size() != 0 || k.size(2) % g.size() != 0)
      user_error("--cp-comm-type a2a: the attention heads (", q.size(2), ") and query groups (", k.size(2),
                 ") of a tensor-parallel rank must be divisible by --context-parallel-size (", g.size(),
                 "); use --cp-comm-type p2p");
    if (p.attention_mask)
      user_error("--cp-comm-type a2a does not support an explicit attention mask (--reset-attention-mask); use "
                 "--cp-comm-type p2p");
  }
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
std::unique_ptr<comm::Work> ring_exchange(comm::ProcessGroup& g, Tensor& out, Tensor& in) {
  const int r = g.rank(), n = g.size();
  std::vector<comm::P2POp> ops = {{comm::P2POp::kSend, &out, (r + 1) % n},
                                         {comm::P2POp::kRecv, &in, (r - 1 + n) % n}};
  return g.batch_isend_irecv(ops);
}

// ---- all-to-all (Ulysses) ----------------------------------------------------------------------

/// x [2c, b, n, d] (this rank's two chunks, all n heads) -> [S, b, n/CP, d]: the whole sequence in
/// natural token order for head slice cp_rank. Collective over g.
// All-to-all over g by point-to-point (one batch_isend_irecv, waited for): sends[j] goes to rank j,
// recvs[j] receives rank j's; this rank's own slot is copied locally. One send/recv per rank.
void all_to_all_p2p(comm::ProcessGroup& g, std::vector<Tensor>& sends, std::vector<Tensor>& recvs) {
  const int cp = g.size(), r = g.rank();
  std::vector<comm::P2POp> ops;
  for (int j = 0; j < cp; ++j) {
    if (j == r) continue;
    ops.push_back({comm::P2POp::kSend, &sends[static_cast<size_t>(j)], j});
    ops.push_back({comm::P2POp::kRecv, &recvs[static_cast<size_t>(j)], j});
  }
  recvs[static_cast<size_t>(r)].copy_(sends[static_cast<size_t>(r)]);
  if (!ops.empty()) g.batch_isend_irecv(ops)->wait();
}

Tensor seq_gather_heads_scatter(const Tensor& x, comm::ProcessGroup& g) {
  const int cp = g.size();
  const int64_t n2 = x.size(0), b = x.size(1), n = x.size(2), d = x.size(3), hs = n / cp, c = n2 / 2;
  const Device dev = x.device();
  // [2c*b, CP, hs*d] -> [CP, 2c*b, hs*d]: slot j = head slice j of all local rows.
  Tensor send = Tensor::empty({cp, n2 * b, hs * d}, x.dtype(), dev);
  ops::transpose01(x.view({n2 * b, cp, hs * d}), send);
  Tensor recv = Tensor::empty({cp, n2, b, hs, d}, x.dtype(), dev);
  std::vector<Tensor> sends, recvs;
  for (int j = 0; j < cp; ++j) {
    sends.push_back(send.narrow0(j, 1).view({n2, b, hs, d}));
    recvs.push_back(recv.narrow0(j, 1).view({n2, b, hs, d}));
  }
  all_to_all_p2p(g, sends, recvs);
  // Rank i's rows are its chunks (i, 2CP-1-i): put every chunk at its place in the sequence.
  Tensor full = Tensor::empty({2 * cp * c, b, hs, d}, x.dtype(), dev);
  for (int i = 0; i < cp; ++i)
    for (int half = 0; half < 2; ++half) {
      Tensor dst = full.narrow0(global_chunk(i, half, cp) * c, c);
      dst.copy_(recvs[static_cast<size_t>(i)].narrow0(half * c, c));
    }
  return full;
}

/// Inverse of seq_gather_heads_scatter: full [S, b, hs, d] (head slice cp_rank) -> [2c, b, hs*CP, d]
/// (this rank's two chunks, all heads), into `out` (any float dtype of full's). Collective over g.
void seq_scatter_heads_gather(const Tensor& full, comm::ProcessGroup& g, Tensor& out) {
  const int cp = g.size();
  const int64_t S = full.size(0), b = full.size(1), hs = full.size(2), d = full.size(3), c = S / (2 * cp);
  const Device dev = full.device();
  Tensor send = Tensor::empty({cp, 2 * c, b, hs, d}, full.dtype(), dev);
  Tensor recv = Tensor::empty({cp, 2 * c * b, hs * d}, full.dtype(), dev);
  std::vector<Tensor> sends, recvs;
  for (int i = 0; i < cp; ++i) {
    Tensor slot = send.narrow0(i, 1).view({2 * c, b, hs, d});
    for (int half = 0; half < 2; ++half) {
      Tensor dst = slot.narrow0(half * c, c);
      dst.copy_(full.narrow0(global_chunk(i, half, cp) * c, c));
    }
    sends.push_back(slot);
    recvs.push_back(recv.narrow0(i, 1).view({2 * c, b, hs, d}));
  }
  all_to_all_p2p(g, sends, recvs);
  // [CP, 2c*b, hs*d] -> [2c*b, CP, hs*d] = [2c, b, CP*hs, d] (head slice j from rank j).
  if (out.dtype() == full.dtype()) {
    Tensor o = out.view({2 * c * b, cp, hs * d});
    ops::transpose01(recv, o);
  } else {
    Tensor tmp = Tensor::empty({2 * c * b, cp, hs * d}, full.dtype(), dev);
    ops::transpose01(recv, tmp);
    ops::cast(tmp, out);
  }
}

void a2a_forward(const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionParams& p,
                 comm::ProcessGroup& g, Tensor& out, ContextParallelAttnCtx& ctx) {
  ctx.q_full = seq_gather_heads_scatter(q, g);
  ctx.k_full = seq_gather_heads_scatter(k, g);
  ctx.v_full = seq_gather_heads_scatter(v, g);
  const int64_t S = ctx.q_full.size(0), b = q.size(1), hs = ctx.q_full.size(2);
  ctx.out_full = Tensor::empty(ctx.q_full.shape(), q.dtype(), q.device());
  ctx.lse_full = Tensor::empty({b, hs, S}, DType::kFloat32, q.device());
  ops::AttentionParams pc = p;
  if (p.dropout_p > 0.0f) pc.seed = p.seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(g.rank() + 1);
  ops::attention_forward(ctx.q_full, ctx.k_full, ctx.v_full, pc, ctx.out_full, ctx.lse_full);
  seq_scatter_heads_gather(ctx.out_full, g, out);
}

void a2a_backward(const Tensor& dout, const ops::AttentionParams& p, comm::ProcessGroup& g,
                  const ContextParallelAttnCtx& ctx, Tensor& dq, Tensor& dk, Tensor& dv) {
  MEGATRON_CHECK(ctx.q_full.defined() && ctx.out_full.defined()) << "a2a backward without its forward";
  Tensor dout_full = seq_gather_heads_scatter(dout, g);
  Tensor dq_full = Tensor::empty(ctx.q_full.shape(), dq.dtype(), dq.device());
  Tensor dk_full = Tensor::empty(ctx.k_full.shape(), dk.dtype(), dk.device());
  Tensor dv_full = Tensor::empty(ctx.v_full.shape(), dv.dtype(), dv.device());
  ops::AttentionParams pc = p;
  if (p.dropout_p > 0.0f) pc.seed = p.seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(g.rank() + 1);
  ops::attention_backward(dout_full, ctx.q_full, ctx.k_full, ctx.v_full, ctx.out_full, ctx.lse_full, pc, dq_full,
                          dk_full, dv_full);
  seq_scatter_heads_gather(dq_full, g, dq);
  seq_scatter_heads_gather(dk_full, g, dk);
  seq_scatter_heads_gather(dv_full, g, dv);
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
                                        const ops::AttentionParams& p, comm::ProcessGroup& cp_group,
                                        const std::string& comm_type, Tensor& out, ContextParallelAttnCtx& ctx) {
  const Dims dm = check(q, k, v, p, cp_group, comm_type);
  MEGATRON_CHECK(out.shape() == q.shape()) << "out " << out.str() << " for q " << q.str();
  if (comm_type == "a2a") return a2a_forward(q, k, v, p, cp_group, out, ctx);
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
    std::unique_ptr<comm::Work> work;
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
                                         comm::ProcessGroup& cp_group, const std::string& comm_type,
                                         const ContextParallelAttnCtx& ctx, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Dims dm = check(q, k, v, p, cp_group, comm_type);
  MEGATRON_CHECK(dout.shape() == q.shape() && out.shape() == q.shape() && dq.shape() == q.shape() &&
                 dk.shape() == k.shape() && dv.shape() == v.shape() &&
                 (comm_type == "a2a" || (ctx.lse[0].defined() && ctx.lse[1].defined())))
      << "context-parallel attention backward dout " << dout.str() << " dq " << dq.str() << " dk " << dk.str();
  if (comm_type == "a2a") return a2a_backward(dout, p, cp_group, ctx, dq, dk, dv);
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
  std::unique_ptr<comm::Work> acc_work;
  for (int i = 0; i < cp; ++i) {
    const int src = (r - i + cp) % cp;
    Tensor kv_next;
    std::unique_ptr<comm::Work> kv_work;
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
