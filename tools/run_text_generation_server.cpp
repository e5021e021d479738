// run_text_generation_server: Megatron-LM's tools/run_text_generation_server.py — loads a GPT /
// LLaMA checkpoint (pretrain_gpt's, or one imported with convert_checkpoint --loader hf) and
// serves Megatron's REST API on --port (default 5000):
//
//   PUT /api  {"prompts": [...], "tokens_to_generate": 64, "temperature": 1.0, "top_k": 0,
//              "top_p": 0.0, "logprobs": false, "add_BOS": false, "random_seed": -1, ...}
//   -> 200 {"text": [...], "segments": [[...]], "logprobs": [[...]] | null, "tokens": [[...]]}
//   -> 400 "<Megatron's message>" (a JSON string) for a bad request
//
// Flags: every pretrain_gpt model/tokenizer/parallel/checkpoint flag (--load, --tokenizer-type,
// --tensor-model-parallel-size, ...), plus Megatron's text-generation flags --port,
// --max-tokens-to-oom, --inference-max-seq-length and the one-shot ones --prompts P [P ...],
// --num-tokens-to-generate, --temperature, --top_k, --top_p, --return-log-probs: with --prompts the
// program answers those prompts once (the PUT /api response on stdout, one JSON line) and exits
// without opening a port. Several ranks (mpirun / megatron_launch): tensor parallelism; rank 0
// serves and broadcasts each request to the others (Megatron's send_do_generate). SIGTERM / SIGINT
// stop the server cleanly (in-flight requests finish, the other ranks are released, exit 0).
// See docs/inference.md.
#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <mutex>
#include <thread>
#include <tuple>

#include "megatron/core/comm/init_process_group.h"
#include "megatron/core/inference/text_generation_server.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/utils/env.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/arg_utils.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_args.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/config_from_args.h"
#include "megatron/core/utils/signals.h"

using namespace megatron;
using nlohmann::json;

/// Raises the accept backlog of this process's listening TCP socket(s) on `port` to SOMAXCONN.
/// cpp-httplib (Debian's compiled 0.11) listens with a backlog of 5 and has no setting for it; with
/// more simultaneous connects than that, Linux with SYN cookies completes handshakes the accept
/// queue has no room for and the clients' first request is answered by a reset ("Connection reset
/// by peer", seen with 100 parallel clients on a loaded machine). listen(2) on a socket that is
/// already listening only updates the backlog (Linux, POSIX leaves it open), so the socket found
/// by its bound port among /proc/self/fd is listened on again. Returns how many were widened.
static int widen_listen_backlog(int port) {
  int widened = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (bound == port && ::listen(static_cast<int>(fd), SOMAXCONN) == 0) ++widened;
  }
  closedir(d);
  return widened;
}

/// The self-pipe of the SIGTERM / SIGINT handler (see run()).
static int g_signal_pipe[2] = {-1, -1};
/// Async-signal-safe: writes the signal number to the pipe.
static void on_stop_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

namespace inf = megatron::inference;
namespace ps = megatron::parallel_state;

namespace {

/// Megatron's add_text_generate_args (+ the inference flags it reads), with its defaults.
struct TextGenerateArgs {
  int64_t port = 5000;
  int64_t max_tokens_to_oom = 12000;
  int64_t inference_max_seq_length = 2560;
  std::vector<std::string> prompts;  // one-shot mode
  int64_t num_tokens_to_generate = 30;
  double temperature = 1.0;
  int64_t top_k = 1;
  double top_p = 0.0;
  bool return_log_probs = true;  // Megatron: store_true with default True
};

int64_t to_int(const std::string& flag, const std::string& v) {
  try {
    size_t pos = 0;
    const long long x = std::stoll(v, &pos);
    if (pos == v.size()) return x;
  } catch (const std::exception&) {
  }
  user_error("argument ", flag, ": invalid int value: '", v, "'");
}
double to_float(const std::string& flag, const std::string& v) {
  try {
    size_t pos = 0;
    const double x = std::stod(v, &pos);
    if (pos == v.size()) return x;
  } catch (const std::exception&) {
  }
  user_error("argument ", flag, ": invalid float value: '", v, "'");
}

/// Takes the text-generation flags out of argv (Megatron's extra_args_provider); the rest goes to
/// pretrain_gpt's parser.
std::vector<std::string> take_text_generate_args(int argc, char** argv, TextGenerateArgs& t) {
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    const size_t eq = a.find('=');
    const bool glued = a.rfind("--", 0) == 0 && eq != std::string::npos;
    const std::string name = glued ? a.substr(0, eq) : a;
    auto value = [&]() -> std::string {
      if (glued) return a.substr(eq + 1);
      if (i + 1 >= argc || training::looks_like_option(argv[i + 1]))
        user_error("argument ", name, ": expected one argument");
      return argv[++i];
    };
    if (name == "--port") t.port = to_int(name, value());
    else if (name == "--max-tokens-to-oom") t.max_tokens_to_oom = to_int(name, value());
    else if (name == "--inference-max-seq-length") t.inference_max_seq_length = to_int(name, value());
    else if (name == "--num-tokens-to-generate") t.num_tokens_to_generate = to_int(name, value());
    else if (name == "--temperature") t.temperature = to_float(name, value());
    else if (name == "--top_k") t.top_k = to_int(name, value());
    else if (name == "--top_p") t.top_p = to_float(name, value());
    else if (name == "--return-log-probs") t.return_log_probs = true;
    else if (name == "--prompts") {
      t.prompts.clear();
      if (glued) t.prompts.push_back(a.substr(eq + 1));
      while (!glued && i + 1 < argc && !training::looks_like_option(argv[i + 1])) t.prompts.emplace_back(argv[++i]);
      if (t.prompts.empty()) user_error("argument --prompts: expected at least one argument");
    } else if (name == "--max-batch-size" || name == "--inference-max-requests" || name == "--inference-max-batch-size") {
      user_error(name, ": not implemented; a request is generated as one batch (at most 128 prompts and "
                 "--max-tokens-to-oom tokens), see docs/inference.md");
    } else {
      rest.push_back(a);
    }
  }
  if (t.port <= 0 || t.port > 65535) user_error("--port ", t.port, ": must be in 1..65535");
  if (t.max_tokens_to_oom <= 0) user_error("--max-tokens-to-oom ", t.max_tokens_to_oom, ": must be positive");
  if (t.inference_max_seq_length <= 0)
    user_error("--inference-max-seq-length ", t.inference_max_seq_length, ": must be positive");
  return rest;
}

std::string env_str(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v && *v ? v : dflt;
}

/// As pretrain_gpt: cuda:LOCAL_RANK when a GPU is usable, else the CPU; MEGATRON_DEVICE=cpu|cuda forces.
Device choose_device(int local_rank) {
  const std::string w = env_str("MEGATRON_DEVICE", "");
  if (!w.empty() && w != "cpu" && w != "cuda")
    user_error("MEGATRON_DEVICE=", w, ": unknown device (use cpu or cuda, or leave it unset for GPU when present)");
  const bool have_cuda = w != "cpu" && backend_available(DeviceType::kCUDA);
  if (w == "cuda" && !have_cuda) user_error("MEGATRON_DEVICE=cuda: no usable CUDA device");
  if (!have_cuda) return Device::cpu();
  return Device::cuda(local_rank);
}

std::string now_str() {
  const auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int run(int argc, char** argv) {
  TextGenerateArgs tg;
  const std::vector<std::string> argv_list = take_text_generate_args(argc, argv, tg);
  training::Arguments args = training::parse_args(argv_list);
  const comm::LaunchEnv env = comm::detect_launch_env();
  if (args.use_checkpoint_args) {  // Megatron: the checkpoint's model arguments, before validate_args
    std::vector<std::string> lines;
    args = training::load_args_from_checkpoint(argv_list, args, lines);
    if (env.rank == 0)
      for (const auto& l : lines) std::printf("%s\n", l.c_str());
    std::fflush(stdout);
  }
  if (!tg.prompts.empty() && tg.top_p > 0.0 && tg.top_k > 0)  // before any rank waits on another
    user_error("--top_p ", tg.top_p, " with --top_k ", tg.top_k, ": cannot set both top-k and top-p samplings "
               "(--top_k defaults to 1, greedy, as Megatron's); pass --top_k 0 to sample with --top_p");
  // Megatron's args_defaults for the server, and what a model-only run does not need.
  args.no_load_rng = true;
  args.no_load_optim = true;
  args.exit_on_missing_checkpoint = true;
  if (!args.micro_batch_size) args.micro_batch_size = 1;
  if (!args.seq_length && args.max_position_embeddings) args.seq_length = args.max_position_embeddings;
  if (!args.train_iters && !args.train_samples) args.train_iters = 0;
  args.skip_train = true;  // no optimizer / learning-rate flags needed
  args.world_size = env.world_size;
  args.rank = env.rank;
  training::validate_args(args);
  auto say = [&](const std::string& s) {
    if (args.rank == 0) {
      std::printf("%s\n", s.c_str());
      std::fflush(stdout);
    }
  };
  if (args.pipeline_model_parallel_size > 1)
    user_error("--pipeline-model-parallel-size ", args.pipeline_model_parallel_size,
               ": pipeline-parallel generation is not implemented; use --pipeline-model-parallel-size 1 "
               "(checkpoints reshard on load)");
  if (args.context_parallel_size > 1)
    user_error("--context-parallel-size ", args.context_parallel_size, ": not supported for text generation");
  if (args.num_layers_per_virtual_pipeline_stage)
    user_error("Interleaved pipeline schedule is not yet supported for text generation.");

  const Device device = choose_device(env.local_rank);
  comm::InitOptions io;
  io.backend = device.is_cuda() && args.world_size > 1 ? "nccl" : "auto";
  io.timeout = std::chrono::minutes(args.distributed_timeout_minutes);
  auto world = comm::init_process_group(io);
  ps::ParallelConfig pc;
  pc.tensor_model_parallel_size = static_cast<int>(args.tensor_model_parallel_size);
  ps::initialize_model_parallel(world, pc);

  say("> building " + args.tokenizer.tokenizer_type + " tokenizer ...");
  std::shared_ptr<tokenizers::MegatronTokenizer> tokenizer = tokenizers::build_tokenizer(args.tokenizer);
  if (const std::string l = training::set_padded_vocab_size(args, tokenizer->vocab_size()); !l.empty()) say(l);
  say("building GPT model ...");
  transformer::TransformerConfig config = training::core_transformer_config_from_args(args);
  config.sequence_parallel = false;  // generation runs 1-token steps; the weights are the same
  models::gpt::GPTModelParallel par;
  par.tp_group = ps::get_tensor_model_parallel_group();
  par.allocate_main_grads = false;
  models::gpt::GPTModel model(config, args.padded_vocab_size, *args.max_position_embeddings,
                              static_cast<uint64_t>(args.seed), device, par);

  if (args.load) {
    training::CheckpointConfig cc;
    cc.load = *args.load;
    cc.no_load_optim = cc.no_load_rng = true;
    cc.exit_on_missing_checkpoint = true;
    cc.ckpt_step = args.ckpt_step.value_or(-1);
    json expected = training::checkpoint_args(args);
    if (expected.value("vocab_size", json()).is_null()) expected["vocab_size"] = tokenizer->vocab_size();
    cc.expected_args = expected;
    training::ParallelRanks ranks;
    ranks.tp_rank = ps::get_tensor_model_parallel_rank();
    ranks.tp_size = ps::get_tensor_model_parallel_world_size();
    ranks.dp_rank = ps::get_data_parallel_rank(true);
    ranks.dp_size = ps::get_data_parallel_world_size(true);
    training::TrainingState st;
    for (const auto& p : model.parameters()) {
      auto pieces = training::parameter_sharded_tensors(p, *args.num_layers, ranks);
      st.model.insert(st.model.end(), pieces.begin(), pieces.end());
    }
    // The routers' trained expert bias (--moe-router-enable-expert-bias), as pretrain_gpt loads it.
    for (auto& b : training::router_state_tensors({&model}, *args.num_layers, ranks)) st.model.push_back(std::move(b));
    (void)training::load_checkpoint(st, cc, ranks, world.get());
  } else {
    say("WARNING: no --load given: generating from the randomly initialized model (--seed " +
        std::to_string(args.seed) + ")");
  }

  inf::TextGenerator generator(model, ps::get_tensor_model_parallel_group(), static_cast<uint64_t>(args.seed));
  if (generator.decode_graph_mode() == inf::DecodeGraphMode::kGraph && args.tensor_model_parallel_size == 1)
    say(std::string("decode steps: CUDA graph per batch size") +
        (generator.decode_pipeline() ? ", greedy steps pipelined" : "") +
        " (docs/inference.md; MEGATRON_DECODE_CUDA_GRAPH=1: a graph launch per step, 0: op by op)");
  inf::GenerationLimits limits;
  limits.max_position_embeddings = *args.max_position_embeddings;
  limits.max_tokens_to_oom = tg.max_tokens_to_oom;
  limits.inference_max_seq_length = tg.inference_max_seq_length;
  limits.padded_vocab_size = args.padded_vocab_size;

  if (world->rank() != 0) {
    inf::serve_workers(*world, device, generator, *tokenizer);
    comm::destroy_process_group();
    return 0;
  }

  // Validates, tokenizes, broadcasts and generates one request (rank 0). Returns status and body.
  std::mutex lock;  // Megatron's LOCK: one generation at a time
  auto handle = [&](const std::string& body, const std::string& remote) -> std::pair<int, std::string> {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded())
      return {400, dump({{"message", "Failed to decode JSON object: the request body is not valid JSON"}})};
    inf::GenerateRequest req;
    if (std::string err = inf::parse_generate_request(j, req); !err.empty()) return {400, dump(err)};
    std::lock_guard<std::mutex> g(lock);
    if (!req.no_log) {
      std::printf("request IP: %s\n%s\nstart time:  %s\n", remote.c_str(), dump(j).c_str(), now_str().c_str());
      std::fflush(stdout);
    }
    inf::PreparedBatch batch;
    try {
      batch = inf::prepare_batch(req, *tokenizer, limits);
    } catch (const inf::GenerationError& e) {
      return {400, dump(std::string(e.what()))};
    }
    inf::send_generate(*world, device, batch);
    json response;
    try {  // every rank fails together (see TextGenerator::generate), so the workers are free again
      response = inf::generate_and_post_process(generator, batch, *tokenizer);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "request failed: %s\n", e.what());
      return {500, dump(std::string(e.what()))};
    }
    if (!req.no_log) {
      std::printf("end time:  %s\n", now_str().c_str());
      std::fflush(stdout);
    }
    return {200, dump(response)};
  };

  if (!tg.prompts.empty()) {  // one-shot: the response to these prompts, then exit
    json j = {{"prompts", tg.prompts},     {"tokens_to_generate", tg.num_tokens_to_generate},
              {"temperature", tg.temperature}, {"top_k", tg.top_k},
              {"logprobs", tg.return_log_probs}, {"no_log", true}};
    if (tg.top_p > 0.0) j["top_p"] = tg.top_p;
    auto [status, out] = handle(j.dump(), "");
    inf::send_stop(*world, device);
    if (status != 200) user_error("run_text_generation_server --prompts: ", json::parse(out).dump());
    std::printf("%s\n", out.c_str());
    std::fflush(stdout);
    comm::destroy_process_group();
    return 0;
  }

  // SIGTERM / SIGINT: stop listening, let in-flight requests finish, release the workers. A
  // process-wide handler, not a blocked mask + sigwait: OpenBLAS / OpenMP threads may exist before
  // main() (library constructors) with the signals unblocked, and would take the default action
  // (exit 143). Whichever thread gets the signal writes it to a pipe the waiter thread reads.
  if (pipe(g_signal_pipe) != 0) user_error("run_text_generation_server: cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  httplib::Server svr;
  svr.new_task_queue = [] { return new httplib::ThreadPool(8); };
  svr.set_payload_max_length(16u << 20);
  svr.Put("/api", [&](const httplib::Request& rq, httplib::Response& rs) {
    int status = 500;
    std::string out;
    try {  // an error still answers with its message (httplib's own 500 has an empty body)
      std::tie(status, out) = handle(rq.body, rq.remote_addr);
    } catch (const std::exception& e) {
      out = dump(std::string(e.what()));
    }
    rs.status = status;
    rs.set_content(out + "\n", "application/json");
  });
  const std::string host = env_str("MEGATRON_TEXT_GENERATION_HOST", "0.0.0.0");
  if (!svr.bind_to_port(host.c_str(), static_cast<int>(tg.port)))
    user_error("--port ", tg.port, ": cannot listen on ", host, ":", tg.port, " (in use?); choose another --port");
  if (widen_listen_backlog(static_cast<int>(tg.port)) == 0)
    std::fprintf(stderr, "warning: could not raise the listen backlog of port %d; many simultaneous clients may be reset\n",
                 static_cast<int>(tg.port));
  bool stopping = false;
  std::condition_variable cv;
  std::mutex cv_m;
  std::thread waiter([&] {
    unsigned char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;  // woken by the main thread: listen ended by itself
    std::printf("received signal %d: shutting down the text generation server\n", static_cast<int>(sig));
    std::fflush(stdout);
    svr.stop();
  });
  // Keep-alive for the other ranks while idle (their broadcast waits under the distributed timeout).
  std::thread pinger([&] {
    std::unique_lock<std::mutex> l(cv_m);
    while (!cv.wait_for(l, std::chrono::seconds(5), [&] { return stopping; })) {
      std::lock_guard<std::mutex> g(lock);
      inf::send_ping(*world, device);
    }
  });
  say(" * Serving Megatron's text generation API on http://" + host + ":" + std::to_string(tg.port) + "/api (PUT)");
  svr.listen_after_bind();
  {
    std::lock_guard<std::mutex> l(cv_m);
    stopping = true;
  }
  cv.notify_all();
  pinger.join();
  {
    const unsigned char wake = 0;  // a no-op if the waiter already took a signal
    (void)!write(g_signal_pipe[1], &wake, 1);
    waiter.join();
  }
  {
    std::lock_guard<std::mutex> g(lock);
    inf::send_stop(*world, device);
  }
  say("text generation server stopped");
  comm::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  megatron::ignore_file_size_signal();  // writes past `ulimit -f` fail with EFBIG, not a signal
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
