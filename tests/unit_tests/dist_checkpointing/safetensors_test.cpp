// safetensors reader/writer against tests/reference/ckpt/fixtures/reference.safetensors, written by
// the independent Python implementation tests/reference/ckpt/safetensors_ref.py (from the published
// format description). Expected values are the literals of that script (bit patterns by hand).
#include "megatron/core/dist_checkpointing/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "megatron/core/dist_checkpointing/file_utils.h"

using namespace megatron;
using namespace megatron::dist_checkpointing;
namespace fs = std::filesystem;

namespace {
std::string fixture_path() {
  return std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/ckpt/fixtures/reference.safetensors";
}
std::string tmp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("megatron_st_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}
template <class T>
std::vector<T> values(const SafetensorsReader& r, const std::string& name) {
  const auto& e = r.at(name);
  std::vector<T> v(e.nbytes() / sizeof(T));
  std::memcpy(v.data(), r.bytes(e), e.nbytes());
  return v;
}
}  // namespace

TEST(Safetensors, ReadsReferenceFixture) {
  SafetensorsReader r(fixture_path());
  EXPECT_EQ(r.entries().size(), 15u);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.at("a.f32").shape, (Shape{2, 3}));
  EXPECT_EQ(values<float>(r, "a.f32"), (std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f}));
  EXPECT_EQ(r.at("b.bf16").dtype, DType::kBFloat16);
  Tensor b = r.tensor("b.bf16");
  EXPECT_EQ(b.to_float_vector(), (std::vector<float>{1.0f, -2.5f, 3.140625f, 0.0f}));
  Tensor c = r.tensor("c.f16");
  EXPECT_EQ(c.to_float_vector(), (std::vector<float>{1.0f, 0.333251953125f, -65504.0f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(r.at("d.e4m3").dtype, DType::kFloat8E4M3);
  EXPECT_EQ(r.tensor("d.e4m3").to_float_vector(), (std::vector<float>{1.0f, 448.0f, -1.0f}));
  EXPECT_EQ(r.at("e.e5m2").dtype, DType::kFloat8E5M2);
  auto e5 = r.tensor("e.e5m2").to_float_vector();
  EXPECT_EQ(e5[0], 1.0f);
  EXPECT_EQ(e5[1], 57344.0f);
  EXPECT_TRUE(e5[2] == 0.0f && std::signbit(e5[2]));
  EXPECT_EQ(values<int64_t>(r, "f.i64"), (std::vector<int64_t>{-1, int64_t(1) << 40}));
  EXPECT_EQ(values<int32_t>(r, "g.i32"), (std::vector<int32_t>{-7, 123456}));
  EXPECT_EQ(values<uint8_t>(r, "h.u8"), (std::vector<uint8_t>{0, 255}));
  EXPECT_EQ(r.at("i.bool").dtype, DType::kBool);
  EXPECT_EQ(values<uint8_t>(r, "i.bool"), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(values<double>(r, "j.f64"), (std::vector<double>{M_PI, -1e300}));
  EXPECT_EQ(values<int8_t>(r, "k.i8"), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(values<int16_t>(r, "l.i16"), (std::vector<int16_t>{-32768, 32767}));
  EXPECT_EQ(values<uint16_t>(r, "m.u16"), (std::vector<uint16_t>{0, 65535}));
  EXPECT_EQ(r.at("scalar").shape, Shape{});
  EXPECT_EQ(values<float>(r, "scalar"), std::vector<float>{7.0f});
  EXPECT_EQ(r.at("empty").shape, (Shape{0, 3}));
  EXPECT_EQ(r.at("empty").nbytes(), 0u);
}

// Writing the same tensors must give the reference writer's bytes exactly (same canonical order,
// compact sorted JSON, space padding to 8 bytes).
TEST(Safetensors, WriterMatchesReferenceBytes) {
  SafetensorsReader ref(fixture_path());
  std::vector<SafetensorsItem> items;
  for (const auto& e : ref.entries()) items.push_back({e.name, e.dtype, e.shape, ref.bytes(e)});
  std::string dir = tmp_dir("bytes");
  std::string out = dir + "/ours.safetensors";
  save_safetensors(out, items, ref.metadata());
  EXPECT_EQ(read_text_file(out), read_text_file(fixture_path()));
  SafetensorsReader back(out);
  EXPECT_EQ(back.entries().size(), 15u);
  fs::remove_all(dir);
}

TEST(Safetensors, RoundTripTensorsAndPadding) {
  std::string dir = tmp_dir("rt");
  Tensor w = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor h = w.to(DType::kBFloat16);
  save_safetensors(dir + "/x.safetensors", {{"w", w}, {"h", h}}, {{"k", "v"}});
  std::string raw = read_text_file(dir + "/x.safetensors");
  uint64_t n;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);  // header padded so the buffer starts 8-aligned
  SafetensorsReader r(dir + "/x.safetensors");
  EXPECT_EQ(r.tensor("w").to_float_vector(), w.to_float_vector());
  EXPECT_EQ(r.tensor("h").dtype(), DType::kBFloat16);
  EXPECT_EQ(r.entries()[0].name, "w");  // F32 sorts before BF16
  EXPECT_EQ(r.metadata().at("k"), "v");
  EXPECT_FALSE(fs::exists(dir + "/x.safetensors.tmp-" + std::to_string(::getpid())));
  fs::remove_all(dir);
}

TEST(Safetensors, BadFilesNameTheProblem) {
  std::string dir = tmp_dir("bad");
  auto write_raw = [&](const std::string& name, const std::string& header, size_t buf) {
    std::ofstream f(dir + "/" + name, std::ios::binary);
    uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(buf, '\0');
  };
  auto expect_error = [&](const std::string& name, const std::string& needle) {
    try {
      SafetensorsReader r(dir + "/" + name);
      ADD_FAILURE() << name << ": no error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  write_raw("trunc.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expect_error("trunc.safetensors", "'w'");
  write_raw("dtype.safetensors", R"({"w":{"dtype":"U32","shape":[1],"data_offsets":[0,4]}})", 4);
  expect_error("dtype.safetensors", "unsupported safetensors dtype 'U32'");
  write_raw("size.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4);
  expect_error("size.safetensors", "expected 8");
  write_raw("overlap.safetensors",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  expect_error("overlap.safetensors", "overlap");
  write_raw("json.safetensors", R"({"w":)", 0);
  expect_error("json.safetensors", "not valid JSON");
  {
    std::ofstream f(dir + "/short.safetensors");
    f << "abc";
  }
  expect_error("short.safetensors", "short.safetensors");
  fs::remove_all(dir);
}

// Files written by the reference implementation itself (safetensors 0.8.0 via transformers'
// save_pretrained, tests/reference/hf/README.md): we read every tensor, and rewriting them gives
// the same bytes (same canonical order, header layout and padding).
TEST(Safetensors, ReferenceImplementationFilesRoundTripByteIdentical) {
  for (const char* model : {"llama_tiny", "gpt2_tiny"}) {
    std::string path = std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/hf/" + model + "/model.safetensors";
    SafetensorsReader ref(path);
    ASSERT_GT(ref.entries().size(), 10u) << model;
    EXPECT_EQ(ref.metadata().at("format"), "pt");
    std::vector<SafetensorsItem> items;
    for (const auto& e : ref.entries()) {
      EXPECT_EQ(e.dtype, DType::kFloat32) << e.name;
      items.push_back({e.name, e.dtype, e.shape, ref.bytes(e)});
    }
    std::string dir = tmp_dir(std::string("hf_") + model);
    save_safetensors(dir + "/model.safetensors", items, ref.metadata());
    EXPECT_TRUE(read_text_file(dir + "/model.safetensors") == read_text_file(path)) << model;
    fs::remove_all(dir);
  }
  SafetensorsReader llama(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/hf/llama_tiny/model.safetensors");
  EXPECT_EQ(llama.at("model.layers.0.mlp.gate_proj.weight").shape, (Shape{176, 64}));
  EXPECT_EQ(llama.at("model.layers.1.self_attn.k_proj.weight").shape, (Shape{32, 64}));
}
