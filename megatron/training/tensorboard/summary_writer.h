// TensorBoard event-file writer (the part of torch.utils.tensorboard.SummaryWriter Megatron uses:
// add_scalar, flush, close).
//
// File: <log_dir>/events.out.tfevents.<%010d unix time>.<hostname>.<pid>.<n> (n counts writers
// created by this process, from 0). Records use TFRecord framing:
//   uint64 length (LE) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// with masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 over CRC-32C. Each record is a
// serialized tensorboard.Event (schema: tensorboard_event.proto beside this file, TensorBoard's
// field numbers; encoded by hand, see there why); the first one has file_version "brain.Event:2".
//
// Event files are append-only logs that TensorBoard tails while they grow, so — unlike our other
// outputs — they are not written under a temporary name. Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace megatron::training {

class SummaryWriter {
 public:
  /// Creates log_dir if needed and opens a new event file in it. flush_secs: add_scalar flushes
  /// when this many seconds passed since the last flush (torch's default is 120). max_queue:
  /// add_scalar flushes when this many events are pending (torch's SummaryWriter max_queue,
  /// default 10; Megatron passes --tensorboard-queue-size, default 1000); must be >= 1.
  /// Throws UserError naming the directory/file when it cannot be created.
  explicit SummaryWriter(const std::string& log_dir, double flush_secs = 120.0, int64_t max_queue = 10);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  /// Appends one scalar (TensorBoard simple_value, float32) at `step`; wall_time = now, or the
  /// given seconds since the epoch when wall_time >= 0.
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time = -1.0);
  /// Pushes buffered records to the file (TensorBoard sees them afterwards).
  void flush();
  /// Flushes and closes; further calls throw. Called by the destructor.
  void close();
  /// Path of the event file.
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* f_ = nullptr;
  double flush_secs_;
  double last_flush_ = 0.0;
  int64_t max_queue_ = 10;
  int64_t pending_ = 0;  // events written since the last flush
};

}  // namespace megatron::training
