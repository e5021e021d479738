// MPI backend of ProcessGroup for CPU tensors (docs/architecture.md#communication).
//
// * Collectives run on one worker thread per group (MPI_THREAD_MULTIPLE), in call order, so
//   `async=true` overlaps them with the caller; subgroups come from MPI_Comm_split.
// * bf16/fp16 (and small integer) reductions are widened to fp32 (int64) before MPI sees them
//   and rounded once afterwards (reduction.h); fp32/fp64/int64 go to MPI directly.
// * send/recv are MPI_Isend/MPI_Irecv posted by the caller (so a send and a recv posted back to
//   back never deadlock); wait() polls the request under the watchdog timeout.
// * MPI is initialized on first use and finalized at exit; a collective that outlasts the
//   distributed timeout ends the job through MPI_Abort with a message naming the collective.
#pragma once

#include <memory>

#include "megatron/core/comm/process_group.h"

namespace megatron::comm {

/// True when this process was started by an MPI launcher (mpirun / srun --mpi=pmix: the
/// OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK variables are set).
bool launched_by_mpi();

/// The group of all MPI processes (MPI_COMM_WORLD duplicated). Initializes MPI with
/// MPI_THREAD_MULTIPLE on first call; throws UserError if the MPI library lacks thread support.
std::shared_ptr<ProcessGroup> make_mpi_world_group();

}  // namespace megatron::comm
