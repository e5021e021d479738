#pragma once
// The pipelined decode loop's two device helpers (text generation, docs/inference.md "Pipelined
// decode: the host off the critical path"): the self-fed step's advance, captured at the end of
// the decode graph so that the next step reads its token ids and positions from device memory,
// and the asynchronous device->host readback of a step's token ids. Kept out of the op table
// (ops/op_table.h): only text generation uses them. CPU tensors take the same functions (the
// reference: plain loops and a memcpy), so the pipelined loop runs on the CPU backend too.

#include <cstddef>
#include <cstdint>

#include "megatron/core/tensor/tensor.h"

namespace megatron::ops {

/// The self-fed decode step's advance: ids[i] = clamp(sampled[i], 0, max_id) (sample_row's clamp
/// of a greedy sample below the tokenizer's vocabulary, inference/sampling.h clamp_sample) and
/// positions[j] += 1 for every j. sampled, ids int64 [b], positions int64 [n], all on one device (CPU or CUDA). No allocation, no host synchronization (CUDA:
/// one kernel on the calling thread's compute stream, capturable in a CUDA graph). Throws
/// InternalError on a dtype / shape / device mismatch (UserError for a CUDA tensor in a build
/// without the CUDA backend).
void decode_feed(const Tensor& sampled, int64_t max_id, Tensor& ids, Tensor& positions);

/// A device->host copy that the host waits for later (the token ids of a decode step the GPU is
/// still running). For a CUDA source: a page-locked host buffer and an event; start() enqueues
/// the copy and the event on the calling thread's compute stream and returns at once. For a CPU
/// source start() copies at once and wait() returns the buffer. Not copyable.
class HostReadback {
 public:
  HostReadback() = default;
  ~HostReadback();
  HostReadback(const HostReadback&) = delete;
  HostReadback& operator=(const HostReadback&) = delete;

  /// Starts copying `src` (CPU or CUDA) into the host buffer (grown as needed; a
  /// buffer still being written by a previous start() is waited for first).
  void start(const Tensor& src);
  /// Waits for the copy of the last start() and returns its bytes (valid until the next start()).
  /// InternalError without a start() since the last wait().
  const void* wait();

 private:
  void* host_ = nullptr;   // the host buffer (page-locked when pinned_)
  size_t capacity_ = 0;
  bool pinned_ = false;
  void* event_ = nullptr;  // cudaEvent_t of the last CUDA start()
  bool pending_ = false;   // a start() not yet waited for
  bool on_device_ = false; // the pending copy is a device one (its event must be waited for)
};

}  // namespace megatron::ops
