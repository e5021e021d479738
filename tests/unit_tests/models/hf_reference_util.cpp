#include "hf_reference_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <vector>

#include "megatron/core/utils/errors.h"
#include "test_utils/fixture_util.h"

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
  std::vector<int64_t> tok, lab;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < s; ++j) {
      tok.push_back(in["tokens"][i][j].get<int64_t>());
      lab.push_back(in["labels"][i][j].get<int64_t>());
    }
  return gpt_batch(tok, lab, b, s);
}

void expect_user_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one mentioning: " << needle;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace megatron::testing
