#include "megatron/core/comm/tcp_store.h"

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <thread>
#include <vector>

#include "megatron/core/utils/errors.h"

namespace megatron::comm {

namespace {
enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
}

// Server: one thread per client connection; GET waits on a condition variable.
class TCPStoreServer {
 public:
  explicit TCPStoreServer(int port) : listener_(net::listen_on(port)), port_(net::bound_port(listener_)) {
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~TCPStoreServer() {
    stop_ = true;
    ::shutdown(listener_.fd(), SHUT_RDWR);
    if (accept_thread_.joinable()) accept_thread_.join();
    {
      std::lock_guard<std::mutex> l(mu_);
      for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    for (auto& t : clients_) t.join();
  }
  int port() const { return port_; }

 private:
  void accept_loop() {
    while (!stop_) {
      net::Socket s;
      try {
        s = net::accept_one(listener_, std::chrono::milliseconds(200), "store clients");
      } catch (const UserError&) {
        continue;  // timeout or shutdown: re-check stop_
      }
      std::lock_guard<std::mutex> l(mu_);
      client_fds_.push_back(s.fd());
      clients_.emplace_back([this, sock = std::make_shared<net::Socket>(std::move(s))] { serve(*sock); });
    }
  }
  void serve(net::Socket& s) {
    const std::string peer = "a store client";
    try {
      for (;;) {
        uint8_t op;
        net::recv_all(s.fd(), &op, 1, peer);
        std::string key = net::recv_str(s.fd(), peer);
        std::string val = net::recv_str(s.fd(), peer);
        std::string reply;
        {
          std::unique_lock<std::mutex> l(mu_);
          if (op == kSet) {
            kv_[key] = val;
            cv_.notify_all();
          } else if (op == kGet) {
            cv_.wait(l, [&] { return stop_ || kv_.count(key); });
            if (stop_) return;
            reply = kv_[key];
          } else if (op == kAdd) {
            int64_t cur = kv_.count(key) ? std::stoll(kv_[key]) : 0;
            cur += std::stoll(val);
            kv_[key] = std::to_string(cur);
            reply = kv_[key];
            cv_.notify_all();
          } else {
            return;
          }
        }
        net::send_str(s.fd(), reply, peer);
      }
    } catch (const std::exception&) {
      // client went away
    }
  }
  net::Socket listener_;
  int port_;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
  std::vector<std::thread> clients_;
  std::vector<int> client_fds_;
};

TCPStore::TCPStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
  if (is_server) {
    server_ = std::make_unique<TCPStoreServer>(port);
    port_ = server_->port();
  }
  sock_ = net::connect_to(is_server ? "127.0.0.1" : host, port_, timeout, "the rendezvous store (rank 0)");
  if (is_server) {
    // Connect once through the public address too, so local_address() names the interface peers use.
    try {
      net::Socket probe = net::connect_to(host, port_, std::chrono::milliseconds(2000), "the rendezvous store");
      sock_ = std::move(probe);
    } catch (const UserError&) {
    }
  }
}

TCPStore::~TCPStore() {
  sock_.close();
  server_.reset();
}

std::string TCPStore::request(uint8_t op, const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> l(mu_);
  const std::string peer = "the rendezvous store at " + host_ + ":" + std::to_string(port_);
  if (op == kGet) {
    // Bound the wait: poll for readability with the timeout.
    net::send_all(sock_.fd(), &op, 1, peer);
    net::send_str(sock_.fd(), key, peer);
    net::send_str(sock_.fd(), value, peer);
    pollfd p{sock_.fd(), POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(timeout_.count()));
    if (rc == 0)
      user_error("timed out after ", timeout_.count() / 1000.0, " s waiting for store key '", key,
                 "' (a rank did not arrive; --distributed-timeout-minutes)");
    return net::recv_str(sock_.fd(), peer);
  }
  net::send_all(sock_.fd(), &op, 1, peer);
  net::send_str(sock_.fd(), key, peer);
  net::send_str(sock_.fd(), value, peer);
  return net::recv_str(sock_.fd(), peer);
}

void TCPStore::set(const std::string& key, const std::string& value) { request(kSet, key, value); }
std::string TCPStore::get(const std::string& key) { return request(kGet, key, ""); }
int64_t TCPStore::add(const std::string& key, int64_t delta) { return std::stoll(request(kAdd, key, std::to_string(delta))); }

void TCPStore::barrier(const std::string& name, int world) {
  int64_t n = add("barrier/" + name + "/count", 1);
  if (n == world) set("barrier/" + name + "/done", "1");
  get("barrier/" + name + "/done");
}

std::string TCPStore::local_address() const { return net::local_address(sock_); }

}  // namespace megatron::comm
