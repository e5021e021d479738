#include "megatron/core/timers.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "megatron/core/ops/device.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/temp_file.h"

namespace megatron {

void Timer::start() {
  if (this->owner_ == nullptr) return;  // the no-op timer
  MEGATRON_CHECK(!started_) << "timer " << name_ << " has already been started";
  start_ = std::chrono::steady_clock::now();
  started_ = true;
  // Start/end profiler ranges (not push/pop): timers may stop out of nesting order.
  if (owner_->recording_) nvtx_range_ = ops::profiler_range_start(name_.c_str());
}

void Timer::stop() {
  if (this->owner_ == nullptr) return;
  MEGATRON_CHECK(started_) << "timer " << name_ << " is not started";
  const auto end = std::chrono::steady_clock::now();
  elapsed_ += std::chrono::duration<double>(end - start_).count();
  started_ = false;
  if (nvtx_range_) {
    ops::profiler_range_end(nvtx_range_);
    nvtx_range_ = 0;
  }
  if (owner_->recording_) owner_->record(name_, start_, end);
}

double Timer::elapsed(bool reset) {
  const bool was = started_;
  if (was) stop();
  const double e = elapsed_;
  if (reset) elapsed_ = 0.0;
  if (was) start();
  return e;
}

Timers::Timers(int log_level, std::string log_option)
    : log_level_(log_level), log_option_(std::move(log_option)), t0_(std::chrono::steady_clock::now()) {}

Timer& Timers::operator()(const std::string& name, int log_level) {
  auto it = timers_.find(name);
  if (it != timers_.end()) return *it->second;
  if (log_level > log_level_ && !recording_) return dummy_;  // --profile records every timer
  auto t = std::make_unique<Timer>(name);
  t->owner_ = this;
  order_.push_back(name);
  return *timers_.emplace(name, std::move(t)).first->second;
}

void Timers::record(const std::string& name, std::chrono::steady_clock::time_point a,
                    std::chrono::steady_clock::time_point b) {
  events_.push_back({name, std::chrono::duration<double, std::micro>(a - t0_).count(),
                     std::chrono::duration<double, std::micro>(b - a).count()});
}

std::string Timers::log_string(const std::vector<std::string>& names, double normalizer, bool reset) {
  MEGATRON_CHECK(normalizer > 0.0) << "normalizer " << normalizer;
  std::ostringstream os;
  bool any = false;
  const bool max_only = log_option_ == "max";
  const bool all = log_option_ == "all";
  os << (max_only ? "max time across ranks (ms):" : all ? "times across ranks (ms):" : "(min, max) time across ranks (ms):");
  char buf[256];
  for (const auto& n : names) {
    auto it = timers_.find(n);
    if (it == timers_.end()) continue;
    const double ms = it->second->elapsed(reset) * 1000.0 / normalizer;
    std::string label = n + " ";
    if (label.size() < 48) label.resize(48, '.');
    if (max_only) {
      std::snprintf(buf, sizeof(buf), "\n    %s: %.2f", label.c_str(), ms);
    } else if (all) {
      std::snprintf(buf, sizeof(buf), "\n  %s:\n     rank %2d: %.2f", n.c_str(), 0, ms);
    } else {
      std::snprintf(buf, sizeof(buf), "\n    %s: (%.2f, %.2f)", label.c_str(), ms, ms);
    }
    os << buf;
    any = true;
  }
  return any ? os.str() : std::string();
}

std::vector<double> Timers::elapsed_seconds(const std::vector<std::string>& names, bool reset) {
  std::vector<double> out;
  out.reserve(names.size());
  for (const auto& n : names) {
    auto it = timers_.find(n);
    out.push_back(it == timers_.end() ? 0.0 : it->second->elapsed(reset));
  }
  return out;
}

void Timers::write_chrome_trace(const std::string& path, int rank) const {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    if (ec) user_error("--profile: cannot create directory ", p.parent_path().string(), ": ", ec.message());
  }
  const std::string tmp = path + ".tmp";
  TempFileGuard guard(tmp);  // removed on every error below (e.g. a full disk)
  {
    std::ofstream f(tmp);
    if (!f) user_error("--profile: cannot write the trace file ", tmp);
    f << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
    f << "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << rank
      << ", \"tid\": 0, \"args\": {\"name\": \"rank " << rank << "\"}}";
    f << std::fixed << std::setprecision(3);
    for (const auto& e : events_) {
      std::string name;
      for (char c : e.name) {
        if (c == '"' || c == '\\') name += '\\';
        name += c;
      }
      f << ",\n  {\"name\": \"" << name << "\", \"cat\": \"timer\", \"ph\": \"X\", \"pid\": " << rank
        << ", \"tid\": 0, \"ts\": " << e.ts_us << ", \"dur\": " << e.dur_us << "}";
    }
    f << "\n]}\n";
    f.flush();
    if (!f) user_error("--profile: failed writing the trace file ", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) user_error("--profile: cannot rename ", tmp, " to ", path, ": ", ec.message());
  guard.release();
}

}  // namespace megatron
