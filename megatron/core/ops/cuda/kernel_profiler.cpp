// The recording half of the kernel profiler (megatron/core/utils/kernel_profile.h): the CUPTI
// Activity API records every kernel (NCCL's included), memcpy and memset of the profiled
// iterations with GPU start/end timestamps. libcupti is loaded with dlopen at the first start():
// no link dependency; without it one warning line is printed and training continues.
// Search order: $MEGATRON_CUPTI_LIB, libcupti.so.13, libcupti.so.12, libcupti.so (LD_LIBRARY_PATH,
// e.g. the PyTorch wheel's nvidia/cuda_cupti/lib), $CUDA_HOME/extras/CUPTI/lib64,
// /usr/local/cuda/extras/CUPTI/lib64, /usr/local/cuda/lib64.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "megatron/core/utils/kernel_profile.h"

#if __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#define MEGATRON_HAVE_CUPTI_HEADERS 1
#endif

namespace megatron::profiling {
namespace {

#ifdef MEGATRON_HAVE_CUPTI_HEADERS

// Records are read through the oldest layouts that carry the fields used here (kind, start,
// end, deviceId, streamId, name/copyKind/bytes): newer CUPTI versions append fields, so these
// prefixes are valid for the records of every CUPTI 11-13 (checked against the newest structs).
using KernelRecord = CUpti_ActivityKernel4;
using MemcpyRecord = CUpti_ActivityMemcpy5;
using MemsetRecord = CUpti_ActivityMemset4;
#define MEGATRON_SAME_OFFSET(A, B, f) static_assert(offsetof(A, f) == offsetof(B, f), #f)
#ifdef CUPTI_API_VERSION
#if CUPTI_API_VERSION >= 130000
MEGATRON_SAME_OFFSET(KernelRecord, CUpti_ActivityKernel10, start);
MEGATRON_SAME_OFFSET(KernelRecord, CUpti_ActivityKernel10, end);
MEGATRON_SAME_OFFSET(KernelRecord, CUpti_ActivityKernel10, deviceId);
MEGATRON_SAME_OFFSET(KernelRecord, CUpti_ActivityKernel10, streamId);
MEGATRON_SAME_OFFSET(KernelRecord, CUpti_ActivityKernel10, name);
MEGATRON_SAME_OFFSET(MemcpyRecord, CUpti_ActivityMemcpy6, start);
MEGATRON_SAME_OFFSET(MemcpyRecord, CUpti_ActivityMemcpy6, end);
MEGATRON_SAME_OFFSET(MemcpyRecord, CUpti_ActivityMemcpy6, bytes);
MEGATRON_SAME_OFFSET(MemcpyRecord, CUpti_ActivityMemcpy6, copyKind);
MEGATRON_SAME_OFFSET(MemcpyRecord, CUpti_ActivityMemcpy6, deviceId);
MEGATRON_SAME_OFFSET(MemcpyRecord, CUpti_ActivityMemcpy6, streamId);
#endif
#endif
#undef MEGATRON_SAME_OFFSET

struct CuptiApi {
  CUptiResult (*activity_enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*activity_disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*get_next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*get_timestamp)(uint64_t*) = nullptr;
  CUptiResult (*get_result_string)(CUptiResult, const char**) = nullptr;
  CUptiResult (*dropped)(CUcontext, uint32_t, size_t*) = nullptr;
  std::string path;
};

// Loads libcupti once; nullptr (with the reason in *why) when it is not found or incomplete.
const CuptiApi* cupti(std::string* why) {
  static std::once_flag once;
  static CuptiApi api;
  static bool ok = false;
  static std::string reason;
  std::call_once(once, [] {
    std::vector<std::string> names;
    if (const char* e = std::getenv("MEGATRON_CUPTI_LIB")) names.push_back(e);
    for (const char* n : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) names.push_back(n);
    if (const char* h = std::getenv("CUDA_HOME")) names.push_back(std::string(h) + "/extras/CUPTI/lib64/libcupti.so");
    for (const char* n : {"/usr/local/cuda/extras/CUPTI/lib64/libcupti.so", "/usr/local/cuda/lib64/libcupti.so",
                          "/usr/local/cuda/lib/libcupti.so"})
      names.push_back(n);
    void* h = nullptr;
    for (const auto& n : names) {
      h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h) {
        api.path = n;
        break;
      }
    }
    if (!h) {
      reason = "libcupti not found (set MEGATRON_CUPTI_LIB=/path/to/libcupti.so or add its folder to LD_LIBRARY_PATH)";
      return;
    }
    auto sym = [&](auto& fn, const char* s) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, s));
      if (!fn && reason.empty()) reason = api.path + " has no " + s;
    };
    sym(api.activity_enable, "cuptiActivityEnable");
    sym(api.activity_disable, "cuptiActivityDisable");
    sym(api.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(api.get_next_record, "cuptiActivityGetNextRecord");
    sym(api.flush_all, "cuptiActivityFlushAll");
    sym(api.get_timestamp, "cuptiGetTimestamp");
    sym(api.get_result_string, "cuptiGetResultString");
    sym(api.dropped, "cuptiActivityGetNumDroppedRecords");
    ok = reason.empty();
  });
  if (!ok && why) *why = reason;
  return ok ? &api : nullptr;
}

std::string result_text(const CuptiApi& api, CUptiResult r) {
  const char* s = nullptr;
  if (api.get_result_string && api.get_result_string(r, &s) == CUPTI_SUCCESS && s) return s;
  return "CUPTI error " + std::to_string(static_cast<int>(r));
}

// Records collected by the buffer callbacks (CUPTI calls them from its own thread).
std::mutex g_mu;
std::vector<Activity> g_records;
uint64_t g_dropped = 0;
constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
  }
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  const CuptiApi* api = cupti(nullptr);
  std::vector<Activity> got;
  CUpti_Activity* rec = nullptr;
  while (api && api->get_next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    Activity a;
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const KernelRecord*>(rec);
        a.kind = ActivityKind::kKernel;
        a.start_ns = k->start;
        a.end_ns = k->end;
        a.device = k->deviceId;
        a.stream = k->streamId;
        a.name = k->name ? k->name : "<unnamed kernel>";
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const MemcpyRecord*>(rec);
        a.kind = ActivityKind::kMemcpy;
        a.start_ns = m->start;
        a.end_ns = m->end;
        a.device = m->deviceId;
        a.stream = m->streamId;
        a.bytes = m->bytes;
        a.name = std::string("[memcpy ") + copy_kind(m->copyKind) + "]";
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const MemsetRecord*>(rec);
        a.kind = ActivityKind::kMemset;
        a.start_ns = m->start;
        a.end_ns = m->end;
        a.device = m->deviceId;
        a.stream = m->streamId;
        a.bytes = m->bytes;
        a.name = "[memset]";
        break;
      }
      default: continue;
    }
    got.push_back(std::move(a));
  }
  size_t dropped = 0;
  if (api && api->dropped) api->dropped(nullptr, 0, &dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_dropped += dropped;
  for (auto& a : got) g_records.push_back(std::move(a));
}

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET};

class CuptiKernelProfiler final : public KernelProfiler {
 public:
  bool start(int64_t first_iteration) override {
    std::string why;
    api_ = cupti(&why);
    if (!api_) {
      std::fprintf(stderr, "warning: kernel profile disabled: %s; training continues\n", why.c_str());
      return false;
    }
    static bool registered = false;
    if (!registered) {
      const CUptiResult r = api_->register_callbacks(buffer_requested, buffer_completed);
      if (r != CUPTI_SUCCESS) {
        std::fprintf(stderr, "warning: kernel profile disabled: cuptiActivityRegisterCallbacks: %s (%s); training continues\n",
                     result_text(*api_, r).c_str(), api_->path.c_str());
        return false;
      }
      registered = true;
    }
    cudaDeviceSynchronize();
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_records.clear();
      g_dropped = 0;
    }
    for (CUpti_ActivityKind k : kKinds) {
      const CUptiResult r = api_->activity_enable(k);
      if (r != CUPTI_SUCCESS) {
        std::fprintf(stderr, "warning: kernel profile disabled: cuptiActivityEnable(%d): %s; training continues\n",
                     static_cast<int>(k), result_text(*api_, r).c_str());
        for (CUpti_ActivityKind d : kKinds) api_->activity_disable(d);
        return false;
      }
    }
    first_ = first_iteration;
    api_->get_timestamp(&begin_);
    return true;
  }

  ProfileSummary stop(int64_t last_iteration, int rank) override {
    cudaDeviceSynchronize();
    uint64_t end = 0;
    api_->get_timestamp(&end);
    for (CUpti_ActivityKind k : kKinds) api_->activity_disable(k);
    api_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::vector<Activity> recs;
    uint64_t dropped = 0;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      recs.swap(g_records);
      dropped = g_dropped;
    }
    ProfileSummary s = summarize(recs, begin_, end, first_, last_iteration, rank);
    s.dropped_records = dropped;
    return s;
  }

 private:
  const CuptiApi* api_ = nullptr;
  int64_t first_ = 0;
  uint64_t begin_ = 0;
};

#else  // no CUPTI headers at build time

class CuptiKernelProfiler final : public KernelProfiler {
 public:
  bool start(int64_t) override {
    std::fprintf(stderr, "warning: kernel profile disabled: this build had no CUPTI headers (cupti_activity.h); "
                         "training continues\n");
    return false;
  }
  ProfileSummary stop(int64_t, int) override { return {}; }
};

#endif

// Registered from a static initializer (megatron_cuda is linked whole).
const bool g_registered = [] {
  set_kernel_profiler_factory([]() -> std::unique_ptr<KernelProfiler> { return std::make_unique<CuptiKernelProfiler>(); });
  return true;
}();

}  // namespace
}  // namespace megatron::profiling
