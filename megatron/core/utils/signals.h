// Process-wide signal dispositions shared by every program's main().
#pragma once

#include <csignal>

namespace megatron {

/// Ignores SIGXFSZ (sent when a write would exceed the `ulimit -f` file-size limit), so that the
/// write fails with EFBIG instead of killing the process: the failing write then goes through the
/// program's ordinary error path (one `error: <file>: ...` line, temporary files removed, exit 1)
/// as on a full disk. Call first thing in main(); the disposition is inherited by exec'd children.
/// Python (Megatron-LM's interpreter) ignores SIGXFSZ at start-up for the same reason.
inline void ignore_file_size_signal() { std::signal(SIGXFSZ, SIG_IGN); }

}  // namespace megatron
