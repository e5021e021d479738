// In-process ProcessGroup for tests: N "ranks" are N threads of one process sharing memory.
// Implements the collectives dist_checkpointing uses (barrier, broadcast, all_reduce, all_gather)
// so multi-rank save/load can be tested without MPI.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "megatron/core/comm/process_group.h"

namespace megatron::testing {

/// Creates `n` groups that talk to each other; group i has rank i.
std::vector<std::shared_ptr<comm::ProcessGroup>> make_thread_groups(int n);

/// Runs fn(rank, group) on n threads (one per rank) and rethrows the first exception.
void run_ranks(int n, const std::function<void(int, comm::ProcessGroup&)>& fn);

}  // namespace megatron::testing
