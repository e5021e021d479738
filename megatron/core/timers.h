// Timers with log levels (megatron/core/timers.py) and an event recorder for --profile traces.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace megatron {

/// One named wall-clock timer. elapsed() returns seconds accumulated since the last reset.
class Timer {
 public:
  explicit Timer(std::string name) : name_(std::move(name)) {}
  void start();
  void stop();
  /// Accumulated seconds (including a running interval); resets the accumulator when `reset`.
  double elapsed(bool reset = true);
  bool active() const { return started_; }
  const std::string& name() const { return name_; }

 private:
  friend class Timers;
  std::string name_;
  bool started_ = false;
  std::chrono::steady_clock::time_point start_;
  double elapsed_ = 0.0;
  uint64_t nvtx_range_ = 0;  // open profiler range while recording (ops/device.h), 0 = none
  class Timers* owner_ = nullptr;
};

/// A complete event for a Chrome/Perfetto trace ("ph":"X").
struct TraceEvent {
  std::string name;
  double ts_us;   // start, microseconds since the Timers object was created
  double dur_us;  // duration, microseconds
};

/// Megatron's Timers: timers(name, log_level) returns the named timer if log_level <=
/// --timing-log-level, else a no-op timer. log_string() renders Megatron's
/// "(min, max) time across ranks (ms):" block (single rank: min == max).
class Timers {
 public:
  Timers(int log_level, std::string log_option);
  Timer& operator()(const std::string& name, int log_level = 0);
  /// Megatron's timers.log() text for `names` (skipping unknown ones), times divided by
  /// `normalizer`, in ms. Returns "" when nothing is to be printed.
  std::string log_string(const std::vector<std::string>& names, double normalizer = 1.0, bool reset = true);
  /// This rank's accumulated seconds of each of `names` (0 for a timer that does not exist here),
  /// reset when `reset`: one row of Megatron's _get_elapsed_time_all_ranks.
  std::vector<double> elapsed_seconds(const std::vector<std::string>& names, bool reset);
  const std::string& log_option() const { return log_option_; }
  /// Starts / stops recording every timer interval as a trace event (--profile window). In a
  /// CUDA build every recorded interval is also an NVTX range named after the timer, so
  /// Nsight Systems (nsys profile) shows the same steps on its timeline.
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }
  const std::vector<TraceEvent>& events() const { return events_; }
  void clear_events() { events_.clear(); }
  /// Writes events as Chrome trace JSON ({"traceEvents": [...]}) to `path` (temp file + rename).
  /// Throws UserError naming the path when it cannot be written.
  void write_chrome_trace(const std::string& path, int rank) const;

 private:
  friend class Timer;
  void record(const std::string& name, std::chrono::steady_clock::time_point a,
              std::chrono::steady_clock::time_point b);
  int log_level_;
  std::string log_option_;
  std::map<std::string, std::unique_ptr<Timer>> timers_;
  std::vector<std::string> order_;
  Timer dummy_{"dummy"};
  bool recording_ = false;
  std::vector<TraceEvent> events_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace megatron
