#include "megatron/core/pipeline_parallel/p2p_communication.h"

namespace megatron::pipeline_parallel {

using comm::P2POp;

P2PCommunicator::P2PCommunicator(std::shared_ptr<comm::ProcessGroup> g, Shape shape, DType dtype, Device device)
    : group_(std::move(g)), shape_(std::move(shape)), dtype_(dtype), device_(device) {
  MEGATRON_CHECK(group_) << "null pipeline group";
}

namespace {
void check_shape(const Tensor& t, const Shape& s, const char* what) {
  MEGATRON_CHECK(t.defined() && t.shape() == s) << what << ": got " << (t.defined() ? t.str() : "undefined")
                                                << ", pipeline tensor shape " << shape_str(s);
}
}  // namespace

Tensor P2PCommunicator::recv_forward() {
  if (is_first_stage()) return {};
  Tensor t = Tensor::empty(shape_, dtype_, device_);
  group_->batch_isend_irecv({P2POp{P2POp::kRecv, &t, group_->rank() - 1}})->wait();
  return t;
}

Tensor P2PCommunicator::recv_backward() {
  if (is_last_stage()) return {};
  Tensor t = Tensor::empty(shape_, dtype_, device_);
  group_->batch_isend_irecv({P2POp{P2POp::kRecv, &t, group_->rank() + 1}})->wait();
  return t;
}

void P2PCommunicator::send_forward(const Tensor& output) {
  if (is_last_stage()) return;
  check_shape(output, shape_, "send_forward");
  Tensor t = output;
  group_->batch_isend_irecv({P2POp{P2POp::kSend, &t, group_->rank() + 1}})->wait();
}

void P2PCommunicator::send_backward(const Tensor& input_grad) {
  if (is_first_stage()) return;
  check_shape(input_grad, shape_, "send_backward");
  Tensor t = input_grad;
  group_->batch_isend_irecv({P2POp{P2POp::kSend, &t, group_->rank() - 1}})->wait();
}

Tensor P2PCommunicator::send_forward_recv_backward(const Tensor& output) {
  if (is_last_stage()) return {};
  check_shape(output, shape_, "send_forward_recv_backward");
  Tensor s = output, r = Tensor::empty(shape_, dtype_, device_);
  const int next = group_->rank() + 1;
  group_->batch_isend_irecv({P2POp{P2POp::kSend, &s, next}, P2POp{P2POp::kRecv, &r, next}})->wait();
  return r;
}

Tensor P2PCommunicator::send_backward_recv_forward(const Tensor& input_grad) {
  if (is_first_stage()) return {};
  check_shape(input_grad, shape_, "send_backward_recv_forward");
  Tensor s = input_grad, r = Tensor::empty(shape_, dtype_, device_);
  const int prev = group_->rank() - 1;
  group_->batch_isend_irecv({P2POp{P2POp::kSend, &s, prev}, P2POp{P2POp::kRecv, &r, prev}})->wait();
  return r;
}

}  // namespace megatron::pipeline_parallel
