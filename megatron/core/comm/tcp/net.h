// Small blocking-socket helpers for the TCP store and the TCP backend (IPv4/IPv6 via getaddrinfo).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace megatron::comm::net {

/// An owned socket file descriptor (closed on destruction).
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();

 private:
  int fd_ = -1;
};

/// Listens on all interfaces at `port` (0 = ephemeral); throws UserError naming the port if busy.
Socket listen_on(int port, int backlog = 128);
/// The port a listening socket is bound to.
int bound_port(const Socket& s);
/// Local address (numeric) of a connected socket: the interface this host uses to reach the peer.
std::string local_address(const Socket& s);
/// Connects to host:port, retrying until `timeout` passes (the server may start later).
/// Throws UserError "cannot reach <what> at host:port within N s".
Socket connect_to(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what);
/// Accepts one connection, waiting at most `timeout`; throws UserError on timeout.
Socket accept_one(const Socket& listener, std::chrono::milliseconds timeout, const std::string& what);

/// Sends/receives exactly n bytes. A closed or reset connection throws UserError naming `peer`.
void send_all(int fd, const void* p, size_t n, const std::string& peer);
void recv_all(int fd, void* p, size_t n, const std::string& peer);
void send_u64(int fd, uint64_t v, const std::string& peer);
uint64_t recv_u64(int fd, const std::string& peer);
void send_str(int fd, const std::string& s, const std::string& peer);
std::string recv_str(int fd, const std::string& peer);

/// Sends `sn` bytes on send_fd while receiving `rn` bytes on recv_fd, concurrently (poll), so two
/// peers exchanging large buffers never block each other. The fds may be equal.
void send_recv(int send_fd, const void* sp, size_t sn, int recv_fd, void* rp, size_t rn, const std::string& peer);

}  // namespace megatron::comm::net
