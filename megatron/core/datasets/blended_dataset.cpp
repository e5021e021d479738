#include "megatron/core/datasets/blended_dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "megatron/core/datasets/helpers.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/temp_file.h"

namespace megatron::datasets {

namespace fs = std::filesystem;

namespace {
bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
std::string ds_name(const GPTDataset& d) {
  auto p = d.low_level_dataset().path_prefix();
  return p ? "'" + *p + "'" : std::string("mock data");
}
}  // namespace

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<GPTDataset>> datasets, std::vector<double> weights,
                               bool weights_are_int, std::optional<int64_t> size,
                               std::shared_ptr<const GPTDatasetConfig> config)
    : datasets_(std::move(datasets)),
      weights_(std::move(weights)),
      weights_are_int_(weights_are_int),
      size_(size),
      config_(std::move(config)) {
  MEGATRON_CHECK(!datasets_.empty() && datasets_.size() == weights_.size() && datasets_.size() < 32767)
      << datasets_.size() << " datasets, " << weights_.size() << " weights";
  split_ = datasets_[0]->index_split();
  for (size_t i = 0; i < datasets_.size(); ++i) {
    MEGATRON_CHECK(datasets_[i]->index_split() == split_) << "blend mixes splits";
    if (!(weights_[i] > 0))
      user_error("blend of the ", split_name(split_), " split: dataset ", ds_name(*datasets_[i]),
                 (weights_are_int_ ? " has no samples in this split" : " has a non-positive weight"),
                 "; remove it or give it a positive weight");
    if (datasets_[i]->low_level_dataset().token_dtype() != datasets_[0]->low_level_dataset().token_dtype())
      user_error("blend: ", ds_name(*datasets_[i]), ".bin holds ",
                 index_dtype_name(datasets_[i]->low_level_dataset().token_dtype()), " tokens but ",
                 ds_name(*datasets_[0]), ".bin holds ",
                 index_dtype_name(datasets_[0]->low_level_dataset().token_dtype()),
                 "; blended datasets must come from the same tokenizer (re-run preprocess_data)");
  }
  if (size_) {
    weights_ = normalize(weights_);
    weights_are_int_ = false;
  }

  JsonValue ids = JsonValue::make_object();
  ids.add("class", JsonValue::string("BlendedDataset"));
  JsonValue dl = JsonValue::make_list();
  for (const auto& d : datasets_) dl.push(d->unique_identifiers());
  ids.add("datasets", std::move(dl));
  ids.add("split", JsonValue::string(split_name(split_)));
  JsonValue wl = JsonValue::make_list();
  for (double w : weights_)
    wl.push(weights_are_int_ ? JsonValue::integer(static_cast<int64_t>(w)) : JsonValue::real(w));
  ids.add("weights", std::move(wl));
  ids.add("size", size_ ? JsonValue::integer(*size_) : JsonValue::null());
  description_ = json_dumps_indent4(ids);
  hash_ = md5_hex(description_);

  std::string base;
  bool hit = false;
  if (config_->path_to_cache) {
    base = (fs::path(*config_->path_to_cache) / (hash_ + "-BlendedDataset-" + split_name(split_))).string();
    hit = is_file(base + "-description.txt") && is_file(base + "-dataset_index.npy") &&
          is_file(base + "-dataset_sample_index.npy");
  }
  const auto& dist = config_->distributed;
  if (!config_->path_to_cache || (!hit && (!dist.initialized || dist.rank == 0))) {
    std::vector<int16_t> di;
    std::vector<int64_t> dsi;
    if (size_) {
      build_blending_indices(weights_, *size_, di, dsi);
    } else {
      std::vector<int64_t> sizes;
      for (double w : weights_) sizes.push_back(static_cast<int64_t>(w));
      build_exhaustive_blending_indices(sizes, di, dsi);
    }
    std::vector<int64_t> counts(datasets_.size(), 0);
    for (auto d : di) counts[d]++;
    for (size_t i = 0; i < datasets_.size(); ++i)
      if (counts[i] > datasets_[i]->size())
        user_error("the ", split_name(split_), " blend draws ", counts[i], " samples from ", ds_name(*datasets_[i]),
                   " which has only ", datasets_[i]->size(),
                   "; raise --mid-level-dataset-surplus (now ", config_->mid_level_dataset_surplus, ")");
    const int64_t n = static_cast<int64_t>(di.size());
    dataset_index_ = NpyView::own(NpyDType::kInt16, {n}, std::move(di));
    dataset_sample_index_ = NpyView::own(NpyDType::kInt64, {n}, std::move(dsi));
    if (config_->path_to_cache) {
      std::error_code ec;
      fs::create_directories(*config_->path_to_cache, ec);
      if (ec) user_error(*config_->path_to_cache, ": cannot create the dataset cache folder (", ec.message(), ")");
      {
        const std::string p = base + "-description.txt";
        const std::string tmp = p + ".tmp." + std::to_string(::getpid());
        TempFileGuard guard(tmp);  // removed on every error (e.g. a full disk)
        std::ofstream f(tmp, std::ios::binary);
        f << description_;
        f.close();
        if (!f || std::rename(tmp.c_str(), p.c_str()) != 0) user_error(p, ": write failed (", std::strerror(errno), ")");
        guard.release();
      }
      npy_save_raw(base + "-dataset_index.npy", NpyDType::kInt16, {n}, dataset_index_.data());
      npy_save_raw(base + "-dataset_sample_index.npy", NpyDType::kInt64, {n}, dataset_sample_index_.data());
    }
    return;
  }
  if (!hit) user_error(base, "-*.npy: the blend cache that rank 0 should have written is missing; make --data-cache-path shared by all ranks");
  NpyView a = NpyView::map(base + "-dataset_index.npy");
  NpyView b = NpyView::map(base + "-dataset_sample_index.npy");
  if (a.dtype() != NpyDType::kInt16 || b.dtype() != NpyDType::kInt64 || a.shape().size() != 1 || a.numel() != b.numel())
    user_error(base, "-dataset_index.npy: unexpected dtype or length; delete the cache to rebuild it");
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (a[i] < 0 || a[i] >= static_cast<int64_t>(datasets_.size()) || b[i] < 0 || b[i] >= datasets_[a[i]]->size())
      user_error(base, "-dataset_index.npy: entry ", i, " out of range; delete the cache to rebuild it");
  }
  dataset_index_ = std::move(a);
  dataset_sample_index_ = std::move(b);
  loaded_from_cache_ = true;
}

void BlendedDataset::get(int64_t idx, GPTSample& out, bool with_attention_mask) const {
  MEGATRON_CHECK(idx >= 0 && idx < size()) << "sample " << idx << " of " << size();
  const int16_t d = static_cast<int16_t>(dataset_index_[idx]);
  datasets_[d]->get(dataset_sample_index_[idx], out, with_attention_mask);
  out.dataset_id = d;
}

}  // namespace megatron::datasets
