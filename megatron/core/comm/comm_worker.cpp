#include "megatron/core/comm/comm_worker.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

namespace megatron::comm {

namespace {
std::atomic<int64_t> g_timeout_ms{10 * 60 * 1000};
std::atomic<int> g_rank{-1};
std::mutex g_hook_mu;
std::function<void(int)> g_abort_hook;

// The watchdog: one thread watching every started, unfinished operation.
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog();  // never destroyed: may outlive static destructors
    return *w;
  }
  void add(const std::shared_ptr<WorkState>& s) {
    std::lock_guard<std::mutex> l(mu_);
    active_.insert(s);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  void remove(const std::shared_ptr<WorkState>& s) {
    std::lock_guard<std::mutex> l(mu_);
    active_.erase(s);
  }

 private:
  void loop() {
    for (;;) {
      const int64_t timeout = g_timeout_ms.load();
      std::this_thread::sleep_for(std::chrono::milliseconds(std::clamp<int64_t>(timeout / 20, 20, 1000)));
      std::string late;
      {
        std::lock_guard<std::mutex> l(mu_);
        auto now = std::chrono::steady_clock::now();
        for (const auto& s : active_) {
          std::lock_guard<std::mutex> sl(s->mu);
          if (s->started && !s->done &&
              std::chrono::duration_cast<std::chrono::milliseconds>(now - s->start).count() > timeout) {
            late = s->description;
            break;
          }
        }
      }
      if (!late.empty()) {
        std::ostringstream os;
        os << "watchdog: " << late << " did not complete within " << timeout / 1000.0
           << " s (--distributed-timeout-minutes); a peer rank has likely died, hung or skipped this "
              "collective. Ending the job.";
        abort_job(os.str(), 1);
      }
    }
  }
  std::mutex mu_;
  std::set<std::shared_ptr<WorkState>> active_;
  std::thread thread_;
};
}  // namespace

void set_distributed_timeout(std::chrono::milliseconds t) {
  MEGATRON_CHECK(t.count() > 0) << "timeout " << t.count();
  g_timeout_ms = t.count();
}
std::chrono::milliseconds distributed_timeout() { return std::chrono::milliseconds(g_timeout_ms.load()); }
void set_global_rank_for_messages(int rank) { g_rank = rank; }
int global_rank_for_messages() { return g_rank; }

void set_job_abort_hook(std::function<void(int)> hook) {
  std::lock_guard<std::mutex> l(g_hook_mu);
  g_abort_hook = std::move(hook);
}

void run_job_abort_hook(int code) {
  std::function<void(int)> hook;
  {
    std::lock_guard<std::mutex> l(g_hook_mu);
    hook = g_abort_hook;
  }
  if (hook) hook(code);
}

void abort_job(const std::string& message, int code) {
  int r = g_rank.load();
  if (r >= 0)
    std::fprintf(stderr, "[rank %d] %s\n", r, message.c_str());
  else
    std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::function<void(int)> hook;
  {
    std::lock_guard<std::mutex> l(g_hook_mu);
    hook = g_abort_hook;
  }
  if (hook) hook(code);
  std::_Exit(code);
}

void QueuedWork::wait() {
  std::unique_lock<std::mutex> l(s_->mu);
  s_->cv.wait(l, [&] { return s_->done; });
  if (s_->error) std::rethrow_exception(s_->error);
}

bool QueuedWork::is_completed() {
  std::lock_guard<std::mutex> l(s_->mu);
  return s_->done;
}

CommWorker::CommWorker() : thread_([this] { loop(); }) {}
CommWorker::~CommWorker() { shutdown(); }

void CommWorker::shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();
    else
      thread_.join();
  }
}

std::shared_ptr<WorkState> CommWorker::submit(std::string description, std::function<void()> fn) {
  auto st = std::make_shared<WorkState>();
  st->description = std::move(description);
  {
    std::lock_guard<std::mutex> l(mu_);
    MEGATRON_CHECK(!stop_) << "collective submitted after the group was shut down: " << st->description;
    q_.emplace_back(st, std::move(fn));
  }
  cv_.notify_one();
  return st;
}

void CommWorker::run_sync(std::string description, std::function<void()> fn) {
  QueuedWork(submit(std::move(description), std::move(fn))).wait();
}

void CommWorker::loop() {
  for (;;) {
    std::pair<std::shared_ptr<WorkState>, std::function<void()>> item;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      item = std::move(q_.front());
      q_.pop_front();
    }
    auto& st = item.first;
    {
      std::lock_guard<std::mutex> l(st->mu);
      st->start = std::chrono::steady_clock::now();
      st->started = true;
    }
    Watchdog::get().add(st);
    std::exception_ptr err;
    try {
      item.second();
    } catch (...) {
      err = std::current_exception();
    }
    // Release what the operation captured (its tensors) before reporting completion: otherwise a
    // waiter may run on while this thread still holds the last operation's buffers.
    item.second = nullptr;
    Watchdog::get().remove(st);
    {
      std::lock_guard<std::mutex> l(st->mu);
      st->error = err;
      st->done = true;
    }
    st->cv.notify_all();
  }
}

std::unique_ptr<Work> finish(std::shared_ptr<WorkState> st, bool async) {
  auto w = std::make_unique<QueuedWork>(std::move(st));
  if (!async) w->wait();
  return w;
}

}  // namespace megatron::comm
