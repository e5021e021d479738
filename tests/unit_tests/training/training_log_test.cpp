// Log lines and FLOPs: expected strings come from Megatron's Python format strings evaluated by
// python3 (tests/reference/training/gen_log_lines.py -> log_lines.txt); the FLOPs value from
// docs/megatron-reference.md#flops (LLaMA-3 8B: 51.470 GFLOP/token).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "megatron/training/arguments.h"
#include "megatron/training/training_log.h"

using namespace megatron::training;

namespace {
std::vector<std::string> split(const std::string& s, char d) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, d)) out.push_back(cur);
  return out;
}
std::optional<double> opt_d(const std::string& v) {
  if (v == "None") return std::nullopt;
  return std::strtod(v.c_str(), nullptr);
}
std::vector<std::pair<std::string, double>> losses(const std::string& v) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& kv : split(v, ';')) {
    auto c = kv.rfind(':');
    out.emplace_back(kv.substr(0, c), std::strtod(kv.c_str() + c + 1, nullptr));
  }
  return out;
}
}  // namespace

TEST(TrainingLog, LinesMatchMegatronPythonFormat) {
  std::ifstream f(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/training/log_lines.txt");
  ASSERT_TRUE(f);
  std::string line;
  std::vector<std::string> got;
  size_t next = 0;
  int checked = 0;
  while (std::getline(f, line)) {
    auto parts = split(line, '\t');
    if (parts[0] == "expect") {
      ASSERT_LT(next, got.size());
      EXPECT_EQ(got[next], line.substr(7));
      ++next;
      ++checked;
      continue;
    }
    std::map<std::string, std::string> kv;
    for (size_t i = 1; i < parts.size(); ++i) {
      auto e = parts[i].find('=');
      kv[parts[i].substr(0, e)] = parts[i].substr(e + 1);
    }
    got.clear();
    next = 0;
    if (parts[0] == "train") {
      TrainingLogFields t;
      t.timestamp = kv["ts"];
      t.iteration = std::stoll(kv["it"]);
      t.train_iters = std::stoll(kv["train_iters"]);
      t.consumed_samples = std::stoll(kv["consumed"]);
      t.skipped_samples = std::stoll(kv["skipped_samples"]);
      t.elapsed_ms_per_iteration = std::strtod(kv["ms"].c_str(), nullptr);
      t.throughput_tflops = opt_d(kv["tflops"]);
      t.learning_rate = opt_d(kv["lr"]);
      t.global_batch_size = std::stoll(kv["gbs"]);
      t.losses = losses(kv["losses"]);
      t.loss_scale = std::strtod(kv["ls"].c_str(), nullptr);
      t.grad_norm = opt_d(kv["gn"]);
      if (kv["nz"] != "None") t.num_zeros = std::stoll(kv["nz"]);
      t.params_norm = opt_d(kv["pn"]);
      t.skipped_iterations = std::stoll(kv["skipped"]);
      t.nan_iterations = std::stoll(kv["nan"]);
      got.push_back(format_training_log_line(t));
    } else {
      got = format_validation_lines(kv["prefix"], kv["suffix"], losses(kv["losses"]));
    }
  }
  EXPECT_EQ(checked, 5 + 4 * 3);  // 5 training lines, 4 validation cases of 3 lines
}

TEST(TrainingLog, TimestampHasMicroseconds) {
  setenv("TZ", "UTC", 1);
  tzset();
  // 2026-08-22 10:00:00 UTC = 1787392800 s since the epoch (hand computed: date -u -d @1787392800).
  auto t = std::chrono::system_clock::time_point(std::chrono::microseconds(1787392800LL * 1000000 + 123456));
  EXPECT_EQ(format_log_timestamp(t), "2026-08-22 10:00:00.123456");
  auto t2 = std::chrono::system_clock::time_point(std::chrono::microseconds(1787392800LL * 1000000 + 7));
  EXPECT_EQ(format_log_timestamp(t2), "2026-08-22 10:00:00.000007");
}

TEST(TrainingLog, FlopsLlama3_8B) {
  // docs/megatron-reference.md#flops: LLaMA-3 8B at s=8192: 51.470 GFLOP/token, 5.397e16 FLOPs per gbs-128 batch.
  Arguments a;
  a.num_layers = 32;
  a.hidden_size = 4096;
  a.ffn_hidden_size = 14336;
  a.num_attention_heads = 32;
  a.kv_channels = 128;
  a.group_query_attention = true;
  a.num_query_groups = 8;
  a.swiglu = true;
  a.seq_length = 8192;
  a.padded_vocab_size = 128256;
  const double per_token = num_floating_point_operations(a, 1) / 8192.0;
  EXPECT_NEAR(per_token / 1e9, 51.470, 0.0005);  // the reference rounds to 3 decimals
  EXPECT_NEAR(num_floating_point_operations(a, 128) / 1e16, 5.397, 0.0005);
}

TEST(TrainingLog, FlopsGptHandComputed) {
  // Non-GQA GeLU GPT: h=64, L=2, f=256, heads 4 (q=k=64), Vp=128, s=32, B=1:
  // per token 6*64*256*2*2 + 6*(64*(64+128)+64*64)*2 + 6*64*128 = 393216 + 196608 + 49152 = 638976;
  // T=32 -> 20447232; core attention 32^2*6*64*2 = 786432; total 21233664.
  Arguments a;
  a.num_layers = 2;
  a.hidden_size = 64;
  a.ffn_hidden_size = 256;
  a.num_attention_heads = 4;
  a.kv_channels = 16;
  a.num_query_groups = 4;
  a.seq_length = 32;
  a.padded_vocab_size = 128;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(a, 1), 21233664.0);
}

TEST(TrainingLog, FlopsMoEHandComputed) {
  // Megatron's num_floating_point_operations MoE branch, by hand: SwiGLU (gate 3), h=64, L=4 with
  // --moe-layer-freq [1,0,1,0] (2 MoE layers, 2 dense), f=256, top-2 of 8 experts of size 128, a
  // shared expert of 96, heads 4 x kv 16 (q=64), 2 query groups (k=32), Vp=128, s=32, B=1.
  // per token: MLP 6*64*(256*3*2 + (128*2*3 + 96*3)*2) = 1400832; attention
  // 6*(64*(64+2*32) + 64*64)*4 = 294912; logits 6*64*128 = 49152; sum 1744896, T=32 -> 55836672;
  // core attention 32^2*6*64*4 = 1572864; total 57409536. The router GEMM is not counted (Megatron).
  Arguments a;
  a.num_layers = 4;
  a.hidden_size = 64;
  a.ffn_hidden_size = 256;
  a.num_attention_heads = 4;
  a.kv_channels = 16;
  a.group_query_attention = true;
  a.num_query_groups = 2;
  a.swiglu = true;
  a.seq_length = 32;
  a.padded_vocab_size = 128;
  a.num_experts = 8;
  a.moe_router_topk = 2;
  a.moe_ffn_hidden_size = 128;
  a.moe_shared_expert_intermediate_size = 96;
  a.moe_layer_pattern = {1, 0, 1, 0};
  EXPECT_DOUBLE_EQ(num_floating_point_operations(a, 1), 57409536.0);
}

// Megatron's training_log prints a loss `if avg >= 0.0` (megatron/training/training.py; it was
// `> 0.0` until Megatron's "fix the bug that loss: 0 will not be printed", #1555, which session 4
// followed): an interval whose iterations were all skipped (fp16 overflow) prints
// "lm loss: 0.000000E+00", and so does an MoE aux loss with coefficient 0.
TEST(TrainingLog, ZeroAverageLossIsPrinted) {
  TrainingLogFields t;
  t.timestamp = "2026-11-30 03:00:00.000000";
  t.iteration = 1;
  t.train_iters = 10;
  t.consumed_samples = 8;
  t.elapsed_ms_per_iteration = 12.5;
  t.global_batch_size = 8;
  t.losses = {{"lm loss", 0.0}};
  t.loss_scale = 4294967296.0;
  t.skipped_iterations = 1;
  const std::string line = format_training_log_line(t);
  EXPECT_NE(line.find("| lm loss: 0.000000E+00 | loss scale: 4294967296.0 |"), std::string::npos) << line;
  t.losses = {{"lm loss", -1.0}};  // a negative average (not a loss Megatron tracks) stays out
  EXPECT_EQ(format_training_log_line(t).find("lm loss"), std::string::npos);
  t.losses = {{"lm loss", 4.5}};
  EXPECT_NE(format_training_log_line(t).find("| lm loss: 4.500000E+00 |"), std::string::npos);
}

// Megatron's Timers.get_all_timers_string, evaluated by hand from its format strings
// ('{}: ({:.2f}, {:.2f})'.format((name + ' ').ljust(48, '.'), ...), values / (normalizer / 1000)):
// two ranks, seconds [rank][timer]; a timer at 0 on every rank is left out; min/max ignore 0s.
TEST(TrainingLog, TimersStringAcrossRanks) {
  const std::vector<std::string> names = {"forward-backward", "optimizer", "unused"};
  const std::vector<double> t = {0.5, 0.0, 0.0,    // rank 0
                                 0.25, 0.125, 0.0};  // rank 1
  EXPECT_EQ(format_timers_string(names, t, 2, 10.0, "minmax"),
            "(min, max) time across ranks (ms):\n"
            "    forward-backward ...............................: (25.00, 50.00)\n"
            "    optimizer ......................................: (12.50, 12.50)");
  EXPECT_EQ(format_timers_string(names, t, 2, 10.0, "max"),
            "max time across ranks (ms):\n"
            "    forward-backward ...............................: 50.00\n"
            "    optimizer ......................................: 12.50");
  EXPECT_EQ(format_timers_string(names, t, 2, 10.0, "all"),
            "times across ranks (ms):\n  forward-backward:\n     rank  0: 50.00\n     rank  1: 25.00\n"
            "  optimizer:\n     rank  1: 12.50");
  EXPECT_EQ(format_timers_string(names, std::vector<double>(6, 0.0), 2, 1.0, "minmax"), "");
  // Timers.write: the max over ranks in seconds / normalizer.
  const auto mm = timers_min_max(names, t, 2, 10.0);
  ASSERT_EQ(mm.size(), 2u);
  EXPECT_EQ(mm[0].name, "forward-backward");
  EXPECT_DOUBLE_EQ(mm[0].max, 0.05);
  EXPECT_DOUBLE_EQ(mm[1].min, 0.0125);
}

// progress.txt lines (Megatron's append_to_progress_log format string) and the start-of-job search
// of get_start_time_from_progress_log: the first "Starting job" after the last change of "# GPUs"
// to this world size, with the FLOPs of the latest committed save before it.
TEST(TrainingLog, ProgressLogLinesAndStart) {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 10;
  tm.tm_mday = 30;
  tm.tm_hour = 18;
  tm.tm_min = 5;
  tm.tm_sec = 9;
  tm.tm_isdst = -1;
  const auto t = std::chrono::system_clock::from_time_t(std::mktime(&tm)) + std::chrono::milliseconds(700);
  EXPECT_EQ(format_progress_line(t, "123", 8, "Starting job"), "2026-11-30 18:05:09\tJob ID: 123\t# GPUs: 8\tStarting job");
  // '{:.1f}', '{:.2e}', '{:.2f}' of Python.
  EXPECT_EQ(format_progress_checkpoint_text(false, 100, 123.456, 7.25, 1.234567e18, 2.5e9),
            "Saved checkpoint\tIteration: 100\tJob throughput: 123.5 TFLOP/s/GPU\tCumulative throughput: 7.2 "
            "TFLOP/s/GPU\tFloating-point operations: 1.23e+18\tTokens (in billions): 2.50");
  EXPECT_EQ(format_progress_checkpoint_text(true, 5, 0, 0, 0, 0).rfind("Saving async checkpoint\tIteration: 5\t", 0), 0u);
  const std::string ck = "\tSaved checkpoint\tIteration: 10\tJob throughput: 1.0 TFLOP/s/GPU\tCumulative throughput: "
                         "1.0 TFLOP/s/GPU\tFloating-point operations: ";
  const std::vector<std::string> lines = {
      "2026-11-30 10:00:00\tJob ID: \t# GPUs: 8\tStarting job",
      "2026-11-30 10:10:00\tJob ID: \t# GPUs: 8" + ck + "1.00e+15\tTokens (in billions): 0.01",
      "2026-11-30 11:00:00\tJob ID: \t# GPUs: 16\tStarting job",  // another world size: restart
      "2026-11-30 11:10:00\tJob ID: \t# GPUs: 16" + ck + "3.00e+15\tTokens (in billions): 0.02",
      "2026-11-30 12:00:00\tJob ID: \t# GPUs: 8\tStarting job",
      "2026-11-30 13:00:00\tJob ID: \t# GPUs: 8\tStarting job",  // not the first: ignored
  };
  auto s = progress_start(lines, 8);
  ASSERT_TRUE(s);
  std::tm noon{};
  noon.tm_year = 2026 - 1900;
  noon.tm_mon = 10;
  noon.tm_mday = 30;
  noon.tm_hour = 12;
  noon.tm_isdst = -1;
  EXPECT_EQ(s->time, std::chrono::system_clock::from_time_t(std::mktime(&noon)));
  EXPECT_DOUBLE_EQ(s->flops, 3e15);
  EXPECT_FALSE(progress_start(lines, 4));
}
