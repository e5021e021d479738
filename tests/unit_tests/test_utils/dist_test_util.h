// Helpers for tests that run under mpirun / megatron_launch (tests/functional_tests/dist_*.sh).
#pragma once

#include <cstdint>
#include <memory>

#include "megatron/core/datasets/gpt_batch.h"
#include "megatron/core/comm/process_group.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::testing {

/// The world group of this test process (created once from the launcher environment; the
/// timeout comes from MEGATRON_TEST_DIST_TIMEOUT_S, default 120 s). Size 1 when not launched.
std::shared_ptr<comm::ProcessGroup> dist_world();

/// A random GPT micro-batch of b sequences of s tokens for the equivalence tests: tokens and labels
/// drawn alternately, uniform in [0, vocab), from std::mt19937(seed); position ids 0..s-1 in each
/// row; loss mask all ones. Tensors int64 [b, s] (loss mask float32), on the CPU.
datasets::GPTBatch random_gpt_batch(uint32_t seed, int64_t b, int64_t s, int64_t vocab);

/// The plain SGD step of the equivalence tests: p -= 0.1 * g over two float32 tensors of p's size.
void sgd_step(Tensor& p, const Tensor& g);

/// max |a - ref| / max |ref| over the elements (max |a - ref| when ref is all zero).
double max_rel_err(const Tensor& a, const Tensor& ref);

}  // namespace megatron::testing

/// Skips the test unless the process runs inside a multi-rank launch.
#define SKIP_UNLESS_MULTI_RANK()                                                          \
  do {                                                                                    \
    if (::megatron::testing::dist_world()->size() < 2)                                    \
      GTEST_SKIP() << "needs several ranks: run under mpirun or megatron_launch";         \
  } while (0)
