#include "test_utils/fixture_util.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

namespace megatron::testing {

Fixture::Fixture(const std::string& name) : Fixture("tests/reference/model/data", name) {}

bool Fixture::exists(const std::string& dir, const std::string& name) {
  return std::ifstream(std::string(MEGATRON_SOURCE_DIR) + "/" + dir + "/" + name + ".json").good();
}

Fixture::Fixture(const std::string& dir, const std::string& name) {
  const std::string base = std::string(MEGATRON_SOURCE_DIR) + "/" + dir + "/" + name;
  std::ifstream js(base + ".json");
  MEGATRON_CHECK(js.good()) << "missing fixture " << base << ".json";
  nlohmann::json j = nlohmann::json::parse(js);
  for (auto& [k, v] : j["tensors"].items())
    index_[k] = Entry{v["dtype"].get<std::string>(), v["shape"].get<Shape>(), v["offset"].get<size_t>()};
  std::ifstream bin(base + ".bin", std::ios::binary);
  MEGATRON_CHECK(bin.good()) << "missing fixture " << base << ".bin";
  data_.assign(std::istreambuf_iterator<char>(bin), std::istreambuf_iterator<char>());
}

Tensor Fixture::get(const std::string& key) const {
  auto it = index_.find(key);
  MEGATRON_CHECK(it != index_.end()) << "fixture has no tensor " << key;
  const Entry& e = it->second;
  const DType dt = e.dtype == "int64" ? DType::kInt64 : DType::kFloat32;
  Tensor t = Tensor::empty(e.shape, dt);
  MEGATRON_CHECK(e.offset + t.nbytes() <= data_.size()) << "fixture tensor " << key << " out of range";
  std::memcpy(t.data_ptr(), data_.data() + e.offset, t.nbytes());
  return t;
}

std::vector<std::string> Fixture::keys_with_prefix(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto& [k, v] : index_)
    if (k.rfind(prefix, 0) == 0) out.push_back(k);
  return out;
}

double max_rel_error(const Tensor& a, const Tensor& b) {
  auto va = a.to_float_vector(), vb = b.to_float_vector();
  MEGATRON_CHECK(va.size() == vb.size()) << a.str() << " vs " << b.str();
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < va.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(va[i]) - vb[i]));
    ref = std::max(ref, std::abs(static_cast<double>(vb[i])));
  }
  return ref == 0.0 ? err : err / ref;
}

datasets::GPTBatch gpt_batch(const std::vector<int64_t>& tokens, const std::vector<int64_t>& labels, int64_t b, int64_t s) {
  MEGATRON_CHECK(static_cast<int64_t>(tokens.size()) == b * s && static_cast<int64_t>(labels.size()) == b * s)
      << "gpt_batch: " << tokens.size() << " tokens, " << labels.size() << " labels for " << b << " x " << s;
  std::vector<int64_t> pos(b * s);
  for (int64_t i = 0; i < b * s; ++i) pos[i] = i % s;
  datasets::GPTBatch batch;
  batch.tokens = Tensor::from_vector_i64(tokens, {b, s});
  batch.labels = Tensor::from_vector_i64(labels, {b, s});
  batch.position_ids = Tensor::from_vector_i64(pos, {b, s});
  batch.loss_mask = Tensor::zeros({b, s}, DType::kFloat32);
  batch.loss_mask.fill_(1.0f);
  return batch;
}

}  // namespace megatron::testing
