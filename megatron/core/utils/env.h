// Boolean environment switches (A/B comparison switches such as MEGATRON_GEMM_EPILOGUES).
#pragma once

#include <cstdlib>
#include <cstring>

#include "megatron/core/utils/errors.h"

namespace megatron {

/// The on/off switch in environment variable `name`: unset or empty -> `dflt`, "0" -> false,
/// "1" -> true. Any other value throws UserError naming the variable (so "off", "true" or "10"
/// are not silently read one way or the other). Reads the environment on every call; callers that
/// sit on a hot path cache the answer in a function-local static.
inline bool env_switch(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  if (!std::strcmp(v, "0")) return false;
  if (!std::strcmp(v, "1")) return true;
  user_error(name, "=", v, ": expected 0 (off) or 1 (on); unset it for the default (", dflt ? "on" : "off", ")");
}

}  // namespace megatron
