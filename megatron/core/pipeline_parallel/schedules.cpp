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
