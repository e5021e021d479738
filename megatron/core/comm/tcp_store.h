// TCPStore: a tiny key-value rendezvous server (like torch.distributed.TCPStore). Rank 0 serves it
// at MASTER_ADDR:MASTER_PORT; every rank (rank 0 included) is a client. Used to bootstrap NCCL
// (the ncclUniqueId) and the TCP backend (peer addresses), without MPI.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "megatron/core/comm/tcp/net.h"

namespace megatron::comm {

class TCPStoreServer;

class TCPStore {
 public:
  /// is_server: also start the server (rank 0) on `port` (0 = ephemeral, see port()).
  /// Connecting retries until `timeout`; throws UserError naming host:port if unreachable.
  TCPStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout);
  ~TCPStore();
  void set(const std::string& key, const std::string& value);
  /// Blocks until `key` exists (at most the timeout; then UserError naming the key).
  std::string get(const std::string& key);
  /// Atomically adds delta to the integer at key (missing = 0); returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  /// Blocks until every one of `world` callers has called barrier(name) (at most the timeout).
  void barrier(const std::string& name, int world);
  int port() const { return port_; }
  /// This host's address as seen on the route to the store (what peers should connect to).
  std::string local_address() const;

 private:
  std::string request(uint8_t op, const std::string& key, const std::string& value);
  std::unique_ptr<TCPStoreServer> server_;
  net::Socket sock_;
  std::mutex mu_;
  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
};

}  // namespace megatron::comm
