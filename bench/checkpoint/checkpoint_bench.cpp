// Checkpoint save/load throughput, async-save cost, and the kill -9 target of
// tests/functional_tests/ckpt_kill9.sh.
//
//   checkpoint_bench bench  --dir D [--size-mb 1024] [--tensors 32] [--repeat 3]
//       sync save GB/s (incl. fsync), cold load GB/s (files evicted from the page cache with
//       posix_fadvise DONTNEED), warm load GB/s, async save: time until save returns (snapshot)
//       and the slowdown of a compute loop running while the background write happens.
//   checkpoint_bench load   --dir D [--size-mb 1024] [--repeat 3]   loads the existing checkpoint
//       (e.g. left by `bench`) R times, each timed: the first after evicting the files, then warm.
//   checkpoint_bench loop   --dir D [--size-mb 64]   saves iteration 1, 2, ... until killed
//   checkpoint_bench verify --dir D [--size-mb 64]   loads the tracker's iteration and checks
//       every element (= iteration + tensor index); exit 0 when correct.
// Figures go to docs/performance.md; nothing here is asserted by CI except verify's exit code.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "megatron/core/dist_checkpointing/serialization.h"
#include "megatron/training/checkpointing.h"

using namespace megatron;
namespace fs = std::filesystem;
namespace dc = megatron::dist_checkpointing;
namespace tr = megatron::training;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Opts {
  std::string mode, dir;
  int64_t size_mb = 64;
  int tensors = 32;
  int repeat = 3;
};

Opts parse(int argc, char** argv) {
  Opts o;
  if (argc < 2) user_error("usage: checkpoint_bench bench|load|loop|verify --dir D [--size-mb N] [--tensors K] [--repeat R]");
  o.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") o.dir = v;
    else if (k == "--size-mb") o.size_mb = std::stoll(v);
    else if (k == "--tensors") o.tensors = std::stoi(v);
    else if (k == "--repeat") o.repeat = std::stoi(v);
    else user_error("checkpoint_bench: unknown flag ", k);
  }
  if (o.dir.empty()) user_error("checkpoint_bench: --dir is required");
  return o;
}

// `n` fp32 tensors of equal size, stacked as decoder layers, totalling size_mb.
tr::TrainingState make_state(const Opts& o, std::vector<Tensor>& keep) {
  const int64_t per = o.size_mb * (1 << 20) / 4 / o.tensors;
  const int64_t cols = 1024, rows = std::max<int64_t>(1, per / cols);
  tr::TrainingState st;
  keep.clear();
  for (int i = 0; i < o.tensors; ++i) {
    keep.push_back(Tensor::empty({rows, cols}, DType::kFloat32));
    auto v = tr::model_sharded_tensors("decoder.layers." + std::to_string(i) + ".mlp.linear_fc1.weight", keep.back(),
                                       {0, false}, o.tensors, {});
    st.model.insert(st.model.end(), v.begin(), v.end());
  }
  return st;
}

void fill(std::vector<Tensor>& keep, int64_t it) {
  for (size_t i = 0; i < keep.size(); ++i) keep[i].fill_(static_cast<float>(it + static_cast<int64_t>(i)));
}

void evict(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd >= 0) {
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
}

// A fixed amount of single-threaded arithmetic standing in for a training step.
double compute_step(std::vector<float>& a) {
  double s = 0;
  for (int rep = 0; rep < 20; ++rep)
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = a[i] * 0.999f + 0.001f;
      s += a[i];
    }
  return s;
}

int bench(const Opts& o) {
  std::vector<Tensor> keep;
  tr::TrainingState st = make_state(o, keep);
  fill(keep, 1);
  const double gb = static_cast<double>(keep.size()) * keep[0].nbytes() / 1e9;
  tr::CheckpointConfig cfg;
  cfg.save = cfg.load = o.dir;
  std::printf("checkpoint_bench: %.3f GB in %zu fp32 tensors, dir %s\n", gb, keep.size(), o.dir.c_str());
  double best_save = 1e30, best_cold = 1e30, best_warm = 1e30;
  for (int r = 0; r < o.repeat; ++r) {
    st.iteration = r + 1;
    double t0 = now();
    tr::save_checkpoint(st, cfg, {});
    best_save = std::min(best_save, now() - t0);
    evict(o.dir);
    t0 = now();
    tr::load_checkpoint(st, cfg, {});
    best_cold = std::min(best_cold, now() - t0);
    t0 = now();
    tr::load_checkpoint(st, cfg, {});
    best_warm = std::min(best_warm, now() - t0);
  }
  // async: compute loop alone vs. with a background save
  std::vector<float> work(1 << 22, 1.0f);
  double t0 = now();
  int steps = 0;
  while (now() - t0 < 2.0) {
    compute_step(work);
    ++steps;
  }
  const double step_alone = (now() - t0) / steps;
  cfg.async_save = true;
  st.iteration = 100;
  t0 = now();
  tr::save_checkpoint(st, cfg, {});
  const double snapshot = now() - t0;
  int overlapped = 0;
  double t1 = now();
  while (!tr::maybe_finalize_async_save(nullptr, false)) {
    compute_step(work);
    ++overlapped;
  }
  const double async_total = now() - t0;
  const double step_during = overlapped ? (now() - t1) / overlapped : 0.0;
  std::printf("RESULT save_sync_s %.3f save_GBps %.3f\n", best_save, gb / best_save);
  std::printf("RESULT load_cold_s %.3f load_cold_GBps %.3f\n", best_cold, gb / best_cold);
  std::printf("RESULT load_warm_s %.3f load_warm_GBps %.3f\n", best_warm, gb / best_warm);
  std::printf("RESULT async_blocking_s %.3f async_total_s %.3f step_alone_ms %.1f step_during_save_ms %.1f (%d steps)\n",
              snapshot, async_total, step_alone * 1e3, step_during * 1e3, overlapped);
  return 0;
}

int load_only(const Opts& o) {
  std::vector<Tensor> keep;
  tr::TrainingState st = make_state(o, keep);
  const double gb = static_cast<double>(keep.size()) * keep[0].nbytes() / 1e9;
  tr::CheckpointConfig cfg;
  cfg.load = o.dir;
  cfg.exit_on_missing_checkpoint = true;
  evict(o.dir);
  for (int r = 0; r < o.repeat; ++r) {
    const double t0 = now();
    tr::load_checkpoint(st, cfg, {});
    const double dt = now() - t0;
    std::printf("RESULT load_%s_s %.3f load_GBps %.3f\n", r == 0 ? "cold" : "warm", dt, gb / dt);
  }
  return 0;
}

int loop(const Opts& o) {
  std::vector<Tensor> keep;
  tr::TrainingState st = make_state(o, keep);
  tr::CheckpointConfig cfg;
  cfg.save = o.dir;
  for (int64_t it = 1;; ++it) {
    fill(keep, it);
    st.iteration = it;
    tr::save_checkpoint(st, cfg, {});
    std::printf("saved %lld\n", static_cast<long long>(it));
    std::fflush(stdout);
  }
}

int verify(const Opts& o) {
  std::vector<Tensor> keep;
  tr::TrainingState st = make_state(o, keep);
  tr::CheckpointConfig cfg;
  cfg.load = o.dir;
  cfg.exit_on_missing_checkpoint = true;
  tr::LoadResult r = tr::load_checkpoint(st, cfg, {});
  for (size_t i = 0; i < keep.size(); ++i) {
    const float want = static_cast<float>(r.iteration + static_cast<int64_t>(i));
    const float* p = keep[i].data<float>();
    for (int64_t k = 0; k < keep[i].numel(); ++k)
      if (p[k] != want) {
        std::printf("verify: tensor %zu element %lld is %g, expected %g\n", i, static_cast<long long>(k), p[k], want);
        return 1;
      }
  }
  std::printf("verified iteration %lld\n", static_cast<long long>(r.iteration));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Opts o = parse(argc, argv);
    if (o.mode == "bench") return bench(o);
    if (o.mode == "loop") return loop(o);
    if (o.mode == "load") return load_only(o);
    if (o.mode == "verify") return verify(o);
    user_error("checkpoint_bench: unknown mode ", o.mode, " (bench, load, loop, verify)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
