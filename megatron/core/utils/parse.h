// Strict number parsing shared by flag and environment-variable readers.
#pragma once

#include <charconv>
#include <optional>
#include <string_view>

namespace megatron {

/// The whole of `s` as a base-10 integer (optional leading '-'), or nullopt when `s` is empty, has
/// any other character (spaces, '+', units such as "32MB"), or overflows int64. Callers add the
/// range check and the one-line error naming their flag or variable.
inline std::optional<long long> parse_whole_integer(std::string_view s) {
  long long v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace megatron
