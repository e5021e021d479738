// init_process_group: the world ProcessGroup from the launcher's environment (docs/architecture.md#communication),
// like torch.distributed.init_process_group(backend, init_method="env://").
//
// Environment (first match wins):
//   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE      torchrun / megatron_launch
//   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE   Open MPI's mpirun
//   PMI_RANK, PMI_SIZE                                   MPICH / Intel MPI hydra
//   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE   srun
// MASTER_ADDR (default 127.0.0.1 when all ranks are on one node) and MASTER_PORT (default 29500)
// locate the rendezvous store that rank 0 serves.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/comm/tcp_store.h"

namespace megatron::comm {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool master_addr_given = false;
  std::string source = "none";  // "torchrun", "mpi", "pmi", "slurm", "none"
};

/// Reads the environment. Throws UserError naming the variable when a value is malformed or
/// out of range (e.g. RANK >= WORLD_SIZE).
LaunchEnv detect_launch_env();

struct InitOptions {
  /// "auto" (single rank when world size is 1; mpi when started by an MPI launcher; else tcp),
  /// "mpi", "tcp" (alias "gloo"), or "nccl" (CUDA builds).
  std::string backend = "auto";
  /// --distributed-timeout-minutes (default 10): collectives and rendezvous.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

/// Creates the world group (once per process; later calls with the same backend return it).
/// Sets the watchdog timeout. Throws UserError for an unknown/unavailable backend or a
/// rendezvous that fails or times out.
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});
/// The world group created by init_process_group (nullptr before).
std::shared_ptr<ProcessGroup> get_default_group();
/// Releases the world group and the store (idempotent).
void destroy_process_group();

/// The rendezvous store of this job (created on first use from detect_launch_env()).
std::shared_ptr<TCPStore> get_store();

using BackendFactory = std::function<std::shared_ptr<ProcessGroup>(const LaunchEnv&, const InitOptions&)>;
/// Lets the CUDA library register "nccl" at start-up.
void register_process_group_backend(const std::string& name, BackendFactory factory);

}  // namespace megatron::comm
