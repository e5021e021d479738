// Dataset index build and loader throughput (not a test; figures go to docs/performance.md).
//
//   dataset_index_bench [--tokens 1000000000] [--seq-length 4096] [--dir /tmp/megatron_ds_bench]
//                       [--train-samples N] [--seconds 5]
//
// Writes a synthetic uint16 dataset of about --tokens tokens (sequence lengths from
// numpy default_rng(1).integers(1, 2048)) once, then times, like Megatron's pretrain_gpt with
// --split 969,30,1: building the GPTDataset indices of all three splits and writing the cache,
// loading them back from the cache, the MockGPTDataset build, and the loader (samples/s, mbs 4).
// bench/datasets/megatron_index_bench.py times Megatron-LM's own code on the same files.
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/datasets/numpy_random.h"
#include "megatron/core/tokenizers/null_tokenizer.h"
#include "megatron/training/datasets/data_samplers.h"

using namespace megatron::datasets;
namespace fs = std::filesystem;

static double cpu() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  int64_t tokens = 1000000000;
  int64_t seq = 4096;
  int64_t train_samples = -1;
  double seconds = 5;
  std::string dir = "/tmp/megatron_ds_bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--tokens") tokens = std::atoll(argv[i + 1]);
    else if (a == "--seq-length") seq = std::atoll(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
    else if (a == "--train-samples") train_samples = std::atoll(argv[i + 1]);
    else if (a == "--seconds") seconds = std::atof(argv[i + 1]);
  }
  const std::string prefix = dir + "/bench_text_document";
  fs::create_directories(dir);
  if (!fs::exists(prefix + ".idx")) {
    double t0 = now();
    NumpyDefaultRng rng(1);
    IndexedDatasetBuilder b(prefix + ".bin", IndexDType::kUInt16);
    int64_t written = 0, i = 0;
    std::vector<int64_t> t;
    while (written < tokens) {
      const int32_t len = rng.integers_int32(1, 2048, 1)[0];
      t.resize(len);
      for (int32_t j = 0; j < len; ++j) t[j] = (i + j) % 50000;
      t[len - 1] = 50000;
      b.add_item(t);
      b.end_document();
      written += len;
      ++i;
    }
    b.finalize(prefix + ".idx");
    std::printf("wrote %lld tokens in %lld sequences (%.1f s)\n", (long long)written, (long long)i, now() - t0);
  }
  if (train_samples < 0) train_samples = static_cast<int64_t>(0.969 * tokens / seq);
  const std::string cache = dir + "/cache_cpp";
  fs::remove_all(cache);
  auto cfg = std::make_shared<GPTDatasetConfig>();
  cfg->random_seed = 1234;
  cfg->sequence_length = seq;
  cfg->blend = Blend{{prefix}, std::nullopt};
  cfg->split = "969,30,1";
  cfg->path_to_cache = cache;
  cfg->tokenizer = std::make_shared<megatron::tokenizers::NullTokenizer>(50001, std::nullopt, -1);
  cfg->finalize();
  SplitSizes sizes{train_samples, train_samples / 100, train_samples / 1000};

  double t0 = now(), c0 = cpu();
  auto ds = BlendedMegatronDatasetBuilder(sizes, nullptr, cfg).build();
  const double t_build = now() - t0, c_build = cpu() - c0;
  t0 = now();
  c0 = cpu();
  auto again = BlendedMegatronDatasetBuilder(sizes, nullptr, cfg).build();
  const double t_load = now() - t0, c_load = cpu() - c0;
  auto* train = dynamic_cast<GPTDataset*>(ds[0].get());
  std::printf("index build (3 splits, incl. writing the cache): %.3f s wall, %.3f s CPU; train samples %lld, document_index %lld\n",
              t_build, c_build, (long long)train->size(), (long long)train->document_index().numel());
  std::printf("index load from cache: %.3f s wall, %.3f s CPU\n", t_load, c_load);

  auto mcfg = std::make_shared<GPTDatasetConfig>();
  mcfg->random_seed = 1234;
  mcfg->sequence_length = seq;
  mcfg->tokenizer = cfg->tokenizer;
  mcfg->finalize();
  t0 = now();
  c0 = cpu();
  auto mock = BlendedMegatronDatasetBuilder({train_samples, train_samples / 100, train_samples / 1000}, nullptr, mcfg).build();
  std::printf("MockGPTDataset build (3 splits, seq %lld): %.3f s wall, %.3f s CPU\n", (long long)seq, now() - t0, cpu() - c0);

  for (int workers : {0, 2}) {
    megatron::training::DataLoaderOptions o;
    o.micro_batch_size = 4;
    o.num_workers = workers;
    megatron::training::GPTDataLoader loader(ds[0], o);
    GPTBatch b;
    int64_t n = 0;
    t0 = now();
    while (now() - t0 < seconds && loader.next(b)) n += 4;
    const double dt = now() - t0;
    std::printf("loader (mbs 4, seq %lld, num_workers %d): %.0f samples/s, %.2f Mtokens/s\n", (long long)seq, workers,
                n / dt, n * seq / dt / 1e6);
  }
  return 0;
}
