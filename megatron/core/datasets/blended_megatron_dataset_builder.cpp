#include "megatron/core/datasets/blended_megatron_dataset_builder.h"

#include <cmath>

#include "megatron/core/utils/errors.h"

namespace megatron::datasets {

namespace {
// Weights and size of one split's BlendedDataset (Megatron's builder): with --data-path weights,
// the weights as given and the sum of the per-dataset target sizes; without weights, each
// dataset's own size as its weight and min(requested, sum of sizes).
struct BlendSpec {
  std::vector<double> weights;
  bool weights_are_sizes = false;
  std::optional<int64_t> size;
};

BlendSpec blend_spec(const std::vector<std::shared_ptr<GPTDataset>>& ds,
                     const std::optional<std::vector<double>>& weights, const std::vector<SplitSizes>& target,
                     const std::optional<int64_t>& requested, int i, const char* what) {
  BlendSpec b;
  if (weights && requested) {
    b.weights = *weights;
    int64_t sum = 0;
    for (auto& t : target) sum += *t[i];
    b.size = sum;
  } else if (!weights) {
    b.weights_are_sizes = true;
    int64_t sum = 0;
    for (auto& d : ds) {
      b.weights.push_back(d ? static_cast<double>(d->size()) : 0.0);
      sum += d ? d->size() : 0;
    }
    if (requested) b.size = std::min(*requested, sum);
  } else {
    user_error(what, " a requested size for the ", split_name(static_cast<Split>(i)), " split");
  }
  return b;
}
}  // namespace

SplitSizes get_train_valid_test_num_samples(const NumSamplesArgs& a) {
  // With --train-samples, Megatron's argument validation sets train_iters = samples // gbs.
  const int64_t train_iters = a.train_samples ? *a.train_samples / a.global_batch_size : a.train_iters;
  const int64_t train_samples = a.train_samples ? *a.train_samples : a.train_iters * a.global_batch_size;
  const int64_t egbs = a.eval_global_batch_size.value_or(a.global_batch_size);
  SplitSizes s;
  s[0] = train_samples;
  if (a.full_validation) {
    s[1] = std::nullopt;
  } else {
    int64_t eval_iters;
    if (a.skip_train) {
      eval_iters = a.eval_iters;
    } else {
      int64_t points = train_iters / a.eval_interval + 1;
      if (a.start_eval_at_iter) points = std::max<int64_t>(0, points - *a.start_eval_at_iter / a.eval_interval);
      eval_iters = points * a.eval_iters;
    }
    s[1] = eval_iters * egbs;
  }
  s[2] = a.eval_iters * egbs;
  return s;
}

std::vector<SplitSizes> get_size_per_split_per_dataset(const std::vector<double>& w, const SplitSizes& target,
                                                       double surplus) {
  std::vector<SplitSizes> out(w.size());
  for (size_t d = 0; d < w.size(); ++d)
    for (int s = 0; s < 3; ++s) {
      if (!target[s]) continue;
      out[d][s] = static_cast<int64_t>(
          std::ceil(std::ceil(static_cast<double>(*target[s]) * w[d]) * (1.0 + surplus)));
    }
  return out;
}

BlendedMegatronDatasetBuilder::BlendedMegatronDatasetBuilder(SplitSizes sizes, std::function<bool()> is_built_on_rank,
                                                             std::shared_ptr<const GPTDatasetConfig> config)
    : sizes_(sizes), is_built_on_rank_(std::move(is_built_on_rank)), config_(std::move(config)) {
  MEGATRON_CHECK(config_ && config_->tokenizer) << "builder needs a finalized config with a tokenizer";
  if (!is_built_on_rank_) is_built_on_rank_ = [] { return true; };
  if (!config_->mock) {
    for (int s = 0; s < 3; ++s) {
      bool weights_none;
      if (!config_->blend_per_split) {
        weights_none = !config_->blend->weights;
      } else {
        if (!(*config_->blend_per_split)[s]) continue;
        weights_none = !(*config_->blend_per_split)[s]->weights;
      }
      if (!sizes_[s] && !weights_none)
        user_error("the ", split_name(static_cast<Split>(s)),
                   " split has dataset weights but no requested size (--full-validation); drop the weights");
    }
  }
}

void BlendedMegatronDatasetBuilder::barrier() {
  if (config_->distributed.initialized && config_->distributed.barrier) config_->distributed.barrier();
}

BlendedMegatronDatasetBuilder::MidLevel BlendedMegatronDatasetBuilder::build_megatron_dataset_splits(
    const std::optional<std::string>& path, const SplitMatrix& split, const SplitSizes& sizes,
    bool synchronize_ranks) {
  const auto& dist = config_->distributed;
  MidLevel out;
  if (dist.initialized && !is_built_on_rank_()) {
    for (int i = 0; i < 3; ++i)
      if (split[i] && synchronize_ranks) barrier();
    return out;
  }
  std::shared_ptr<LowLevelDataset> low;
  if (config_->mock) {
    low = std::make_shared<MockGPTLowLevelDataset>(config_->tokenizer->vocab_size(), config_->tokenizer->eod());
  } else {
    low = std::make_shared<IndexedLowLevelDataset>(*path, config_->mmap_bin_files);
  }
  const int64_t n = low->num_sequences();
  for (int i = 0; i < 3; ++i) {
    if (!split[i]) continue;
    const auto [beg, end] = split_range(*split[i], n);
    auto make = [&]() -> std::shared_ptr<GPTDataset> {
      if (config_->mock)
        return std::make_shared<MockGPTDataset>(low, beg, end, sizes[i], static_cast<Split>(i), config_);
      return std::make_shared<GPTDataset>(low, path, beg, end, sizes[i], static_cast<Split>(i), config_);
    };
    if (dist.initialized) {
      if (dist.rank == 0 && is_built_on_rank_()) out[i] = make();
      if (synchronize_ranks) barrier();
      if (dist.rank != 0 && is_built_on_rank_()) out[i] = make();
    } else {
      out[i] = make();
    }
  }
  return out;
}

std::vector<BlendedMegatronDatasetBuilder::MidLevel> BlendedMegatronDatasetBuilder::build_megatron_datasets_parallel(
    const std::vector<std::string>& prefixes, const SplitMatrix& split, const std::vector<SplitSizes>& sizes) {
  std::vector<MidLevel> out(prefixes.size());
  const auto& dist = config_->distributed;
  if (dist.initialized) {
    if (dist.rank == 0)
      for (size_t k = 0; k < prefixes.size(); ++k) out[k] = build_megatron_dataset_splits(prefixes[k], split, sizes[k], false);
    barrier();
    if (dist.rank != 0)
      for (size_t k = 0; k < prefixes.size(); ++k) out[k] = build_megatron_dataset_splits(prefixes[k], split, sizes[k], false);
  } else {
    for (size_t k = 0; k < prefixes.size(); ++k) out[k] = build_megatron_dataset_splits(prefixes[k], split, sizes[k], false);
  }
  return out;
}

std::shared_ptr<BlendedDataset> BlendedMegatronDatasetBuilder::build_blended(std::vector<std::shared_ptr<GPTDataset>> ds,
                                                                             std::vector<double> weights,
                                                                             bool weights_are_int,
                                                                             std::optional<int64_t> size) {
  const auto& dist = config_->distributed;
  bool any_null = false;
  for (auto& d : ds) any_null = any_null || !d;
  auto make = [&]() -> std::shared_ptr<BlendedDataset> {
    if (any_null) return nullptr;
    return std::make_shared<BlendedDataset>(ds, weights, weights_are_int, size, config_);
  };
  if (!dist.initialized) return make();
  std::shared_ptr<BlendedDataset> b;
  if (dist.rank == 0 && is_built_on_rank_()) b = make();
  barrier();
  if (dist.rank != 0 && is_built_on_rank_()) b = make();
  return b;
}

std::array<std::shared_ptr<TopLevelDataset>, 3> BlendedMegatronDatasetBuilder::build() {
  std::array<std::shared_ptr<TopLevelDataset>, 3> result;
  if (config_->mock) {
    auto m = build_megatron_dataset_splits(std::nullopt, *config_->split_matrix, sizes_, true);
    for (int i = 0; i < 3; ++i) result[i] = m[i];
  } else if (config_->blend) {
    const Blend& blend = *config_->blend;
    const SplitMatrix& split = *config_->split_matrix;
    std::optional<std::vector<double>> weights;
    if (blend.weights) weights = normalize(*blend.weights);
    if (blend.prefixes.size() == 1 && !weights) {
      auto m = build_megatron_dataset_splits(blend.prefixes[0], split, sizes_, true);
      for (int i = 0; i < 3; ++i) result[i] = m[i];
    } else {
      std::vector<SplitSizes> target, buffer;
      if (weights) {
        target = get_size_per_split_per_dataset(*weights, sizes_);
        buffer = get_size_per_split_per_dataset(*weights, sizes_, config_->mid_level_dataset_surplus);
      } else {
        buffer.assign(blend.prefixes.size(), SplitSizes{});
      }
      auto mids = build_megatron_datasets_parallel(blend.prefixes, split, buffer);
      for (int i = 0; i < 3; ++i) {
        if (!split[i]) continue;
        std::vector<std::shared_ptr<GPTDataset>> ds;
        for (auto& m : mids) ds.push_back(m[i]);
        BlendSpec b = blend_spec(ds, weights, target, sizes_[i], i, "using --data-path weights requires");
        result[i] = build_blended(ds, b.weights, b.weights_are_sizes, b.size);
      }
    }
  } else {
    for (int i = 0; i < 3; ++i) {
      SplitMatrix spoof;
      spoof[i] = SplitBookend{0.0, 1.0, false};
      SplitSizes sizes_spoof{0, 0, 0};
      sizes_spoof[i] = sizes_[i];
      const auto& bo = (*config_->blend_per_split)[i];
      if (!bo) continue;
      std::optional<std::vector<double>> weights;
      if (bo->weights) weights = normalize(*bo->weights);
      if (bo->prefixes.size() == 1) {
        result[i] = build_megatron_dataset_splits(bo->prefixes[0], spoof, sizes_spoof, true)[i];
        continue;
      }
      std::vector<SplitSizes> target, buffer;
      if (weights) {
        target = get_size_per_split_per_dataset(*weights, sizes_spoof);
        buffer = get_size_per_split_per_dataset(*weights, sizes_spoof, config_->mid_level_dataset_surplus);
      } else {
        buffer.assign(bo->prefixes.size(), SplitSizes{});
      }
      auto mids = build_megatron_datasets_parallel(bo->prefixes, spoof, buffer);
      std::vector<std::shared_ptr<GPTDataset>> ds;
      for (auto& m : mids) ds.push_back(m[i]);
      BlendSpec b = blend_spec(ds, weights, target, sizes_[i], i, "per-split weights require");
      result[i] = build_blended(ds, b.weights, b.weights_are_sizes, b.size);
    }
  }
  for (int i = 0; i < 3; ++i) {
    auto* g = dynamic_cast<GPTDataset*>(result[i].get());
    if (g && g->num_samples() && g->size() > 0 && *g->num_samples() > g->size())
      throw InternalError("GPTDataset built fewer samples than requested");
  }
  return result;
}

}  // namespace megatron::datasets
