// Boolean environment switches (A/B comparison switches such as MEGATRON_GEMM_EPILOGUES).
#pragma once

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

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

/// The value of environment variable `name`, one of `choices`: unset or empty -> `dflt`. Any other
/// value throws UserError naming the variable and the choices. Reads the environment on every
/// call (callers on a hot path cache the answer).
inline std::string env_choice(const char* name, std::initializer_list<const char*> choices, const char* dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  std::string list;
  for (const char* c : choices) {
    if (!std::strcmp(v, c)) return v;
    list += (list.empty() ? "" : ", ") + std::string(c);
  }
  user_error(name, "='", v, "': expected one of ", list, "; unset it for the default (", dflt, ")");
}

/// The integer in environment variable `name`, within [lo, hi]: unset or empty -> `dflt`. Any
/// other value (not a whole decimal number, or out of range) throws UserError naming the variable
/// and the range. Reads the environment on every call.
inline int env_int_in(const char* name, int lo, int hi, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  const long i = std::strtol(v, &end, 10);
  if (*end || i < lo || i > hi)
    user_error(name, "='", v, "': expected an integer in ", lo, "..", hi, "; unset it for the default (", dflt, ")");
  return static_cast<int>(i);
}

}  // namespace megatron
