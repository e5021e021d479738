#include "megatron/core/comm/init_process_group.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include "megatron/core/comm/comm_worker.h"
#include "megatron/core/comm/mpi/mpi_process_group.h"
#include "megatron/core/comm/tcp/tcp_process_group.h"
#include "megatron/core/utils/parse.h"

namespace megatron::comm {

namespace {
std::mutex g_mu;
std::shared_ptr<ProcessGroup> g_world;
std::string g_world_backend;
std::shared_ptr<TCPStore> g_store;

std::map<std::string, BackendFactory>& registry() {
  static std::map<std::string, BackendFactory> r;
  return r;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int env_int(const char* name, int lo) {
  const char* v = env(name);
  const auto x = parse_whole_integer(v);
  if (!x || *x < lo || *x > (1 << 24)) user_error("environment variable ", name, "='", v, "' is not a valid integer >= ", lo);
  return static_cast<int>(*x);
}

std::shared_ptr<TCPStore> make_store(const LaunchEnv& e, std::chrono::milliseconds timeout) {
  return std::make_shared<TCPStore>(e.master_addr, e.master_port, e.rank == 0, timeout);
}
}  // namespace

LaunchEnv detect_launch_env() {
  LaunchEnv e;
  struct Names {
    const char *rank, *size, *local_rank, *local_size, *source;
  };
  const Names candidates[] = {
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "mpi"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "pmi"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "slurm"},
  };
  for (const auto& c : candidates) {
    if (!env(c.rank) || !env(c.size)) continue;
    e.rank = env_int(c.rank, 0);
    e.world_size = env_int(c.size, 1);
    if (e.rank >= e.world_size) user_error(c.rank, "=", e.rank, " must be below ", c.size, "=", e.world_size);
    e.local_rank = env(c.local_rank) ? env_int(c.local_rank, 0) : 0;
    // SLURM_NTASKS_PER_NODE may look like "4(x2)"; only its leading integer matters.
    if (env(c.local_size)) e.local_world_size = std::max(1, std::atoi(env(c.local_size)));
    e.source = c.source;
    break;
  }
  if (env("MASTER_ADDR")) {
    e.master_addr = env("MASTER_ADDR");
    e.master_addr_given = true;
  }
  if (env("MASTER_PORT")) {
    e.master_port = env_int("MASTER_PORT", 1);
    if (e.master_port > 65535) user_error("MASTER_PORT=", e.master_port, " is not a TCP port");
  }
  return e;
}

void register_process_group_backend(const std::string& name, BackendFactory factory) {
  std::lock_guard<std::mutex> l(g_mu);
  registry()[name] = std::move(factory);
}

std::shared_ptr<TCPStore> get_store() {
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_store) {
    LaunchEnv e = detect_launch_env();
    if (e.world_size > 1 && !e.master_addr_given && e.local_world_size < e.world_size)
      user_error("MASTER_ADDR is not set and the ", e.world_size, " ranks span several nodes (", e.local_world_size,
                 " per node); export MASTER_ADDR=<host of rank 0> (and MASTER_PORT) to every rank");
    g_store = make_store(e, distributed_timeout());
  }
  return g_store;
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& o) {
  set_distributed_timeout(o.timeout);
  LaunchEnv e = detect_launch_env();
  std::string backend = o.backend == "gloo" ? "tcp" : o.backend;
  if (backend == "auto") {
    if (e.world_size == 1 && !launched_by_mpi())
      backend = "single";
    else if (launched_by_mpi())
      backend = "mpi";
    else
      backend = "tcp";
  }
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (g_world) {
      if (g_world_backend != backend)
        user_error("init_process_group: already initialized with backend '", g_world_backend, "', asked for '", backend, "'");
      return g_world;
    }
  }
  set_global_rank_for_messages(e.rank);
  std::shared_ptr<ProcessGroup> world;
  if (backend == "single") {
    world = make_single_rank_group(0);
  } else if (backend == "mpi") {
    world = make_mpi_world_group();
  } else if (backend == "tcp") {
    world = make_tcp_world_group(get_store(), e.rank, e.world_size);
  } else {
    BackendFactory f;
    {
      std::lock_guard<std::mutex> l(g_mu);
      auto it = registry().find(backend);
      if (it != registry().end()) f = it->second;
    }
    if (!f) {
      if (backend == "nccl")
        user_error("--distributed-backend nccl: this build has no NCCL backend (configure with CUDA and NCCL)");
      user_error("unknown distributed backend '", o.backend, "' (use auto, mpi, tcp/gloo or nccl)");
    }
    world = f(e, o);
  }
  std::lock_guard<std::mutex> l(g_mu);
  g_world = world;
  g_world_backend = backend;
  return world;
}

std::shared_ptr<ProcessGroup> get_default_group() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_world;
}

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> w;
  std::shared_ptr<TCPStore> s;
  {
    std::lock_guard<std::mutex> l(g_mu);
    w.swap(g_world);
    s.swap(g_store);
    g_world_backend.clear();
  }
}

}  // namespace megatron::comm
