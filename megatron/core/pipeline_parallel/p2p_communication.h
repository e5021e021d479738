// Pipeline point-to-point communication (Megatron's megatron/core/pipeline_parallel/
// p2p_communication.py): activations go to the next stage, their gradients come back. Combined
// operations are posted together with batch_isend_irecv, so they are deadlock-free on NCCL too.
// On the first stage recv_forward/send_backward do nothing (return an undefined tensor); on the
// last stage send_forward/recv_backward do nothing.
#pragma once

#include <memory>

#include "megatron/core/comm/process_group.h"

namespace megatron::pipeline_parallel {

class P2PCommunicator {
 public:
  /// pp_group: this rank's pipeline group (group rank = stage). `shape`/`dtype`/`device`
  /// describe every activation exchanged ([s/(CP*TP if SP), mbs, h] in Megatron).
  P2PCommunicator(std::shared_ptr<comm::ProcessGroup> pp_group, Shape shape, DType dtype,
                  Device device = Device::cpu());
  int stage() const { return group_->rank(); }
  int num_stages() const { return group_->size(); }
  bool is_first_stage() const { return group_->rank() == 0; }
  bool is_last_stage() const { return group_->rank() == group_->size() - 1; }

  Tensor recv_forward();
  Tensor recv_backward();
  void send_forward(const Tensor& output);
  void send_backward(const Tensor& input_grad);
  /// Sends `output` forward and receives the gradient of it from the next stage.
  Tensor send_forward_recv_backward(const Tensor& output);
  /// Sends `input_grad` backward and receives the next input from the previous stage.
  Tensor send_backward_recv_forward(const Tensor& input_grad);

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  Shape shape_;
  DType dtype_;
  Device device_;
};

}  // namespace megatron::pipeline_parallel
