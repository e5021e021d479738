// Records every cuDNN backend call that cudnn_attention.cpp's graph builders make (descriptor
// creation, every attribute with its values, finalize, the heuristics / engine / plan queries) for
// 48 shape variants (forward / backward x causal x GQA x fp16 x packed QKV x deterministic), against
// a fake cuDNN that accepts everything. Compiled with -DSRC="path/to/cudnn_attention.cpp" (the file
// is included, so its internal functions are reachable); cudnn_graph_diff.sh compares two versions.
// Writes the log to argv[1].
#include SRC

#include <cstdio>

namespace {
FILE* g_log;
intptr_t g_next = 1;
long id(const void* d) { return (long)reinterpret_cast<intptr_t>(d); }
cudnnStatus_t f_create(cudnnBackendDescriptorType_t t, cudnnBackendDescriptor_t* d) {
  *d = reinterpret_cast<cudnnBackendDescriptor_t>(g_next++);
  std::fprintf(g_log, "create #%ld type %d\n", id(*d), (int)t);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t f_destroy(cudnnBackendDescriptor_t d) {
  std::fprintf(g_log, "destroy #%ld\n", id(d));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t f_finalize(cudnnBackendDescriptor_t d) {
  std::fprintf(g_log, "finalize #%ld\n", id(d));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t f_set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t,
                    int64_t cnt, const void* v) {
  std::fprintf(g_log, "set #%ld attr %d type %d cnt %ld:", id(d), (int)n, (int)t, (long)cnt);
  for (int64_t i = 0; i < cnt; ++i) {
    switch (t) {
      case CUDNN_TYPE_BACKEND_DESCRIPTOR: std::fprintf(g_log, " #%ld", id(static_cast<const cudnnBackendDescriptor_t*>(v)[i])); break;
      case CUDNN_TYPE_INT64: std::fprintf(g_log, " %ld", (long)static_cast<const int64_t*>(v)[i]); break;
      case CUDNN_TYPE_FLOAT: std::fprintf(g_log, " %a", static_cast<const float*>(v)[i]); break;
      case CUDNN_TYPE_BOOLEAN: std::fprintf(g_log, " %d", (int)static_cast<const bool*>(v)[i]); break;
      case CUDNN_TYPE_HANDLE: std::fprintf(g_log, " handle"); break;
      default: std::fprintf(g_log, " %d", static_cast<const int*>(v)[i]); break;  // enums
    }
  }
  std::fprintf(g_log, "\n");
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t f_get(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t,
                    int64_t req, int64_t* cnt, void* v) {
  std::fprintf(g_log, "get #%ld attr %d type %d req %ld\n", id(d), (int)n, (int)t, (long)req);
  *cnt = 0;
  if (n == CUDNN_ATTR_ENGINEHEUR_RESULTS) *cnt = 2;
  if (n == CUDNN_ATTR_ENGINECFG_ENGINE) *cnt = 1;
  if (n == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) *cnt = 1, *static_cast<int64_t*>(v) = 4096;
  return CUDNN_STATUS_SUCCESS;
}
const char* f_err(cudnnStatus_t) { return "error"; }
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  g_log = std::fopen(argv[1], "w");
  using namespace megatron::ops::cuda::cudnn_sdpa;
  g_api.createDesc = f_create;
  g_api.destroyDesc = f_destroy;
  g_api.finalize = f_finalize;
  g_api.setAttr = f_set;
  g_api.getAttr = f_get;
  g_api.getErrorString = f_err;
  for (int bwd = 0; bwd < 2; ++bwd)
    for (int causal = 0; causal < 2; ++causal)
      for (int gqa = 0; gqa < 2; ++gqa)
        for (int half = 0; half < 2; ++half)
          for (int packed = 0; packed < 2; ++packed)
            for (int det = 0; det < 2; ++det) {
              if (packed && gqa) continue;
              Shape x{2, 8, gqa ? 2 : 8, 128, 96, 64, (bool)causal, (bool)bwd, 0};
              x.half = half;
              x.packed = packed;
              x.det = det && bwd;
              std::fprintf(g_log, "== bwd %d causal %d gqa %d half %d packed %d det %d\n", bwd, causal, gqa, half,
                           packed, det);
              Plan pl;
              pl.ds = std::make_unique<Descs>();
              GraphBuilder gb{*pl.ds, {}};
              gb.det = x.det;
              if (x.bwd) build_backward(gb, x);
              else build_forward(gb, x);
              make_plan(pl, gb, reinterpret_cast<cudnnHandle_t>(1), x.det);
              std::fprintf(g_log, "plan #%ld workspace %ld ok %d\n", id(pl.plan), (long)pl.workspace, (int)pl.ok);
            }
  std::fclose(g_log);
  return 0;
}
