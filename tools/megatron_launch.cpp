// megatron_launch: starts N local ranks of a program the way `torchrun --no-python` does.
//
//   megatron_launch [--nproc-per-node N] [--nnodes M] [--node-rank K]
//                   [--master-addr HOST] [--master-port PORT] [--no-python] PROGRAM [ARGS...]
//
// Each child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT (and OMP_NUM_THREADS=1 when unset and N > 1, as torchrun). SIGINT/SIGTERM/SIGHUP
// are forwarded to every child. When one rank fails (non-zero exit or a signal) the launcher
// names it, terminates the others (SIGTERM, then SIGKILL after 10 s) and exits with status 1.
// Underscore spellings (--nproc_per_node ...) are accepted as in torchrun.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <string>
#include <thread>
#include <vector>
#include "megatron/core/utils/signals.h"

extern char** environ;

namespace {

volatile sig_atomic_t g_signal = 0;
void on_signal(int s) { g_signal = s; }

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "megatron_launch: %s\nusage: megatron_launch [--nproc-per-node N] [--nnodes M] [--node-rank K] "
               "[--master-addr HOST] [--master-port PORT] [--no-python] PROGRAM [ARGS...]\n", msg.c_str());
  std::exit(2);
}

int parse_int(const std::string& flag, const std::string& v, int lo, int hi) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo || x > hi)
    usage_error(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
  return static_cast<int>(x);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    const char* name = sigabbrev_np(s);
    return "was killed by signal " + std::to_string(s) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "ended with status " + std::to_string(status);
}

}  // namespace

int main(int argc, char** argv) {
  megatron::ignore_file_size_signal();  // writes past `ulimit -f` fail with EFBIG, not a signal
  int nproc = 1, nnodes = 1, node_rank = 0, master_port = 29500;
  std::string master_addr = "127.0.0.1";
  bool addr_given = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) break;
    if (a == "--") {
      ++i;
      break;
    }
    std::string key = a, val;
    auto eq = a.find('=');
    if (eq != std::string::npos) {
      key = a.substr(0, eq);
      val = a.substr(eq + 1);
    }
    for (auto& c : key)
      if (c == '_') c = '-';
    if (key == "--no-python" || key == "--standalone") continue;
    if (eq == std::string::npos) {
      if (i + 1 >= argc) usage_error(key + " needs a value");
      val = argv[++i];
    }
    if (key == "--nproc-per-node") nproc = parse_int(key, val, 1, 4096);
    else if (key == "--nnodes") nnodes = parse_int(key, val, 1, 1 << 20);
    else if (key == "--node-rank") node_rank = parse_int(key, val, 0, 1 << 20);
    else if (key == "--master-addr") { master_addr = val; addr_given = true; }
    else if (key == "--master-port") master_port = parse_int(key, val, 1, 65535);
    else usage_error("unknown option " + key);
  }
  if (i >= argc) usage_error("no program given");
  if (node_rank >= nnodes) usage_error("--node-rank " + std::to_string(node_rank) + " must be below --nnodes " + std::to_string(nnodes));
  if (nnodes > 1 && !addr_given)
    std::fprintf(stderr, "megatron_launch: warning: --nnodes %d without --master-addr; using %s\n", nnodes, master_addr.c_str());
  const int world = nproc * nnodes;

  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);

  // Environment shared by all children; MPI launcher variables are removed so the children do
  // not mistake themselves for MPI ranks.
  std::map<std::string, std::string> base;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    std::string k = kv.substr(0, eq);
    if (k.rfind("OMPI_COMM_WORLD_", 0) == 0 || k.rfind("PMI_", 0) == 0 || k.rfind("PMIX_", 0) == 0) continue;
    base[k] = kv.substr(eq + 1);
  }
  if (nproc > 1 && !base.count("OMP_NUM_THREADS")) {
    std::fprintf(stderr, "megatron_launch: setting OMP_NUM_THREADS=1 for each rank (set it yourself to override)\n");
    base["OMP_NUM_THREADS"] = "1";
  }
  base["MASTER_ADDR"] = master_addr;
  base["MASTER_PORT"] = std::to_string(master_port);
  base["WORLD_SIZE"] = std::to_string(world);
  base["LOCAL_WORLD_SIZE"] = std::to_string(nproc);
  base["GROUP_RANK"] = std::to_string(node_rank);

  std::map<pid_t, int> pids;  // pid -> local rank
  for (int local = 0; local < nproc; ++local) {
    const int rank = node_rank * nproc + local;
    auto env = base;
    env["RANK"] = env["ROLE_RANK"] = std::to_string(rank);
    env["LOCAL_RANK"] = std::to_string(local);
    std::vector<std::string> strs;
    for (auto& [k, v] : env) strs.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : strs) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("megatron_launch: fork");
      for (auto& [p, l] : pids) kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      struct sigaction dfl{};
      dfl.sa_handler = SIG_DFL;
      for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &dfl, nullptr);
      execvpe(argv[i], argv + i, envp.data());
      std::fprintf(stderr, "megatron_launch: cannot run %s: %s\n", argv[i], std::strerror(errno));
      _exit(127);
    }
    pids[pid] = local;
  }

  int exit_code = 0;
  bool terminating = false;
  auto terminate_all = [&](int sig) {
    for (auto& [p, l] : pids) kill(p, sig);
  };
  std::chrono::steady_clock::time_point kill_deadline;
  while (!pids.empty()) {
    if (g_signal && !terminating) {
      std::fprintf(stderr, "megatron_launch: received signal %d; forwarding it to %zu rank(s)\n", int(g_signal), pids.size());
      terminate_all(g_signal);
      terminating = true;
      exit_code = 128 + g_signal;
      kill_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
    if (terminating && std::chrono::steady_clock::now() > kill_deadline) {
      terminate_all(SIGKILL);
      kill_deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
    int status = 0;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p == 0 || (p < 0 && errno == EINTR)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (p < 0) break;
    auto it = pids.find(p);
    if (it == pids.end()) continue;
    const int local = it->second;
    pids.erase(it);
    const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failed && !terminating) {
      // Report every rank that has already ended: the rank that died first is often reaped
      // after a peer that merely noticed its death.
      std::vector<std::pair<int, std::string>> failures{{local, describe_status(status) + " (pid " + std::to_string(p) + ")"}};
      for (;;) {
        int st = 0;
        pid_t q = waitpid(-1, &st, WNOHANG);
        if (q <= 0) break;
        auto jt = pids.find(q);
        if (jt == pids.end()) continue;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
          failures.push_back({jt->second, describe_status(st) + " (pid " + std::to_string(q) + ")"});
        pids.erase(jt);
      }
      std::sort(failures.begin(), failures.end());
      for (auto& [l, what] : failures)
        std::fprintf(stderr, "megatron_launch: rank %d (local rank %d) %s\n", node_rank * nproc + l, l, what.c_str());
      std::fprintf(stderr, "megatron_launch: terminating the other %zu rank(s)\n", pids.size());
      terminate_all(SIGTERM);
      terminating = true;
      exit_code = 1;
      kill_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
  }
  return exit_code;
}
