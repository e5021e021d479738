// The pickle / torch.save / DCP layer of torch_dist checkpoints
// (megatron/core/dist_checkpointing/torch_dist/). Independent checks against Python's pickle and
// zipfile are in tests/functional_tests/ckpt_torch_dist.sh; here: invariants, refusal of code-
// running pickles, and a bounded deterministic fuzz (truncations and byte mutations of valid
// inputs must throw, never crash or hang).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "megatron/core/dist_checkpointing/torch_dist/pickle.h"
#include "megatron/core/dist_checkpointing/torch_dist/torch_dist.h"
#include "megatron/core/dist_checkpointing/torch_dist/torch_save.h"
#include "megatron/core/utils/errors.h"

namespace td = megatron::dist_checkpointing::torch_dist;
namespace dc = megatron::dist_checkpointing;
using megatron::DType;
using megatron::Shape;
using megatron::Tensor;

namespace {

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// A Megatron-like common state and a tensor, as a torch.save archive.
std::string sample_archive(std::vector<float>& data) {
  td::TorchArchiveWriter w("common");
  auto& d = w.doc();
  data = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-3f};
  td::PyValue* args = d.dict();
  args->dict.emplace_back(d.str("num_layers"), d.integer(2));
  args->dict.emplace_back(d.str("lr"), d.real(3e-4));
  args->dict.emplace_back(d.str("params_dtype"), d.global("torch.bfloat16"));
  args->dict.emplace_back(d.str("seed"), d.integer(int64_t{1} << 40));
  args->dict.emplace_back(d.str("neg"), d.integer(-70000));
  td::PyValue* root = d.dict();
  root->dict.emplace_back(d.str("args"), d.object("argparse.Namespace", {}, args, true));
  root->dict.emplace_back(d.str("iteration"), d.integer(5));
  root->dict.emplace_back(d.str("w"), w.tensor(DType::kFloat32, {2, 3}, data.data()));
  root->dict.emplace_back(d.str("flags"), d.list({d.boolean(true), d.none(), d.str("x\xc3\xa9")}));
  return w.finish(root);
}

}  // namespace

TEST(TorchDistPickle, RoundTripOfData) {
  std::vector<float> data;
  const std::string a = sample_archive(data);
  td::TorchArchive ar;
  td::read_torch_archive(u8(a), a.size(), "sample", ar);
  ASSERT_EQ(ar.tensors.size(), 1u);
  EXPECT_EQ(ar.tensors[0].shape, (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(ar.tensors[0].data, data.data(), 24), 0);
  const nlohmann::json j = td::py_to_json(ar.root, &ar, "sample");
  EXPECT_EQ(j["iteration"], 5);
  EXPECT_EQ(j["args"]["num_layers"], 2);
  EXPECT_DOUBLE_EQ(j["args"]["lr"].get<double>(), 3e-4);
  EXPECT_EQ(j["args"]["params_dtype"], "torch.bfloat16");
  EXPECT_EQ(j["args"]["seed"], int64_t{1} << 40);  // LONG1 with sign handling
  EXPECT_EQ(j["args"]["neg"], -70000);
  EXPECT_EQ(j["flags"][2], "x\xc3\xa9");
  EXPECT_TRUE(j["flags"][1].is_null());
}

TEST(TorchDistPickle, RefusesGlobalsByName) {
  // os.system('true') as Python's pickle.dumps would write it (protocol 2 and 4 forms).
  const std::string p2 = std::string("\x80\x02") + "cos\nsystem\nX\x04\x00\x00\x00true\x85R.";
  const std::string p4 = std::string("\x80\x04\x95\x1a\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94.", 31);
  for (const std::string& p : {p2, p4}) {
    td::PickleDoc doc;
    try {
      td::unpickle(u8(p), p.size(), doc, {"evil.pkl"});
      FAIL() << "accepted os.system";
    } catch (const td::PickleError& e) {
      EXPECT_NE(std::string(e.what()).find("refusing to load evil.pkl: pickle global os.system is not allowed"),
                std::string::npos)
          << e.what();
    }
  }
  // INST / OBJ opcodes (instantiate arbitrary classes) are refused too.
  const std::string inst = "(ibuiltins\nprint\n.";
  td::PickleDoc doc;
  EXPECT_THROW(td::unpickle(u8(inst), inst.size(), doc), td::PickleError);
}

TEST(TorchDistPickle, FlatRangeBoxesCoverExactlyTheRange) {
  const Shape shape{3, 4, 5};
  for (int64_t b = 0; b <= 60; b += 7)
    for (int64_t e = b; e <= 60; e += 5) {
      auto boxes = td::flat_range_boxes(shape, b, e);
      EXPECT_LE(boxes.size(), 5u);
      int64_t next = b;  // boxes are in order and contiguous in flat index
      for (const auto& [o, s] : boxes) {
        const int64_t first = (o[0] * 4 + o[1]) * 5 + o[2];
        EXPECT_EQ(first, next) << b << ".." << e;
        next = first + megatron::shape_numel(s);
        // A box is contiguous in row-major order: all but its leading non-1 axis are full.
        bool leading = true;
        for (size_t k = 0; k < s.size(); ++k) {
          if (leading && s[k] == 1) continue;
          if (!leading) EXPECT_EQ(s[k], shape[k]);
          leading = false;
        }
      }
      EXPECT_EQ(next, e);
    }
}

TEST(TorchDistPickle, FuzzedInputNeverCrashes) {
  std::vector<float> data;
  const std::string archive = sample_archive(data);
  td::DcpMetadata md;
  md.tensors["a.weight"] = td::DcpTensorMeta{DType::kFloat32, {4, 2}, {{{0, 0}, {2, 2}, "__0_0.distcp", 0, 10}, {{2, 0}, {2, 2}, "__1_0.distcp", 5, 9}}};
  md.bytes["rng/shard_0_1"] = td::DcpBytesMeta{"__0_0.distcp", 10, 3};
  const std::string meta = td::dcp_metadata_pickle(md, "/ckpt");
  {  // the metadata round trip itself
    td::DcpMetadata back = td::parse_dcp_metadata(u8(meta), meta.size(), "m");
    ASSERT_EQ(back.tensors.at("a.weight").chunks.size(), 2u);
    EXPECT_EQ(back.tensors.at("a.weight").chunks[1].file, "__1_0.distcp");
    EXPECT_EQ(back.tensors.at("a.weight").chunks[1].offsets, (Shape{2, 0}));
    EXPECT_EQ(back.bytes.at("rng/shard_0_1").offset, 10u);
  }
  std::mt19937 rng(25);
  int threw = 0, ok = 0;
  auto attempt = [&](const std::string& buf, bool is_meta) {
    try {
      if (is_meta) {
        td::parse_dcp_metadata(u8(buf), buf.size(), "fuzz");
      } else {
        td::TorchArchive a;
        td::read_torch_archive(u8(buf), buf.size(), "fuzz", a);
        (void)td::py_to_json(a.root, &a, "fuzz");
      }
      ++ok;
    } catch (const megatron::UserError&) {
      ++threw;
    } catch (const td::PickleError&) {
      ++threw;
    }
  };
  for (const std::string* src : {&meta, &archive}) {
    const bool is_meta = src == &meta;
    for (size_t n = 0; n < src->size(); n += (src->size() > 4000 ? 13 : 1)) attempt(src->substr(0, n), is_meta);
    for (int k = 0; k < 3000; ++k) {
      std::string m = *src;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) m[rng() % m.size()] = static_cast<char>(rng() & 0xff);
      attempt(m, is_meta);
    }
  }
  // Raw pickles (no zip around them) with mutations hit the opcode loop directly.
  for (int k = 0; k < 5000; ++k) {
    std::string m = meta;
    m[rng() % m.size()] = static_cast<char>(rng() & 0xff);
    if (k % 7 == 0) m.insert(rng() % m.size(), std::string(1, static_cast<char>(rng() & 0xff)));
    td::PickleDoc doc;
    try {
      td::unpickle(u8(m), m.size(), doc);
    } catch (const td::PickleError&) {
    }
  }
  EXPECT_GT(threw, 100);  // the mutations are detected, not silently accepted
  EXPECT_GT(ok, 0);
}

TEST(TorchDistCheckpoint, SaveLoadReshardsBoxesAndFlatRanges) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("td_unit_" + std::to_string(::getpid()))).string();
  // A [4, 6] tensor written as two "ranks'" pieces: rows 0..1 as a box, rows 2..3 as two flat ranges.
  std::vector<float> g(24);
  for (int i = 0; i < 24; ++i) g[i] = static_cast<float>(i) * 0.5f - 3.0f;
  Tensor full = Tensor::from_vector(g, {4, 6});
  dc::ShardedStateDict sd;
  sd.tensors.push_back(dc::ShardedTensor{"w", full.narrow0(0, 2), {4, 6}, {0, 0}, {2, 6}, std::nullopt, 0});
  std::vector<float> lo(g.begin() + 12, g.begin() + 17), hi(g.begin() + 17, g.end());
  sd.tensors.push_back(dc::ShardedTensor{"w", Tensor::from_vector(lo, {5}), {4, 6}, {2, 0}, {2, 6}, std::make_pair(int64_t{0}, int64_t{5}), 0});
  sd.tensors.push_back(dc::ShardedTensor{"w", Tensor::from_vector(hi, {7}), {4, 6}, {2, 0}, {2, 6}, std::make_pair(int64_t{5}, int64_t{12}), 0});
  sd.objects.push_back({"rng_state", {{"seed", 7}}, {1}, {0}});
  sd.common = {{"iteration", 3}};
  td::save(sd, dir, nullptr);
  ASSERT_TRUE(td::is_torch_dist_checkpoint(dir));
  // Read back as columns 1..4 of all rows, and as a flat range crossing the row boundary.
  dc::ShardedStateDict rd;
  rd.tensors.push_back(dc::ShardedTensor{"w", Tensor::empty({4, 3}, DType::kFloat32), {4, 6}, {0, 1}, {4, 3}, std::nullopt, 0});
  rd.tensors.push_back(dc::ShardedTensor{"w", Tensor::empty({9}, DType::kFloat32), {4, 6}, {0, 0}, {4, 6}, std::make_pair(int64_t{10}, int64_t{19}), 0});
  rd.objects.push_back({"rng_state", nullptr, {1}, {0}});
  const nlohmann::json common = td::load(rd, dir);
  EXPECT_EQ(common["iteration"], 3);
  auto a = rd.tensors[0].data.to_float_vector();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(a[r * 3 + c], g[r * 6 + c + 1]);
  auto b = rd.tensors[1].data.to_float_vector();
  for (int k = 0; k < 9; ++k) EXPECT_EQ(b[k], g[10 + k]);
  EXPECT_TRUE(rd.objects[0].loaded);
  EXPECT_EQ(rd.objects[0].value["seed"], 7);
  // A missing key and a wrong global shape are one-line errors naming the key.
  dc::ShardedStateDict bad;
  bad.tensors.push_back(dc::ShardedTensor::from_tensor("v", Tensor::empty({2}, DType::kFloat32)));
  try {
    td::load(bad, dir);
    FAIL();
  } catch (const megatron::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has no tensor 'v'"), std::string::npos) << e.what();
  }
  bad.tensors[0] = dc::ShardedTensor::from_tensor("w", Tensor::empty({4, 5}, DType::kFloat32));
  try {
    td::load(bad, dir);
    FAIL();
  } catch (const megatron::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'w' has global shape [4, 6]"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}
