#include "megatron/core/ops/deterministic.h"

#include <atomic>

#include "megatron/core/utils/env.h"

namespace megatron::ops {

namespace {
std::atomic<bool> g_deterministic{false};
}  // namespace

void set_deterministic_mode(bool on) { g_deterministic.store(on); }

bool deterministic_mode() {
  static const bool from_env = env_switch("MEGATRON_DETERMINISTIC", false);
  return g_deterministic.load() || from_env;
}

}  // namespace megatron::ops
