// TCP backend of ProcessGroup for CPU tensors: what runs when ranks are started by torchrun,
// our megatron_launch or srun without MPI (only RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT known).
//
// Rendezvous through the TCPStore of rank 0; every group opens its own full mesh of sockets
// (collectives and point-to-point traffic on separate connections). Collectives are ring
// algorithms (reduce-scatter then all-gather) run on the group's worker thread in call order;
// reductions accumulate in fp32/fp64/int64 (reduction.h), so every rank ends with bit-identical
// results. A peer that dies shows up as a closed connection (UserError naming the peer rank); a
// collective that hangs is ended by the watchdog (comm_worker.h).
#pragma once

#include <memory>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/comm/tcp_store.h"

namespace megatron::comm {

/// The world group of `world_size` ranks rendezvousing through `store`. Collective over all ranks.
std::shared_ptr<ProcessGroup> make_tcp_world_group(std::shared_ptr<TCPStore> store, int rank, int world_size);

}  // namespace megatron::comm
