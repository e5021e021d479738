// Context parallelism (Megatron's --context-parallel-size; docs/megatron-reference.md#context-parallelism): the sequence of a
// micro-batch is split over the CP ranks and attention runs as a ring over them.
//
// Layout (load-balanced for the causal mask, as Megatron's get_batch_on_this_cp_rank and
// Transformer Engine's AttnFuncWithCPAndKVP2P): the sequence of length S is cut into 2*CP equal
// chunks of c = S / (2*CP) tokens; CP rank r keeps chunk r followed by chunk 2*CP-1-r, so its
// local sequence is 2c tokens and every rank has the same amount of causal attention work.
//
// Ring attention (--cp-comm-type p2p): each rank's K/V block (its two chunks) travels around
// the CP ring (rank r sends to r+1 and receives from r-1) while the rank computes attention of
// its queries against the block it holds; partial results over disjoint key sets are merged with
// their log-sum-exp (ops::attention_merge_). With the block of rank src at step i
// (src = (r - i) mod CP) the causal structure per chunk pair is:
//   src == r : q chunk r vs k chunk r causal; q chunk 2CP-1-r vs k chunk r full and vs
//              k chunk 2CP-1-r causal;
//   src <  r : both q chunks vs k chunk src full (k chunk 2CP-1-src is in the future of both);
//   src >  r : q chunk 2CP-1-r vs both k chunks full (q chunk r sees neither).
// The backward runs the same ring; each block's dK/dV accumulator (float32) travels with the
// block and after CP steps one more hop returns it to its owner. Communication is posted
// asynchronously (ProcessGroup::batch_isend_irecv) before the block's attention and waited for
// after it, so on NCCL it overlaps with the compute.
//
// All-to-all (--cp-comm-type a2a, DeepSpeed-Ulysses as in Transformer Engine's
// AttnFuncWithCPAndQKVOA2A): an all-to-all turns "2 chunks x all heads" into "whole sequence x
// 1/CP of the heads" for q, k, v; plain causal attention runs on the whole sequence; an
// all-to-all returns the output (backward: the same for dout, and back for dq, dk, dv). Needs
// the attention heads and query groups of a TP rank divisible by CP; no explicit attention mask.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "megatron/core/datasets/gpt_batch.h"
#include "megatron/core/comm/process_group.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::transformer {

/// Megatron's get_batch_on_this_cp_rank (megatron/core/utils.py): keeps, along the sequence
/// dimension, chunks cp_rank and 2*cp_size-1-cp_rank (in that order) of the 2*cp_size equal
/// chunks of tokens, labels, loss_mask and position_ids ([b, s] -> [b, s / cp_size]) and of the
/// attention mask's query dimension ([b, 1, s, s] -> [b, 1, s / cp_size, s]). An undefined
/// position_ids becomes the global positions 0..s-1 before slicing (so the learned position
/// embedding still sees the true positions). cp_size == 1 returns the batch unchanged.
/// Throws UserError when s is not a multiple of 2*cp_size (name: --seq-length).
datasets::GPTBatch get_batch_on_this_cp_rank(const datasets::GPTBatch& batch, int cp_size, int cp_rank);

/// Global sequence positions of the rows this CP rank holds, int64 [s_local, b] (sequence-first,
/// the same for every sequence of the batch): rows [0, c) are positions cp_rank*c + i, rows
/// [c, 2c) are (2*cp_size-1-cp_rank)*c + i, with c = s_local / 2. Used for RoPE, which Megatron
/// computes for the whole sequence and slices per CP rank (get_pos_emb_on_this_cp_rank).
Tensor cp_rank_global_positions(int64_t s_local, int64_t b, int cp_size, int cp_rank, Device device);

/// What the CP attention backward needs besides q, k, v, out: the log-sum-exp of each local
/// chunk's queries over all keys, float32 [b, np, c] per chunk.
struct ContextParallelAttnCtx {
  std::array<Tensor, 2> lse;
  /// a2a: the full-sequence head slice this rank attended over (natural token order):
  /// q/out [S, b, np/CP, d], k/v [S, b, ng/CP, d], lse float32 [b, np/CP, S].
  Tensor q_full, k_full, v_full, out_full, lse_full;
};

/// Causal self-attention of this CP rank's queries against the whole sequence by a K/V ring over
/// cp_group (see the file comment). q [2c, b, np, d], k, v [2c, b, ng, d] hold chunks
/// (cp_rank, 2*CP-1-cp_rank) of the sequence, as get_batch_on_this_cp_rank lays them out; out
/// [2c, b, np, d] (q's dtype) is written, ctx.lse filled. p.causal must be true (the ring skips
/// future blocks); with p.attention_mask ([b, 1, 2c, S] bool, the query rows of this rank over
/// all S keys, 1 = masked) every block pair is computed under its sub-mask instead. Attention
/// dropout uses a separate random stream per (query chunk, key block). comm_type "p2p" (ring) or
/// "a2a" (all-to-all; heads and groups divisible by CP, no mask).
/// Must be called by every rank of cp_group (collective). Throws UserError for an unsupported
/// comm_type; InternalError for shapes that do not fit.
void context_parallel_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const ops::AttentionParams& p, comm::ProcessGroup& cp_group,
                                        const std::string& comm_type, Tensor& out, ContextParallelAttnCtx& ctx);

/// Backward of context_parallel_attention_forward: dq, dk, dv (shapes and dtypes of q, k, v)
/// are overwritten; dk/dv are the full gradients of this rank's K/V (summed over the queries
/// of every CP rank). Collective over cp_group.
void context_parallel_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const ops::AttentionParams& p,
                                         comm::ProcessGroup& cp_group, const std::string& comm_type,
                                         const ContextParallelAttnCtx& ctx, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace megatron::transformer
