#include "megatron/core/pipeline_parallel/schedules.h"

#include <algorithm>
#include <deque>

namespace megatron::pipeline_parallel {

std::vector<Tensor> forward_backward_no_pipelining(PipelineStage& stage, int M, bool forward_only) {
  if (M < 1) user_error("number of micro-batches must be >= 1 (got ", M, ")");
  std::vector<Tensor> losses;
  for (int i = 0; i < M; ++i) {
    losses.push_back(stage.forward_step(i, Tensor()));
    if (!forward_only) stage.backward_step(i, Tensor());
  }
  return losses;
}

std::vector<Tensor> forward_backward_pipelining_without_interleaving(PipelineStage& stage, int M, P2PCommunicator& p2p,
                                                                     bool forward_only) {
  if (M < 1) user_error("number of micro-batches must be >= 1 (got ", M, ")");
  const bool last = p2p.is_last_stage();
  std::vector<Tensor> losses;
  auto fwd = [&](int mb, const Tensor& in) {
    Tensor out = stage.forward_step(mb, in);
    if (last) losses.push_back(out);
    return out;
  };
  if (forward_only) {
    for (int i = 0; i < M; ++i) p2p.send_forward(fwd(i, p2p.recv_forward()));
    return losses;
  }
  // Megatron: num_warmup = min(PP - rank - 1, M); the rest run one-forward-one-backward.
  const int warmup = std::min(p2p.num_stages() - p2p.stage() - 1, M);
  const int remaining = M - warmup;
  for (int i = 0; i < warmup; ++i) p2p.send_forward(fwd(i, p2p.recv_forward()));
  Tensor input;
  if (remaining > 0) input = p2p.recv_forward();
  for (int i = 0; i < remaining; ++i) {
    Tensor out = fwd(warmup + i, input);
    Tensor out_grad = p2p.send_forward_recv_backward(out);
    Tensor in_grad = stage.backward_step(i, out_grad);  // the oldest in-flight micro-batch
    if (i == remaining - 1) {
      input = Tensor();
      p2p.send_backward(in_grad);
    } else {
      input = p2p.send_backward_recv_forward(in_grad);
    }
  }
  for (int i = 0; i < warmup; ++i) {
    Tensor out_grad = p2p.recv_backward();
    p2p.send_backward(stage.backward_step(remaining + i, out_grad));
  }
  return losses;
}

}  // namespace megatron::pipeline_parallel

namespace megatron::pipeline_parallel {

std::vector<std::pair<int, int>> get_schedule_table(int M, int V, int G) {
  std::vector<std::pair<int, int>> t;
  for (int lo = 0; lo < M; lo += G) {
    const int hi = lo + G >= M ? M : lo + G;  // the last group takes the remainder
    for (int c = 0; c < V; ++c)
      for (int mb = lo; mb < hi; ++mb) t.push_back({mb, c});
    if (hi == M) break;
  }
  return t;
}

void check_microbatch_group_size(int P, int M, int G) {
  if (G > M || G < P)
    user_error("the number of contiguous micro-batches in a virtual pipeline stage (", G, ") must lie in [PP=", P,
               ", M=", M, "] (--microbatch-group-size-per-virtual-pipeline-stage, default PP; M = global batch / "
               "(micro batch x data-parallel size))");
  if (M % G != 0 && M % G < P)
    user_error("the remainder of the micro-batch count ", M, " divided by the group size ", G,
               " must be 0 or >= the pipeline-parallel size ", P,
               " (the group size is --microbatch-group-size-per-virtual-pipeline-stage, default PP; choose a "
               "--global-batch-size that gives a multiple of it, or set the flag)");
}

InterleavedPipeline::InterleavedPipeline(std::shared_ptr<comm::ProcessGroup> pp, Shape shape, DType dtype,
                                         Device device)
    : pp_(std::move(pp)), shape_(std::move(shape)), dtype_(dtype), device_(device) {
  MEGATRON_CHECK(pp_) << "null pipeline group";
  fwd_ = pp_->split({pp_->ranks()});
  bwd_ = pp_->split({pp_->ranks()});
}

std::vector<Tensor> InterleavedPipeline::run(VirtualPipelineStage& stage, int M, int V, int G, bool forward_only) {
  const int P = pp_->size(), r = pp_->rank();
  if (G == 0) G = P;
  if (V < 1) user_error("virtual pipeline size must be >= 1");
  check_microbatch_group_size(P, M, G);
  const auto table = get_schedule_table(M, V, G);
  const int total = M * V;
  // Megatron's get_pp_rank_microbatches.
  int warmup = forward_only ? total : (P - r - 1) * 2 + (V - 1) * G;
  const bool all_warmup = warmup >= total;
  if (all_warmup) warmup = total;
  const int remaining = total - warmup;
  const bool first_rank = r == 0, last_rank = r == P - 1;
  const int next = (r + 1) % P, prev = (r - 1 + P) % P;

  auto chunk_id = [&](int k, bool forward) {
    const int c = table[static_cast<size_t>(k % total)].second;
    return forward ? c : V - 1 - c;
  };
  // Megatron's recv_tensor_from_previous_stage: whether step k receives (an activation from the
  // previous rank when `forward`, a gradient from the next rank otherwise) and for which chunk.
  auto recv_from_previous_stage = [&](int k, bool forward) {
    bool recv = true;
    const bool leading = forward ? first_rank : last_rank;
    const int last_chunk = forward ? V - 1 : 0;
    int nc;
    if (leading) {
      // The leading rank is P - 1 steps ahead of the ending rank, which has sent nothing yet.
      if (k < P - 1) {
        recv = false;
        nc = chunk_id(k + 1, forward);
      } else {
        nc = chunk_id(k - (P - 1), forward);
      }
      if (nc == last_chunk) recv = false;  // the last chunk of the ending rank sends nothing
      nc += forward ? 1 : -1;
    } else {
      nc = chunk_id(k + 1, forward);
    }
    return std::pair<bool, int>{recv, nc};
  };

  // Received tensors per chunk, in micro-batch order (each chunk consumes them in that order).
  std::vector<std::deque<Tensor>> inputs(static_cast<size_t>(V)), out_grads(static_cast<size_t>(V));
  std::vector<Tensor> losses;
  // One step's exchange (Megatron's send_forward_backward_recv_forward_backward and its special
  // cases): activations on fwd_ (to next / from prev), gradients on bwd_ (to prev / from next);
  // both batches are posted before either is waited for.
  auto exchange = [&](const Tensor& send_next, const Tensor& send_prev, bool recv_prev, int prev_chunk, bool recv_next,
                      int next_chunk) {
    Tensor sn = send_next, sp = send_prev, rp, rn;
    std::vector<comm::P2POp> f, b;
    if (sn.defined()) {
      MEGATRON_CHECK(sn.shape() == shape_) << "activation " << sn.str() << " vs " << shape_str(shape_);
      f.push_back({comm::P2POp::kSend, &sn, next});
    }
    if (recv_prev) {
      rp = Tensor::empty(shape_, dtype_, device_);
      f.push_back({comm::P2POp::kRecv, &rp, prev});
    }
    if (sp.defined()) {
      MEGATRON_CHECK(sp.shape() == shape_) << "input gradient " << sp.str() << " vs " << shape_str(shape_);
      b.push_back({comm::P2POp::kSend, &sp, prev});
    }
    if (recv_next) {
      rn = Tensor::empty(shape_, dtype_, device_);
      b.push_back({comm::P2POp::kRecv, &rn, next});
    }
    std::unique_ptr<comm::Work> wf, wb;
    if (!f.empty()) wf = fwd_->batch_isend_irecv(f);
    if (!b.empty()) wb = bwd_->batch_isend_irecv(b);
    if (wf) wf->wait();
    if (wb) wb->wait();
    if (recv_prev) inputs[static_cast<size_t>(prev_chunk)].push_back(rp);
    if (recv_next) out_grads[static_cast<size_t>(next_chunk)].push_back(rn);
  };
  auto pop = [](std::deque<Tensor>& q, const char* what, int c) {
    MEGATRON_CHECK(!q.empty()) << "no " << what << " received for chunk " << c;
    Tensor t = q.front();
    q.pop_front();
    return t;
  };
  // Forward of step k; returns what to send on (undefined for the loss chunk).
  auto forward = [&](int k) {
    auto [mb, c] = table[static_cast<size_t>(k)];
    Tensor in;
    if (!(first_rank && c == 0)) in = pop(inputs[static_cast<size_t>(c)], "activation", c);
    Tensor out = stage.forward_step(c, mb, in);
    if (last_rank && c == V - 1) {
      losses.push_back(out);
      return Tensor();
    }
    return out;
  };
  // Backward of step k; returns the input gradient to send back (undefined for chunk 0 of rank 0).
  auto backward = [&](int k) {
    const int mb = table[static_cast<size_t>(k)].first, c = chunk_id(k, false);
    Tensor g;
    if (!(last_rank && c == V - 1)) g = pop(out_grads[static_cast<size_t>(c)], "output gradient", c);
    Tensor in_grad = stage.backward_step(c, mb, g);
    if (first_rank && c == 0) return Tensor();
    MEGATRON_CHECK(in_grad.defined()) << "chunk " << c << " micro-batch " << mb << ": no input gradient";
    return in_grad;
  };

  // Warm-up: the first input, then forward k and (send its output, receive the input of k + 1).
  if (!first_rank) exchange(Tensor(), Tensor(), true, 0, false, 0);
  for (int k = 0; k < warmup; ++k) {
    auto [recv_prev, prev_chunk] = recv_from_previous_stage(k, true);
    if (k == total - 1) recv_prev = false;
    Tensor out = forward(k);
    // The last warm-up step also receives the gradient for the first backward.
    const bool recv_next = k == warmup - 1 && !forward_only && !all_warmup && !last_rank;
    exchange(out, Tensor(), recv_prev, prev_chunk, recv_next, V - 1);
  }
  // Steady state: forward warmup + k, backward k, one exchange of all four.
  for (int k = 0; k < remaining; ++k) {
    const int fk = warmup + k;
    Tensor out = forward(fk);
    Tensor in_grad = backward(k);
    auto [recv_prev, prev_chunk] = recv_from_previous_stage(fk, true);
    auto [recv_next, next_chunk] = recv_from_previous_stage(k, false);
    if (k == remaining - 1) recv_prev = false;
    exchange(out, in_grad, recv_prev, prev_chunk, recv_next, next_chunk);
  }
  // Cool-down: the remaining backwards.
  if (!forward_only) {
    if (all_warmup && !last_rank) exchange(Tensor(), Tensor(), false, 0, true, V - 1);
    for (int k = remaining; k < total; ++k) {
      auto [recv_next, next_chunk] = recv_from_previous_stage(k, false);
      if (k == total - 1) recv_next = false;
      Tensor in_grad = backward(k);
      exchange(Tensor(), in_grad, false, 0, recv_next, next_chunk);
    }
  }
  for (int c = 0; c < V; ++c)
    MEGATRON_CHECK(inputs[static_cast<size_t>(c)].empty() && out_grads[static_cast<size_t>(c)].empty())
        << "chunk " << c << ": " << inputs[static_cast<size_t>(c)].size() << " activations and "
        << out_grads[static_cast<size_t>(c)].size() << " gradients received but not used";
  return losses;
}

}  // namespace megatron::pipeline_parallel
