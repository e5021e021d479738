#include "megatron/core/utils/kernel_profile.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/temp_file.h"

namespace megatron::profiling {

namespace {

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::mutex g_factory_mu;
std::function<std::unique_ptr<KernelProfiler>()>& factory() {
  static std::function<std::unique_ptr<KernelProfiler>()> f;
  return f;
}

double ms(uint64_t ns) { return static_cast<double>(ns) * 1e-6; }

}  // namespace

const char* category_name(Category c) {
  switch (c) {
    case Category::kGemm: return "gemm";
    case Category::kAttention: return "attention";
    case Category::kOptimizer: return "optimizer";
    case Category::kOther: return "other";
    case Category::kMemcpy: return "memcpy";
    case Category::kMemset: return "memset";
    case Category::kCommunication: return "communication";
  }
  return "?";
}

Category categorize(ActivityKind kind, const std::string& raw) {
  if (kind == ActivityKind::kMemcpy) return Category::kMemcpy;
  if (kind == ActivityKind::kMemset) return Category::kMemset;
  const std::string n = lower(raw);
  if (has(n, "nccl")) return Category::kCommunication;
  // Attention first: cuDNN's fused attention kernels may also carry "gemm"/"cutlass"-like parts.
  for (const char* a : {"fa_fwd", "fa_bwd", "fa_dq_convert", "attention_merge", "sdpa", "fmha", "flash", "attention",
                        "attn"})
    if (has(n, a)) return Category::kAttention;
  for (const char* g : {"gemm", "gemv", "nvjet", "xmma", "cutlass", "cublas", "matmul"})
    if (has(n, g)) return Category::kGemm;
  // adam_multi: the multi-tensor Adam (ops/cuda/adam_multi.cu), the step of every device run.
  for (const char* o :
       {"adam_kernel", "adam_multi_kernel", "adam_multi_v2_kernel", "sgd_kernel", "reduce_stage1", "reduce_stage2", "multi_tensor"})
    if (has(n, o)) return Category::kOptimizer;
  return Category::kOther;
}

std::vector<Interval> interval_union(std::vector<Interval> v) {
  std::erase_if(v, [](const Interval& i) { return i.end <= i.begin; });
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, i.end);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

uint64_t union_length(std::vector<Interval> v) {
  uint64_t n = 0;
  for (const Interval& i : interval_union(std::move(v))) n += i.end - i.begin;
  return n;
}

uint64_t intersection_length(std::vector<Interval> a, std::vector<Interval> b) {
  const std::vector<Interval> ua = interval_union(std::move(a)), ub = interval_union(std::move(b));
  uint64_t n = 0;
  size_t i = 0, j = 0;
  while (i < ua.size() && j < ub.size()) {
    const uint64_t lo = std::max(ua[i].begin, ub[j].begin), hi = std::min(ua[i].end, ub[j].end);
    if (hi > lo) n += hi - lo;
    if (ua[i].end < ub[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return n;
}

std::string short_kernel_name(const std::string& name, size_t max_len) {
  std::string s = name;
  int status = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status == 0 && d) s = d;
  std::free(d);
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  if (s.size() > max_len) s = s.substr(0, max_len - 3) + "...";
  return s;
}

ProfileSummary summarize(const std::vector<Activity>& acts, uint64_t window_begin, uint64_t window_end,
                         int64_t first_iteration, int64_t last_iteration, int rank, size_t top_k, size_t top_gaps) {
  MEGATRON_CHECK(window_end >= window_begin) << "window " << window_begin << ".." << window_end;
  ProfileSummary s;
  s.rank = rank;
  s.first_iteration = first_iteration;
  s.last_iteration = last_iteration;
  s.steps = last_iteration - first_iteration + 1;
  s.wall_ms = ms(window_end - window_begin);

  // Activities clipped to the window.
  struct A {
    uint64_t b, e;
    Category c;
    const Activity* src;
  };
  std::vector<A> v;
  for (const Activity& a : acts) {
    const uint64_t b = std::max(a.start_ns, window_begin), e = std::min(a.end_ns, window_end);
    if (e <= b) continue;
    v.push_back({b, e, categorize(a.kind, a.name), &a});
  }

  // Totals, counts, union, communication overlap.
  std::vector<Interval> all, comm, rest;
  std::map<std::string, KernelStat> per_name;
  for (const A& a : v) {
    const int c = static_cast<int>(a.c);
    s.total_ms[c] += ms(a.e - a.b);
    s.count[c] += 1;
    all.push_back({a.b, a.e});
    (a.c == Category::kCommunication ? comm : rest).push_back({a.b, a.e});
    KernelStat& k = per_name[a.src->name];
    k.category = a.c;
    k.count += 1;
    k.total_us += static_cast<double>(a.e - a.b) * 1e-3;
  }
  s.busy_ms = ms(union_length(all));
  s.idle_ms = s.wall_ms - s.busy_ms;
  s.comm_overlapped_ms = ms(intersection_length(comm, rest));

  // Exclusive split of busy time: sweep over start/end events; each elementary segment goes to
  // the highest-priority category running in it.
  std::vector<std::pair<uint64_t, int>> ev;  // (time, +/-(category+1))
  for (const A& a : v) {
    ev.push_back({a.b, static_cast<int>(a.c) + 1});
    ev.push_back({a.e, -(static_cast<int>(a.c) + 1)});
  }
  std::sort(ev.begin(), ev.end());
  int64_t running[kNumCategories] = {};
  for (size_t i = 0; i < ev.size();) {
    const uint64_t t = ev[i].first;
    for (; i < ev.size() && ev[i].first == t; ++i) {
      const int c = std::abs(ev[i].second) - 1;
      running[c] += ev[i].second > 0 ? 1 : -1;
    }
    if (i == ev.size()) break;
    const uint64_t next = ev[i].first;
    for (int c = 0; c < kNumCategories; ++c) {
      if (running[c] > 0) {
        s.exclusive_ms[c] += ms(next - t);
        break;
      }
    }
  }

  // Top kernels.
  for (auto& [name, k] : per_name) {
    k.name = short_kernel_name(name);
    s.top_kernels.push_back(k);
  }
  std::sort(s.top_kernels.begin(), s.top_kernels.end(),
            [](const KernelStat& a, const KernelStat& b) { return a.total_us > b.total_us; });
  if (s.top_kernels.size() > top_k) s.top_kernels.resize(top_k);

  // Idle gaps: walk the activities by start time keeping the furthest end seen so far.
  std::sort(v.begin(), v.end(), [](const A& a, const A& b) { return a.b < b.b || (a.b == b.b && a.e > b.e); });
  std::vector<Gap> gaps;
  uint64_t cur = window_begin;
  std::string before = "<window start>";
  for (const A& a : v) {
    if (a.b > cur) gaps.push_back({cur, a.b, before, short_kernel_name(a.src->name, 60)});
    if (a.e > cur) {
      cur = a.e;
      before = short_kernel_name(a.src->name, 60);
    }
  }
  if (window_end > cur) gaps.push_back({cur, window_end, before, "<window end>"});
  for (const Gap& g : gaps) {
    const uint64_t len = g.end - g.begin;
    const int b = len < 10000 ? 0 : len < 100000 ? 1 : len < 1000000 ? 2 : 3;
    s.gap_count[b] += 1;
    s.gap_ms[b] += ms(len);
  }
  std::stable_sort(gaps.begin(), gaps.end(),
                   [](const Gap& a, const Gap& b) { return a.end - a.begin > b.end - b.begin; });
  if (gaps.size() > top_gaps) gaps.resize(top_gaps);
  for (Gap& g : gaps) g.at_ms = ms(g.begin - window_begin);
  s.longest_gaps = std::move(gaps);
  return s;
}

std::string format_summary(const ProfileSummary& s) {
  std::ostringstream os;
  char buf[512];
  const std::string p = "[Rank " + std::to_string(s.rank) + "] kernel profile | ";
  const double n = static_cast<double>(std::max<int64_t>(s.steps, 1));
  const double wall = std::max(s.wall_ms, 1e-12);
  std::snprintf(buf, sizeof(buf),
                "iterations %lld-%lld (%lld steps) | wall %.3f ms/step | GPU busy %.3f ms/step (%.1f%%) | "
                "GPU idle (host gaps) %.3f ms/step (%.1f%%)%s",
                static_cast<long long>(s.first_iteration), static_cast<long long>(s.last_iteration),
                static_cast<long long>(s.steps), s.wall_ms / n, s.busy_ms / n, 100.0 * s.busy_ms / wall, s.idle_ms / n,
                100.0 * s.idle_ms / wall,
                s.dropped_records ? (" | WARNING: " + std::to_string(s.dropped_records) + " records dropped").c_str()
                                  : "");
  os << p << buf << "\n";
  std::snprintf(buf, sizeof(buf), "%-15s %14s %8s %18s %12s", "category", "ms/step", "% wall", "kernel ms/step",
                "count/step");
  os << p << buf << "\n";
  for (int c = 0; c < kNumCategories; ++c) {
    std::snprintf(buf, sizeof(buf), "%-15s %14.3f %8.1f %18.3f %12.1f", category_name(static_cast<Category>(c)),
                  s.exclusive_ms[c] / n, 100.0 * s.exclusive_ms[c] / wall, s.total_ms[c] / n,
                  static_cast<double>(s.count[c]) / n);
    os << p << buf << "\n";
  }
  std::snprintf(buf, sizeof(buf), "%-15s %14.3f %8.1f", "idle", s.idle_ms / n, 100.0 * s.idle_ms / wall);
  os << p << buf << "\n";
  std::snprintf(buf, sizeof(buf),
                "(ms/step: busy time split by priority gemm > attention > optimizer > other > memcpy > memset > "
                "communication, so the rows + idle sum to wall; communication overlapped with other work: %.3f "
                "ms/step)",
                s.comm_overlapped_ms / n);
  os << p << buf << "\n";
  os << p << "top " << s.top_kernels.size() << " kernels by time: ms/step | count/step | mean us | category | name\n";
  for (const KernelStat& k : s.top_kernels) {
    std::snprintf(buf, sizeof(buf), "%10.3f %8.1f %10.2f  %-13s %s", k.total_us * 1e-3 / n,
                  static_cast<double>(k.count) / n, k.total_us / static_cast<double>(std::max<int64_t>(k.count, 1)),
                  category_name(k.category), k.name.c_str());
    os << p << buf << "\n";
  }
  std::snprintf(buf, sizeof(buf),
                "idle gaps by length (count/step, ms/step): < 10 us: %.1f, %.3f | 10-100 us: %.1f, %.3f | "
                "0.1-1 ms: %.1f, %.3f | >= 1 ms: %.1f, %.3f",
                s.gap_count[0] / n, s.gap_ms[0] / n, s.gap_count[1] / n, s.gap_ms[1] / n, s.gap_count[2] / n,
                s.gap_ms[2] / n, s.gap_count[3] / n, s.gap_ms[3] / n);
  os << p << buf << "\n";
  os << p << "longest GPU idle gaps: ms | at ms from window start | last activity before -> first activity after\n";
  for (const Gap& g : s.longest_gaps) {
    std::snprintf(buf, sizeof(buf), "%9.3f %12.3f  %s -> %s", ms(g.end - g.begin), g.at_ms,
                  g.before.c_str(), g.after.c_str());
    os << p << buf << "\n";
  }
  return os.str();
}

nlohmann::json summary_json(const ProfileSummary& s) {
  nlohmann::json j;
  j["rank"] = s.rank;
  j["first_iteration"] = s.first_iteration;
  j["last_iteration"] = s.last_iteration;
  j["steps"] = s.steps;
  j["wall_ms"] = s.wall_ms;
  j["busy_ms"] = s.busy_ms;
  j["idle_ms"] = s.idle_ms;
  j["communication_overlapped_ms"] = s.comm_overlapped_ms;
  j["dropped_records"] = s.dropped_records;
  nlohmann::json cats = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c)
    cats[category_name(static_cast<Category>(c))] = {
        {"exclusive_ms", s.exclusive_ms[c]}, {"total_ms", s.total_ms[c]}, {"count", s.count[c]}};
  j["categories"] = cats;
  nlohmann::json top = nlohmann::json::array();
  for (const KernelStat& k : s.top_kernels)
    top.push_back({{"name", k.name}, {"category", category_name(k.category)}, {"count", k.count},
                   {"total_us", k.total_us}});
  j["top_kernels"] = top;
  nlohmann::json gaps = nlohmann::json::array();
  for (const Gap& g : s.longest_gaps)
    gaps.push_back({{"ms", ms(g.end - g.begin)}, {"at_ms", g.at_ms}, {"before", g.before}, {"after", g.after}});
  j["longest_gaps"] = gaps;
  nlohmann::json by = nlohmann::json::array();
  const char* names[4] = {"<10us", "10-100us", "0.1-1ms", ">=1ms"};
  for (int b = 0; b < 4; ++b) by.push_back({{"length", names[b]}, {"count", s.gap_count[b]}, {"ms", s.gap_ms[b]}});
  j["idle_gaps_by_length"] = by;
  return j;
}

std::unique_ptr<KernelProfiler> make_kernel_profiler() {
  std::lock_guard<std::mutex> lock(g_factory_mu);
  return factory() ? factory()() : nullptr;
}

void set_kernel_profiler_factory(std::function<std::unique_ptr<KernelProfiler>()> f) {
  std::lock_guard<std::mutex> lock(g_factory_mu);
  factory() = std::move(f);
}

void write_summary_json(const ProfileSummary& s, const std::string& path) {
  const std::string tmp = path + ".tmp";
  TempFileGuard guard(tmp);  // removed on every error below (e.g. a full disk)
  {
    std::ofstream f(tmp);
    if (!f) user_error("kernel profile: cannot write ", path, " (check MEGATRON_KERNEL_PROFILE_OUT / --tensorboard-dir)");
    f << summary_json(s).dump(1) << "\n";
    if (!f) user_error("kernel profile: cannot write ", path);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) user_error("kernel profile: cannot rename ", tmp, " to ", path, ": ", ec.message());
  guard.release();
}

}  // namespace megatron::profiling
