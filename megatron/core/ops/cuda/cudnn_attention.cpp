// cuDNN SDPA forward/backward through the cuDNN 9 backend graph API (see cudnn_attention.h).
//
// The operation graphs are the ones cuDNN's fused flash-attention engines recognise (facts from
// NVIDIA's cuDNN documentation, "Scaled Dot Product Attention", and the graph that the
// cudnn-frontend library lowers its SDPA node to; written here against the C API):
//   forward:  S = Q·Kᵀ; S *= scale; [causal: S = select(row >= col, S, -inf)];
//             M = rowmax(S); E = exp(S - M); Z = rowsum(E); stats = M + log Z; P = E / Z (bf16);
//             O = P·V.
//   backward: Δ = rowsum(dO ∘ O); S = Q·Kᵀ·scale - stats, masked; P = exp(S);
//             dV = Pᵀ·dO; dS = P ∘ (dO·Vᵀ - Δ) · scale; dK = dSᵀ·Q; dQ = dS·K (fp32 accumulator,
//             then converted). Grouped-query attention: per-query-head dK/dV reduced over the
//             heads of each K/V group inside the graph.
// Tensors keep our layouts through strides: q [s, b, np, d] is cuDNN's [b, h, s, d] with strides
// (np·d, d, b·np·d, 1); lse [b, np, s] is the stats tensor [b, h, s, 1].
#include "megatron/core/ops/cuda/cudnn_attention.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "megatron/core/ops/cuda/cuda_utils.h"
#include "megatron/core/ops/cuda/deterministic.h"

#if __has_include(<cudnn.h>)
#include <cudnn.h>
#include "megatron/core/utils/env.h"
#define MEGATRON_HAVE_CUDNN_H 1
#endif

namespace megatron::ops::cuda::cudnn_sdpa {

#if !defined(MEGATRON_HAVE_CUDNN_H) || CUDNN_MAJOR < 9

bool available() { return false; }
std::string last_error() { return "built without cuDNN 9 headers"; }
bool forward(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, Tensor&, Tensor&) { return false; }
bool backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
              const AttentionParams&, Tensor&, Tensor&, Tensor&) {
  return false;
}
bool forward_packed(const Tensor&, int64_t, const AttentionParams&, Tensor&, Tensor&) { return false; }
bool backward_packed(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&, const AttentionParams&,
                     Tensor&) {
  return false;
}

#else

namespace {

// ---- the few cuDNN entry points we use, resolved with dlsym ---------------------------------
struct Api {
  size_t (*getVersion)() = nullptr;
  const char* (*getErrorString)(cudnnStatus_t) = nullptr;
  void (*getLastErrorString)(char*, size_t) = nullptr;
  cudnnStatus_t (*create)(cudnnHandle_t*) = nullptr;
  cudnnStatus_t (*setStream)(cudnnHandle_t, cudaStream_t) = nullptr;
  cudnnStatus_t (*createDesc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*) = nullptr;
  cudnnStatus_t (*destroyDesc)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*setAttr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                           int64_t, const void*) = nullptr;
  cudnnStatus_t (*getAttr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                           int64_t, int64_t*, void*) = nullptr;
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t) = nullptr;
};

std::mutex g_mu;
Api g_api;
int g_state = 0;  // 0 untried, 1 loaded, -1 failed
std::string g_err;
std::map<int, cudnnHandle_t> g_handles;

bool load_locked() {
  if (g_state != 0) return g_state > 0;
  g_state = -1;
  const char* env = std::getenv("MEGATRON_CUDNN_LIB");
  void* h = nullptr;
  for (const char* name : {env, "libcudnn.so.9", "libcudnn.so"}) {
    if (!name || !*name) continue;
    h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h) break;
  }
  if (!h) {
    const char* e = dlerror();
    g_err = std::string("cannot load libcudnn.so.9 (") + (e ? e : "?") + ")";
    return false;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    return fn != nullptr;
  };
  bool ok = sym(g_api.getVersion, "cudnnGetVersion") && sym(g_api.getErrorString, "cudnnGetErrorString") &&
            sym(g_api.create, "cudnnCreate") && sym(g_api.setStream, "cudnnSetStream") &&
            sym(g_api.createDesc, "cudnnBackendCreateDescriptor") &&
            sym(g_api.destroyDesc, "cudnnBackendDestroyDescriptor") && sym(g_api.finalize, "cudnnBackendFinalize") &&
            sym(g_api.setAttr, "cudnnBackendSetAttribute") && sym(g_api.getAttr, "cudnnBackendGetAttribute") &&
            sym(g_api.execute, "cudnnBackendExecute");
  sym(g_api.getLastErrorString, "cudnnGetLastErrorString");  // optional
  if (!ok) {
    g_err = "libcudnn lacks the backend API symbols";
    return false;
  }
  if (g_api.getVersion() < 90000) {
    g_err = "cuDNN " + std::to_string(g_api.getVersion()) + " < 9.0";
    return false;
  }
  g_state = 1;
  return true;
}

cudnnHandle_t handle_locked() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  auto it = g_handles.find(dev);
  if (it != g_handles.end()) return it->second;
  cudnnHandle_t hd = nullptr;
  cudnnStatus_t st = g_api.create(&hd);
  if (st != CUDNN_STATUS_SUCCESS) {
    g_err = std::string("cudnnCreate: ") + g_api.getErrorString(st);
    hd = nullptr;
  }
  g_handles[dev] = hd;
  return hd;
}

// Thrown inside graph building; caught and turned into "unsupported" (fallback to our kernels).
struct CudnnError {
  std::string what;
};

void ck(cudnnStatus_t st, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  std::string m = std::string(what) + ": " + g_api.getErrorString(st);
  if (g_api.getLastErrorString) {
    char buf[512] = {0};
    g_api.getLastErrorString(buf, sizeof buf);
    if (buf[0]) m += std::string(" (") + buf + ")";
  }
  throw CudnnError{m};
}

// Owner of every backend descriptor of one graph/plan (destroyed together).
struct Descs {
  std::vector<cudnnBackendDescriptor_t> all;
  ~Descs() {
    for (auto it = all.rbegin(); it != all.rend(); ++it) g_api.destroyDesc(*it);
  }
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = nullptr;
    ck(g_api.createDesc(t, &d), "cudnnBackendCreateDescriptor");
    all.push_back(d);
    return d;
  }
};

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t cnt,
         const void* v, const char* what) {
  ck(g_api.setAttr(d, n, t, cnt, v), what);
}
void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendDescriptor_t v, const char* w) {
  set(d, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, w);
}

using Dims = std::vector<int64_t>;

struct GraphBuilder {
  Descs& ds;
  std::vector<cudnnBackendDescriptor_t> ops;
  int64_t next_virtual_uid = 1000;
  bool det = false;  // deterministic mode: reductions marked CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides,
                                  bool is_virtual, bool by_value = false) {
    auto t = ds.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor dtype");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, (int64_t)dims.size(), dims.data(), "tensor dims");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, (int64_t)strides.size(), strides.data(), "tensor strides");
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    int64_t align = 16;
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    bool v = is_virtual;
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, "tensor virtual");
    if (by_value) {
      bool bv = true;
      set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, "tensor by value");
    }
    ck(g_api.finalize(t), "finalize tensor");
    return t;
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_uid++, dt, dims, strides, true);
  }
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    auto md = ds.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    set(md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct, "matmul comp type");
    ck(g_api.finalize(md), "finalize matmul desc");
    auto op = ds.make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul A");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul B");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul C");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, md, "matmul desc");
    ck(g_api.finalize(op), "finalize matmul op");
    ops.push_back(op);
  }
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    auto pd = ds.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pd, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pd, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise prec");
    if (axis >= 0) set(pd, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    ck(g_api.finalize(pd), "finalize pointwise desc");
    auto op = ds.make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pd, "pointwise desc");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise X");
    if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise B");
    if (t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise T");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise Y");
    float one = 1.0f;
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
    ck(g_api.finalize(op), "finalize pointwise op");
    ops.push_back(op);
  }
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    auto rd = ds.make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct, "reduction comp type");
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
    if (det) {
      bool yes = true;
      set(rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &yes, "reduction is deterministic");
    }
    ck(g_api.finalize(rd), "finalize reduction desc");
    auto op = ds.make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, "reduction desc");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction X");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction Y");
    ck(g_api.finalize(op), "finalize reduction op");
    ops.push_back(op);
  }
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    auto op = ds.make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape X");
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape Y");
    ck(g_api.finalize(op), "finalize reshape op");
    ops.push_back(op);
  }

  // Causal (top-left) mask on s [b, h, sq, skv]: select(row >= col, s, -inf).
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t s, const Dims& dims, const Dims& strides,
                                       int64_t neg_inf_uid) {
    auto row = virt(CUDNN_DATA_INT32, dims, strides);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
    auto col = virt(CUDNN_DATA_INT32, dims, strides);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
    auto keep = virt(CUDNN_DATA_BOOLEAN, dims, strides);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, CUDNN_DATA_BOOLEAN);
    auto out = virt(CUDNN_DATA_FLOAT, dims, strides);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, scalar(neg_inf_uid), keep, out);
    return out;
  }
};

// A finalized execution plan with its workspace size and the descriptors it was built from.
struct Plan {
  std::unique_ptr<Descs> ds;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;  // with autotuning: the largest workspace of the candidates
  bool ok = false;
  std::string err;
  // Autotuning (autotune_on()): every finalized plan of the heuristics' configs, in their order;
  // the first call of the shape times each and keeps the fastest in `plan`.
  std::vector<cudnnBackendDescriptor_t> cands;
  bool tuned = false;
};

// MEGATRON_CUDNN_AUTOTUNE=1 (read once; docs/environment.md): time every engine config cuDNN's
// heuristics offer for an attention graph at its first call and keep the fastest, as
// cudnn-frontend's autotuning and torch.backends.cudnn.benchmark do for convolutions; 0 takes
// the heuristics' first config.
bool autotune_on() {
  static const bool on = env_switch("MEGATRON_CUDNN_AUTOTUNE", false);
  return on;
}

// True when the engine of engine config `cfg` does not report CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC
// (false when cuDNN cannot tell).
bool engine_is_deterministic(Descs& ds, cudnnBackendDescriptor_t cfg) {
  auto eng = ds.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t cnt = 0;
  if (g_api.getAttr(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt, &eng) !=
          CUDNN_STATUS_SUCCESS ||
      cnt != 1)
    return false;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = 0;
  if (g_api.getAttr(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                    &n, notes) != CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; ++i)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
  return true;
}

// Heuristics (mode A, then fallback) and the first engine config whose plan finalizes (det: the
// first whose engine is deterministic).
void make_plan(Plan& pl, GraphBuilder& gb, cudnnHandle_t hd, bool det) {
  Descs& ds = *pl.ds;
  auto graph = ds.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)gb.ops.size(), gb.ops.data(),
      "graph ops");
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &hd, "graph handle");
  ck(g_api.finalize(graph), "finalize operation graph");
  std::string errs;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    auto heur = ds.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heur graph");
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heur mode");
    if (g_api.finalize(heur) != CUDNN_STATUS_SUCCESS) continue;
    int64_t n = 0;
    if (g_api.getAttr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr) !=
            CUDNN_STATUS_SUCCESS ||
        n <= 0)
      continue;
    n = std::min<int64_t>(n, 16);
    std::vector<cudnnBackendDescriptor_t> cfgs(n);
    for (auto& c : cfgs) c = ds.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    if (g_api.getAttr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfgs.data()) !=
        CUDNN_STATUS_SUCCESS)
      continue;
    for (int64_t i = 0; i < got; ++i) {
      if (det && !engine_is_deterministic(ds, cfgs[i])) {
        errs += std::string(" cfg") + std::to_string(i) + ":nondeterministic engine";
        continue;
      }
      auto plan = ds.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &hd, "plan handle");
      set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[i], "plan engine config");
      cudnnStatus_t st = g_api.finalize(plan);
      if (st != CUDNN_STATUS_SUCCESS) {
        errs += std::string(" cfg") + std::to_string(i) + ":" + g_api.getErrorString(st);
        continue;
      }
      int64_t ws = 0, cnt = 0;
      ck(g_api.getAttr(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &ws),
         "plan workspace size");
      if (!pl.ok) {
        pl.plan = plan;
        pl.ok = true;
      }
      pl.workspace = std::max(pl.workspace, ws);
      if (!autotune_on()) return;
      pl.cands.push_back(plan);
    }
    if (pl.ok && pl.cands.size() > 1) return;  // mode A offered a choice: the fallback list is not needed
  }
  if (pl.ok) return;
  throw CudnnError{"no cuDNN engine supports this attention graph" + errs};
}

// uids of the non-virtual tensors
enum : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kScale, kNegInf, kOne, kSoftmaxSum, kDQAcc
};

struct Shape {
  int64_t b, hq, hk, s, sk, d;
  bool causal;
  bool bwd;
  int dev;
  bool half = false;  // float16 tensors (--fp16) instead of bfloat16
  bool det = false;   // backward in deterministic mode (deterministic.h)
  // packed: Q, K, V (and dQ, dK, dV) are the interleaved [s, b, h, (q, k, v), d] fused QKV tensor
  // (one query head per K/V group): token stride 3·h·d, head stride 3·d.
  bool packed = false;
  auto key() const { return std::tie(b, hq, hk, s, sk, d, causal, bwd, dev, half, det, packed); }
  bool operator<(const Shape& o) const { return key() < o.key(); }
};

// Our layouts as cuDNN [b, h, s, d] dims/strides (token stride `row`, head stride `hs`).
int64_t q_row(const Shape& x) { return x.packed ? 3 * x.hq * x.d : x.hq * x.d; }
int64_t kv_row(const Shape& x) { return x.packed ? 3 * x.hk * x.d : x.hk * x.d; }
int64_t head_stride(const Shape& x) { return x.packed ? 3 * x.d : x.d; }
Dims q_dims(const Shape& x) { return {x.b, x.hq, x.s, x.d}; }
Dims q_strides(const Shape& x) { return {q_row(x), head_stride(x), x.b * q_row(x), 1}; }
Dims o_strides(const Shape& x) { return {x.hq * x.d, x.d, x.b * x.hq * x.d, 1}; }  // out, dout: always [s, b, h, d]
Dims kt_dims(const Shape& x) { return {x.b, x.hk, x.d, x.sk}; }  // K transposed: [b, hk, d, sk]
Dims kt_strides(const Shape& x) { return {kv_row(x), head_stride(x), 1, x.b * kv_row(x)}; }
Dims kv_dims(const Shape& x) { return {x.b, x.hk, x.sk, x.d}; }
Dims kv_strides(const Shape& x) { return {kv_row(x), head_stride(x), x.b * kv_row(x), 1}; }
Dims stat_dims(const Shape& x) { return {x.b, x.hq, x.s, 1}; }
Dims stat_strides(const Shape& x) { return {x.hq * x.s, x.s, 1, 1}; }
Dims s_dims(const Shape& x) { return {x.b, x.hq, x.s, x.sk}; }
Dims s_strides(const Shape& x) { return {x.hq * x.s * x.sk, x.s * x.sk, x.sk, 1}; }
Dims st_dims(const Shape& x) { return {x.b, x.hq, x.sk, x.s}; }  // transposed scores
Dims st_strides(const Shape& x) { return {x.hq * x.s * x.sk, x.s * x.sk, 1, x.sk}; }

// The 16-bit data type of the graph's q/k/v/o tensors.
cudnnDataType_t data_type(const Shape& x) { return x.half ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16; }

// The tensors both graphs read, created in this order (UIDs kQ, kK, kV, kO, kStats): Q, Kᵀ, V (the
// forward reads V [b, hk, sk, d] for P·V, the backward Vᵀ [b, hk, d, sk] for dO·Vᵀ), O, stats.
struct InputTensors {
  cudnnBackendDescriptor_t Q, KT, V, O, stats;
};
InputTensors input_tensors(GraphBuilder& g, const Shape& x) {
  const auto BF = data_type(x);
  InputTensors t;
  t.Q = g.tensor(kQ, BF, q_dims(x), q_strides(x), false);
  t.KT = g.tensor(kK, BF, kt_dims(x), kt_strides(x), false);
  t.V = x.bwd ? g.tensor(kV, BF, kt_dims(x), kt_strides(x), false) : g.tensor(kV, BF, kv_dims(x), kv_strides(x), false);
  t.O = g.tensor(kO, BF, q_dims(x), o_strides(x), false);
  t.stats = g.tensor(kStats, CUDNN_DATA_FLOAT, stat_dims(x), stat_strides(x), false);
  return t;
}

// S = Q·Kᵀ · scale (virtual fp32 [b, hq, s, sk]), the scores both graphs start from.
cudnnBackendDescriptor_t scaled_scores(GraphBuilder& g, const Shape& x, const InputTensors& in) {
  const Dims sd = s_dims(x), ss = s_strides(x);
  auto S = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.matmul(in.Q, in.KT, S);
  auto S1 = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, S, g.scalar(kScale), nullptr, S1);
  return S1;
}

void build_forward(GraphBuilder& g, const Shape& x) {
  const auto BF = data_type(x), F = CUDNN_DATA_FLOAT;
  const InputTensors in = input_tensors(g, x);
  const auto V = in.V, O = in.O, stats = in.stats;
  const Dims sd = s_dims(x), ss = s_strides(x), rd = stat_dims(x), rs = stat_strides(x);
  auto S1 = scaled_scores(g, x, in);
  if (x.causal) S1 = g.causal_mask(S1, sd, ss, kNegInf);
  auto M = g.virt(F, rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, S1, M);
  auto D = g.virt(F, sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, S1, M, nullptr, D);
  auto E = g.virt(F, sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, D, nullptr, nullptr, E);
  auto Z = g.virt(F, rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, E, Z);
  auto LZ = g.virt(F, rd, rs);
  g.pointwise(CUDNN_POINTWISE_LOG, Z, nullptr, nullptr, LZ);
  g.pointwise(CUDNN_POINTWISE_ADD, M, LZ, nullptr, stats);
  auto P = g.virt(BF, sd, ss);
  g.pointwise(CUDNN_POINTWISE_DIV, E, Z, nullptr, P);
  g.matmul(P, V, O);
}

// out = A·B for dV = Pᵀ·dO and dK = dSᵀ·Q: with grouped-query attention (hq > hk) per query head
// into a virtual [b, hq, sk, d] tensor, then summed over the heads of each K/V group.
void matmul_group_sum(GraphBuilder& g, const Shape& x, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t out) {
  if (x.hq == x.hk) {
    g.matmul(a, b, out);
  } else {
    auto full = g.virt(data_type(x), {x.b, x.hq, x.sk, x.d}, {x.hq * x.sk * x.d, x.sk * x.d, x.d, 1});
    g.matmul(a, b, full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  }
}

void build_backward(GraphBuilder& g, const Shape& x) {
  const auto BF = data_type(x), F = CUDNN_DATA_FLOAT;
  const Dims sd = s_dims(x), ss = s_strides(x), rd = stat_dims(x), rs = stat_strides(x);
  const InputTensors in = input_tensors(g, x);
  const auto Q = in.Q, KT = in.KT, VT = in.V, O = in.O, stats = in.stats;
  auto dO = g.tensor(kDO, BF, q_dims(x), o_strides(x), false);
  auto dQ = g.tensor(kDQ, BF, q_dims(x), q_strides(x), false);
  auto dK = g.tensor(kDK, BF, kv_dims(x), kv_strides(x), false);
  auto dV = g.tensor(kDV, BF, kv_dims(x), kv_strides(x), false);
  auto ssum = g.tensor(kSoftmaxSum, F, rd, rs, false);
  auto dq_acc = g.tensor(kDQAcc, F, q_dims(x), {x.hq * x.s * x.d, x.s * x.d, x.d, 1}, false);

  // Δ = rowsum(dO ∘ O)
  auto t = g.virt(F, q_dims(x), {x.hq * x.s * x.d, x.s * x.d, x.hq * x.d, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dO, O, nullptr, t);
  auto r = g.virt(F, rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, t, r);
  g.pointwise(CUDNN_POINTWISE_MUL, r, g.scalar(kOne), nullptr, ssum);
  // P = exp(Q·Kᵀ·scale - stats), masked
  auto S1 = scaled_scores(g, x, in);
  auto S2 = g.virt(F, sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, S1, stats, nullptr, S2);
  if (x.causal) S2 = g.causal_mask(S2, sd, ss, kNegInf);
  auto E = g.virt(F, sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, S2, nullptr, nullptr, E);
  // dV = Pᵀ·dO (per query head, then summed over the group's heads)
  auto PT = g.virt(BF, st_dims(x), st_strides(x));
  g.reshape(E, PT);
  matmul_group_sum(g, x, PT, dO, dV);
  // dS = P ∘ (dO·Vᵀ - Δ) · scale
  auto dP = g.virt(F, sd, ss);
  g.matmul(dO, VT, dP);
  auto dP1 = g.virt(F, sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, dP, ssum, nullptr, dP1);
  auto dS0 = g.virt(F, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dP1, E, nullptr, dS0);
  auto dS = g.virt(F, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dS0, g.scalar(kScale), nullptr, dS);
  // dK = dSᵀ·Q
  auto dST = g.virt(BF, st_dims(x), st_strides(x));
  g.reshape(dS, dST);
  matmul_group_sum(g, x, dST, Q, dK);
  // dQ = dS·K through an fp32 accumulator
  auto Kn = g.virt(F, kv_dims(x), kv_strides(x));
  g.reshape(KT, Kn);
  g.matmul(dS, Kn, dq_acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, nullptr, nullptr, dQ);
}

std::map<Shape, std::unique_ptr<Plan>> g_plans;

// The cached plan for a shape (built on first use), or null if cuDNN cannot run it.
Plan* get_plan(const Shape& x) {
  if (!load_locked()) return nullptr;
  cudnnHandle_t hd = handle_locked();
  if (!hd) return nullptr;
  auto it = g_plans.find(x);
  if (it != g_plans.end()) return it->second->ok ? it->second.get() : nullptr;
  auto pl = std::make_unique<Plan>();
  pl->ds = std::make_unique<Descs>();
  try {
    GraphBuilder gb{*pl->ds, {}};
    gb.det = x.det;
    if (x.bwd) build_backward(gb, x);
    else build_forward(gb, x);
    make_plan(*pl, gb, hd, x.det);
  } catch (const CudnnError& e) {
    pl->ok = false;
    pl->err = e.what;
    g_err = e.what;
    if (std::getenv("MEGATRON_CUDNN_VERBOSE"))
      std::fprintf(stderr, "cuDNN attention (%s b=%ld hq=%ld hk=%ld s=%ld sk=%ld d=%ld %s): %s\n",
                   x.bwd ? "bwd" : "fwd", (long)x.b, (long)x.hq, (long)x.hk, (long)x.s, (long)x.sk, (long)x.d,
                   x.causal ? "causal" : "full", e.what.c_str());
  }
  Plan* r = pl->ok ? pl.get() : nullptr;
  g_plans.emplace(x, std::move(pl));
  return r;
}

bool shape_ok(const Tensor& q, const Tensor& k, const AttentionParams& p) {
  if (p.attention_mask || p.dropout_p != 0.0f) return false;
  if ((q.dtype() != DType::kBFloat16 && q.dtype() != DType::kFloat16) || k.dtype() != q.dtype()) return false;
  const int64_t d = q.size(3);
  if (d % 8 != 0 || d > 256) return false;
  return q.size(0) > 0 && q.size(1) > 0 && k.size(0) > 0;
}

Shape make_shape(const Tensor& q, const Tensor& k, const AttentionParams& p, bool bwd) {
  Shape x{q.size(1), q.size(2), k.size(2), q.size(0), k.size(0), q.size(3), p.causal, bwd, 0};
  cudaGetDevice(&x.dev);
  x.half = q.dtype() == DType::kFloat16;
  x.det = bwd && megatron::cuda::deterministic();
  return x;
}

// The packed call's shape from qkv [s, b, 3·h·d] and out [s, b, h, d]; false if not packable.
bool packed_shape(const Tensor& qkv, int64_t heads, const Tensor& out, const AttentionParams& p, bool bwd, Shape& x) {
  if (p.attention_mask || p.dropout_p != 0.0f || heads <= 0) return false;
  if (qkv.dtype() != DType::kBFloat16 || out.dtype() != DType::kBFloat16 || qkv.dim() != 3 || out.dim() != 4)
    return false;
  const int64_t s = qkv.size(0), b = qkv.size(1), d = out.size(3);
  if (s <= 0 || b <= 0 || d % 8 != 0 || d > 256 || qkv.size(2) != 3 * heads * d || out.size(0) != s ||
      out.size(1) != b || out.size(2) != heads)
    return false;
  if ((reinterpret_cast<uintptr_t>(qkv.data_ptr()) & 15u) || (reinterpret_cast<uintptr_t>(out.data_ptr()) & 15u))
    return false;
  x = Shape{b, heads, heads, s, s, d, p.causal, bwd, 0};
  x.packed = true;
  x.det = bwd && megatron::cuda::deterministic();
  cudaGetDevice(&x.dev);
  return true;
}

void execute(Plan& pl, const std::vector<int64_t>& uids, std::vector<void*>& ptrs, void* ws) {
  Descs vds;
  auto vp = vds.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data(), "varpack uids");
  set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data(),
      "varpack pointers");
  set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, "varpack workspace");
  ck(g_api.finalize(vp), "finalize variant pack");
  cudnnHandle_t hd = handle_locked();
  ck(g_api.setStream(hd, megatron::cuda::current_stream()), "cudnnSetStream");
  ck(g_api.execute(hd, pl.plan, vp), "cudnnBackendExecute");
}

// Autotuning (autotune_on()): at the first call of a shape with several candidate plans, runs
// each on the call's own tensors (once to warm up, then 3 times between CUDA events) and keeps
// the one with the smallest mean; a candidate that fails to execute is skipped. Every candidate
// overwrites the same outputs (cuDNN's attention graphs write out/lse or dq/dk/dv, they do not
// accumulate), and the caller then runs the kept plan once more. Not while the stream is being
// captured into a CUDA graph (events cannot be waited on there): then the first plan stays.
void autotune(Plan& pl, const Shape& x, const std::vector<int64_t>& uids, std::vector<void*>& ptrs, void* ws) {
  // Deterministic mode keeps the heuristics' first config: a choice by timing could differ
  // between two runs and with it the bits.
  if (pl.tuned || pl.cands.size() < 2 || x.det || megatron::cuda::deterministic()) return;
  cudaStream_t st = megatron::cuda::current_stream();
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return;
  pl.tuned = true;
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  std::string line;
  float best = 0.0f;
  size_t best_i = 0;
  bool any = false;
  for (size_t i = 0; i < pl.cands.size(); ++i) {
    pl.plan = pl.cands[i];
    float ms = 0.0f;
    try {
      execute(pl, uids, ptrs, ws);
      CUDA_CHECK(cudaEventRecord(e0, st));
      for (int r = 0; r < 3; ++r) execute(pl, uids, ptrs, ws);
      CUDA_CHECK(cudaEventRecord(e1, st));
      CUDA_CHECK(cudaEventSynchronize(e1));
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      ms /= 3.0f;
    } catch (const CudnnError&) {
      line += " cfg" + std::to_string(i) + ":failed";
      continue;
    }
    char buf[48];
    std::snprintf(buf, sizeof buf, " cfg%zu:%.3f", i, ms);
    line += buf;
    if (!any || ms < best) {
      best = ms;
      best_i = i;
      any = true;
    }
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  pl.plan = pl.cands[best_i];
  std::fprintf(stderr, "cuDNN attention autotune %s b=%ld hq=%ld hk=%ld s=%ld d=%ld%s: ms%s -> cfg%zu\n",
               x.bwd ? "bwd" : "fwd", (long)x.b, (long)x.hq, (long)x.hk, (long)x.s, (long)x.d,
               x.causal ? " causal" : "", line.c_str(), best_i);
}

// Executes; on a cuDNN error the plan is marked unusable (later calls of this shape go to our
// kernels) and false is returned so that the caller runs its fallback now.
bool run_plan(Plan& pl, const Shape& x, const std::vector<int64_t>& uids, std::vector<void*>& ptrs, void* ws) {
  try {
    execute(pl, uids, ptrs, ws);
    return true;
  } catch (const CudnnError& e) {
    pl.ok = false;
    pl.err = g_err = e.what;
    std::fprintf(stderr, "cuDNN attention %s failed, using our kernels for this shape: %s\n", x.bwd ? "bwd" : "fwd",
                 e.what.c_str());
    return false;
  }
}

// The forward graph of shape x on the tensors at q, k, v (cuDNN layout through the shape's strides),
// writing out and lse; false if cuDNN cannot run it (the caller falls back). Call with g_mu held.
bool run_forward(const Shape& x, float softmax_scale, void* q, void* k, void* v, void* out, void* lse) {
  Plan* pl = get_plan(x);
  if (!pl) return false;
  cudaStream_t st = megatron::cuda::current_stream();
  void* ws = nullptr;
  if (pl->workspace > 0) CUDA_CHECK(cudaMallocAsync(&ws, pl->workspace, st));
  float scale = softmax_scale, neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs = {q, k, v, out, lse, &scale};
  if (x.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
  }
  autotune(*pl, x, uids, ptrs, ws);
  bool ok = run_plan(*pl, x, uids, ptrs, ws);
  if (ws) CUDA_CHECK(cudaFreeAsync(ws, st));
  return ok;
}

// The backward graph of shape x: reads q, k, v, out, lse, dout, writes dq, dk, dv; false if cuDNN
// cannot run it. Call with g_mu held.
bool run_backward(const Shape& x, float softmax_scale, void* q, void* k, void* v, void* out, void* lse, void* dout,
                  void* dq, void* dk, void* dv) {
  Plan* pl = get_plan(x);
  if (!pl) return false;
  cudaStream_t st = megatron::cuda::current_stream();
  // One pool allocation: plan workspace | softmax_sum [b, h, s] fp32 | dQ accumulator [b, h, s, d] fp32.
  auto up = [](int64_t n) { return (n + 255) / 256 * 256; };
  const int64_t ws_bytes = up(pl->workspace), sum_bytes = up(x.b * x.hq * x.s * 4),
                acc_bytes = up(x.b * x.hq * x.s * x.d * 4);
  char* buf = nullptr;
  CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), ws_bytes + sum_bytes + acc_bytes, st));
  float scale = softmax_scale, neg_inf = -std::numeric_limits<float>::infinity(), one = 1.0f;
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kScale, kOne, kSoftmaxSum, kDQAcc};
  std::vector<void*> ptrs = {q,  k,  v,      out,  lse, dout, dq, dk, dv, &scale, &one, buf + ws_bytes,
                             buf + ws_bytes + sum_bytes};
  if (x.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
  }
  autotune(*pl, x, uids, ptrs, pl->workspace > 0 ? buf : nullptr);
  bool ok = run_plan(*pl, x, uids, ptrs, pl->workspace > 0 ? buf : nullptr);
  CUDA_CHECK(cudaFreeAsync(buf, st));
  return ok;
}

// Pointer `bytes` past p (the k and v heads of the packed QKV tensor).
void* offset(const void* p, int64_t bytes) { return static_cast<char*>(const_cast<void*>(p)) + bytes; }

}  // namespace

bool available() {
  std::lock_guard<std::mutex> lk(g_mu);
  return load_locked() && handle_locked() != nullptr;
}

std::string last_error() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_err;
}

bool forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse) {
  if (!shape_ok(q, k, p)) return false;
  std::lock_guard<std::mutex> lk(g_mu);
  Shape x = make_shape(q, k, p, false);
  return run_forward(x, p.softmax_scale, const_cast<void*>(q.data_ptr()), const_cast<void*>(k.data_ptr()),
                     const_cast<void*>(v.data_ptr()), out.data_ptr(), lse.data_ptr());
}

bool backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv) {
  if (!shape_ok(q, k, p)) return false;
  std::lock_guard<std::mutex> lk(g_mu);
  Shape x = make_shape(q, k, p, true);
  return run_backward(x, p.softmax_scale, const_cast<void*>(q.data_ptr()), const_cast<void*>(k.data_ptr()),
                      const_cast<void*>(v.data_ptr()), const_cast<void*>(out.data_ptr()),
                      const_cast<void*>(lse.data_ptr()), const_cast<void*>(dout.data_ptr()), dq.data_ptr(),
                      dk.data_ptr(), dv.data_ptr());
}

bool forward_packed(const Tensor& qkv, int64_t heads, const AttentionParams& p, Tensor& out, Tensor& lse) {
  Shape x;
  if (!packed_shape(qkv, heads, out, p, false, x)) return false;
  std::lock_guard<std::mutex> lk(g_mu);
  const int64_t hb = x.d * 2;  // bytes of one head's q (or k, v) in a group
  const void* base = qkv.data_ptr();
  return run_forward(x, p.softmax_scale, offset(base, 0), offset(base, hb), offset(base, 2 * hb), out.data_ptr(),
                     lse.data_ptr());
}

bool backward_packed(const Tensor& dout, const Tensor& qkv, int64_t heads, const Tensor& out, const Tensor& lse,
                     const AttentionParams& p, Tensor& dqkv) {
  Shape x;
  if (!packed_shape(qkv, heads, out, p, true, x)) return false;
  if (dqkv.shape() != qkv.shape() || dqkv.dtype() != qkv.dtype() || dout.shape() != out.shape() ||
      dout.dtype() != out.dtype() || (reinterpret_cast<uintptr_t>(dqkv.data_ptr()) & 15u) ||
      (reinterpret_cast<uintptr_t>(dout.data_ptr()) & 15u))
    return false;
  std::lock_guard<std::mutex> lk(g_mu);
  const int64_t hb = x.d * 2;
  const void *base = qkv.data_ptr(), *dbase = dqkv.data_ptr();
  return run_backward(x, p.softmax_scale, offset(base, 0), offset(base, hb), offset(base, 2 * hb),
                      const_cast<void*>(out.data_ptr()), const_cast<void*>(lse.data_ptr()),
                      const_cast<void*>(dout.data_ptr()), offset(dbase, 0), offset(dbase, hb), offset(dbase, 2 * hb));
}

#endif

}  // namespace megatron::ops::cuda::cudnn_sdpa

namespace megatron::ops::cuda {
namespace {
// The packed path is cuDNN only: off under MEGATRON_ATTENTION_BACKEND=flash/generic, with
// MEGATRON_PACKED_QKV=0 (A/B comparisons) and in deterministic mode, where the caller's split
// path reaches attention_forward/backward, which choose the reproducible kernels and print the
// note (on an H200 two --deterministic-mode GPT-2 runs differed after one step while this path
// still ran cuDNN: docs/cuda.md "Attention").
bool packed_enabled() {
  if (!env_switch("MEGATRON_PACKED_QKV", true)) return false;
  if (megatron::cuda::deterministic()) return false;
  const char* be = std::getenv("MEGATRON_ATTENTION_BACKEND");
  return !be || !*be || !std::strcmp(be, "auto") || !std::strcmp(be, "cudnn");
}
}  // namespace

bool attention_forward_packed_qkv(const Tensor& qkv, int64_t heads, const AttentionParams& p, Tensor& out,
                                  Tensor& lse) {
  if (!qkv.is_cuda() || !packed_enabled()) return false;
  return cudnn_sdpa::forward_packed(qkv, heads, p, out, lse);
}

bool attention_backward_packed_qkv(const Tensor& dout, const Tensor& qkv, int64_t heads, const Tensor& out,
                                   const Tensor& lse, const AttentionParams& p, Tensor& dqkv) {
  if (!qkv.is_cuda() || !packed_enabled()) return false;
  return cudnn_sdpa::backward_packed(dout, qkv, heads, out, lse, p, dqkv);
}

}  // namespace megatron::ops::cuda
