// Helpers for tests that run under mpirun / megatron_launch (tests/functional_tests/dist_*.sh).
#pragma once

#include <memory>

#include "megatron/core/distributed/process_group.h"

namespace megatron::testing {

/// The world group of this test process (created once from the launcher environment; the
/// timeout comes from MEGATRON_TEST_DIST_TIMEOUT_S, default 120 s). Size 1 when not launched.
std::shared_ptr<distributed::ProcessGroup> dist_world();

}  // namespace megatron::testing

/// Skips the test unless the process runs inside a multi-rank launch.
#define SKIP_UNLESS_MULTI_RANK()                                                          \
  do {                                                                                    \
    if (::megatron::testing::dist_world()->size() < 2)                                    \
      GTEST_SKIP() << "needs several ranks: run under mpirun or megatron_launch";         \
  } while (0)
