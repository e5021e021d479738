#include "megatron/core/comm/tcp/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "megatron/core/utils/errors.h"

namespace megatron::comm::net {

Socket::~Socket() { close(); }
Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}
void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {
void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}
}  // namespace

Socket listen_on(int port, int backlog) {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool v6 = fd >= 0;
  if (!v6) fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) user_error("socket() failed: ", std::strerror(errno));
  Socket s(fd);
  int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (v6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  }
  if (rc != 0)
    user_error("cannot listen on port ", port, ": ", std::strerror(errno), " (pick another MASTER_PORT / --master-port)");
  if (::listen(fd, backlog) != 0) user_error("listen() on port ", port, " failed: ", std::strerror(errno));
  return s;
}

int bound_port(const Socket& s) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  getsockname(s.fd(), reinterpret_cast<sockaddr*>(&a), &len);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

std::string local_address(const Socket& s) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  getsockname(s.fd(), reinterpret_cast<sockaddr*>(&a), &len);
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0)
    return "127.0.0.1";
  std::string h = host;
  if (h.rfind("::ffff:", 0) == 0) h = h.substr(7);  // v4-mapped
  return h;
}

Socket connect_to(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no address";
  int delay_ms = 10;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int g = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (g != 0) {
      last = gai_strerror(g);
    } else {
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          freeaddrinfo(res);
          tune(fd);
          return Socket(fd);
        }
        last = std::strerror(errno);
        ::close(fd);
      }
      freeaddrinfo(res);
    }
    if (std::chrono::steady_clock::now() > deadline)
      user_error("cannot reach ", what, " at ", host, ":", port, " within ",
                 std::chrono::duration_cast<std::chrono::seconds>(timeout).count(), " s (", last,
                 "); check MASTER_ADDR/MASTER_PORT and that rank 0 is running");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    delay_ms = std::min(delay_ms * 2, 500);
  }
}

Socket accept_one(const Socket& listener, std::chrono::milliseconds timeout, const std::string& what) {
  pollfd p{listener.fd(), POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) user_error("timed out after ", timeout.count() / 1000.0, " s waiting for ", what);
  if (rc < 0) user_error("poll() failed waiting for ", what, ": ", std::strerror(errno));
  int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) user_error("accept() failed waiting for ", what, ": ", std::strerror(errno));
  tune(fd);
  return Socket(fd);
}

void send_all(int fd, const void* p, size_t n, const std::string& peer) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      ::poll(&pf, 1, 1000);
      continue;
    }
    if (k <= 0) user_error("lost connection to ", peer, " (", std::strerror(errno), "); did that rank die?");
    c += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(int fd, void* p, size_t n, const std::string& peer) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = ::recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLIN, 0};
      ::poll(&pf, 1, 1000);
      continue;
    }
    if (k == 0) user_error("connection closed by ", peer, "; did that rank die?");
    if (k < 0) user_error("lost connection to ", peer, " (", std::strerror(errno), "); did that rank die?");
    c += k;
    n -= static_cast<size_t>(k);
  }
}

void send_u64(int fd, uint64_t v, const std::string& peer) { send_all(fd, &v, 8, peer); }
uint64_t recv_u64(int fd, const std::string& peer) {
  uint64_t v;
  recv_all(fd, &v, 8, peer);
  return v;
}
void send_str(int fd, const std::string& s, const std::string& peer) {
  send_u64(fd, s.size(), peer);
  send_all(fd, s.data(), s.size(), peer);
}
std::string recv_str(int fd, const std::string& peer) {
  uint64_t n = recv_u64(fd, peer);
  MEGATRON_CHECK(n < (1ull << 34)) << "implausible string length " << n << " from " << peer;
  std::string s(n, '\0');
  recv_all(fd, s.data(), n, peer);
  return s;
}

void send_recv(int sfd, const void* sp, size_t sn, int rfd, void* rp, size_t rn, const std::string& peer) {
  const char* s = static_cast<const char*>(sp);
  char* r = static_cast<char*>(rp);
  while (sn > 0 || rn > 0) {
    pollfd pf[2];
    int np = 0, si = -1, ri = -1;
    if (sfd == rfd && sn > 0 && rn > 0) {
      pf[0] = {sfd, POLLIN | POLLOUT, 0};
      si = ri = 0;
      np = 1;
    } else {
      if (sn > 0) {
        pf[np] = {sfd, POLLOUT, 0};
        si = np++;
      }
      if (rn > 0) {
        pf[np] = {rfd, POLLIN, 0};
        ri = np++;
      }
    }
    int rc = ::poll(pf, np, 1000);
    if (rc < 0 && errno != EINTR) user_error("poll() failed talking to ", peer, ": ", std::strerror(errno));
    if (rc <= 0) continue;
    if (ri >= 0 && (pf[ri].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t k = ::recv(rfd, r, rn, MSG_DONTWAIT);
      if (k == 0) user_error("connection closed by ", peer, "; did that rank die?");
      if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        user_error("lost connection to ", peer, " (", std::strerror(errno), "); did that rank die?");
      if (k > 0) {
        r += k;
        rn -= static_cast<size_t>(k);
      }
    }
    if (si >= 0 && sn > 0 && (pf[si].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t k = ::send(sfd, s, sn, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        user_error("lost connection to ", peer, " (", std::strerror(errno), "); did that rank die?");
      if (k > 0) {
        s += k;
        sn -= static_cast<size_t>(k);
      }
    }
  }
}

}  // namespace megatron::comm::net
