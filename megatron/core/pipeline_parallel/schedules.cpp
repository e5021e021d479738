#include "megatron/core/pipeline_parallel/schedules.h"

#include <algorithm>

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

InterleavedPipeline::InterleavedPipeline(std::shared_ptr<distributed::ProcessGroup> pp, Shape shape, DType dtype,
                                         Device device)
    : pp_(std::move(pp)), shape_(std::move(shape)), dtype_(dtype), device_(device) {
  MEGATRON_CHECK(pp_) << "null pipeline group";
  if (std::string(pp_->backend_name()) == "nccl")
    user_error("the interleaved pipeline schedule (--num-layers-per-virtual-pipeline-stage) is not supported on the "
               "NCCL backend yet");
  fwd_ = pp_->split({pp_->ranks()});
  bwd_ = pp_->split({pp_->ranks()});
}

std::vector<Tensor> InterleavedPipeline::run(VirtualPipelineStage& stage, int M, int V, int G, bool forward_only) {
  const int P = pp_->size(), r = pp_->rank();
  if (G == 0) G = P;
  if (V < 1) user_error("virtual pipeline size must be >= 1");
  if (G > M || G < P)
    user_error("the number of contiguous micro-batches in a virtual pipeline stage (", G, ") must lie in [PP=", P,
               ", M=", M, "]");
  if (M % G != 0 && M % G < P)
    user_error("the remainder of the micro-batch count ", M, " divided by the group size ", G,
               " must be 0 or >= the pipeline-parallel size ", P);
  const auto table = get_schedule_table(M, V, G);
  const int total = M * V;
  int warmup = forward_only ? total : (P - r - 1) * 2 + (V - 1) * G;
  warmup = std::min(warmup, total);
  const int next = (r + 1) % P, prev = (r - 1 + P) % P;
  std::vector<std::unique_ptr<distributed::Work>> sends;
  std::vector<Tensor> keep, losses;
  auto forward = [&](int k) {
    auto [mb, c] = table[k];
    Tensor in;
    if (!(r == 0 && c == 0)) {
      in = Tensor::empty(shape_, dtype_, device_);
      fwd_->recv(in, prev);
    }
    Tensor out = stage.forward_step(c, mb, in);
    if (r == P - 1 && c == V - 1) {
      losses.push_back(out);
    } else {
      MEGATRON_CHECK(out.shape() == shape_) << "chunk " << c << " output " << out.str() << " vs " << shape_str(shape_);
      keep.push_back(out);
      sends.push_back(fwd_->send(out, next, /*async=*/true));
    }
  };
  auto backward = [&](int k) {
    auto [mb, fc] = table[k];
    const int c = V - 1 - fc;
    Tensor g;
    if (!(r == P - 1 && c == V - 1)) {
      g = Tensor::empty(shape_, dtype_, device_);
      bwd_->recv(g, next);
    }
    Tensor in_grad = stage.backward_step(c, mb, g);
    if (!(r == 0 && c == 0)) {
      MEGATRON_CHECK(in_grad.defined() && in_grad.shape() == shape_) << "chunk " << c << " input grad";
      keep.push_back(in_grad);
      sends.push_back(bwd_->send(in_grad, prev, /*async=*/true));
    }
  };
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int k = 0; k < total - warmup; ++k) {
    forward(warmup + k);
    backward(k);
  }
  if (!forward_only)
    for (int k = total - warmup; k < total; ++k) backward(k);
  for (auto& w : sends) w->wait();
  return losses;
}

}  // namespace megatron::pipeline_parallel
