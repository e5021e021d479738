#include "hf_reference_util.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <vector>

namespace megatron::testing {

std::map<std::string, Tensor> read_safetensors_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MEGATRON_CHECK(f.good()) << "cannot open " << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  MEGATRON_CHECK(bytes.size() >= 8) << path;
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(header_len));
  const char* data = bytes.data() + 8 + header_len;
  std::map<std::string, Tensor> out;
  for (auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    MEGATRON_CHECK(e["dtype"] == "F32") << path << ": " << name << " is " << e["dtype"];
    Tensor t = Tensor::empty(e["shape"].get<Shape>(), DType::kFloat32);
    const auto begin = e["data_offsets"][0].get<size_t>(), end = e["data_offsets"][1].get<size_t>();
    MEGATRON_CHECK(end - begin == t.nbytes()) << path << ": " << name;
    std::memcpy(t.data_ptr(), data + begin, t.nbytes());
    out[name] = t;
  }
  return out;
}

datasets::GPTBatch read_hf_inputs(const std::string& inputs_json) {
  std::ifstream f(inputs_json);
  MEGATRON_CHECK(f.good()) << "cannot open " << inputs_json;
  auto in = nlohmann::json::parse(f);
  const int64_t b = in["tokens"].size(), s = in["tokens"][0].size();
  std::vector<int64_t> tok, lab, pos;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < s; ++j) {
      tok.push_back(in["tokens"][i][j].get<int64_t>());
      lab.push_back(in["labels"][i][j].get<int64_t>());
      pos.push_back(j);
    }
  datasets::GPTBatch batch;
  batch.tokens = Tensor::from_vector_i64(tok, {b, s});
  batch.labels = Tensor::from_vector_i64(lab, {b, s});
  batch.position_ids = Tensor::from_vector_i64(pos, {b, s});
  batch.loss_mask = Tensor::zeros({b, s}, DType::kFloat32);
  batch.loss_mask.fill_(1.0f);
  return batch;
}

}  // namespace megatron::testing
