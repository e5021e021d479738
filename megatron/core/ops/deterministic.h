// Deterministic mode of the device kernels (Megatron's --deterministic-mode), as an API: the
// training setup calls set_deterministic_mode(args.deterministic_mode) once, before the first
// kernel; the CUDA backend reads deterministic_mode() (ops/cuda/deterministic.h says what changes).
// The CPU kernels are deterministic in any mode.
#pragma once

namespace megatron::ops {

/// Turns deterministic mode on or off for every later kernel call (thread-safe).
void set_deterministic_mode(bool on);
/// True after set_deterministic_mode(true), or when the environment has MEGATRON_DETERMINISTIC=1
/// (read at the first call; the switch of the kernel tests, docs/cuda.md). UserError for a value
/// of MEGATRON_DETERMINISTIC other than 0 or 1.
bool deterministic_mode();

}  // namespace megatron::ops
