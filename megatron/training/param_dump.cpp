#include "megatron/training/param_dump.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "megatron/core/distributed/gather_params.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/temp_file.h"

namespace megatron::training {

void dump_parameters(const std::string& dir, int pp_rank, const std::vector<models::gpt::GPTModel*>& chunks,
                     comm::ProcessGroup& tp_group, bool write) {
  const std::string path = dir + "/params_pp" + std::to_string(pp_rank) + ".bin";
  const std::string tmp = path + ".tmp";
  std::FILE* f = nullptr;
  TempFileGuard guard(write ? tmp : std::string());  // removed on every error below
  bool ok = true;
  if (write) {
    f = std::fopen(tmp.c_str(), "wb");
    if (!f) user_error("MEGATRON_DUMP_PARAMS: cannot write ", tmp, "; create the folder first");
  }
  for (auto* m : chunks) {
    for (auto& p : m->parameters()) {
      if (p.shared) continue;
      Tensor g = distributed::gather_tensor_parallel(p, p.data, tp_group).to(Device::cpu()).to(DType::kFloat32);
      if (!f) continue;
      ok = std::fprintf(f, "%s %lld\n", p.name.c_str(), static_cast<long long>(g.numel())) > 0 && ok;
      ok = std::fwrite(g.data<float>(), sizeof(float), static_cast<size_t>(g.numel()), f) ==
               static_cast<size_t>(g.numel()) && ok;
    }
  }
  if (f) {
    ok = std::fflush(f) == 0 && ok;
    ok = std::fclose(f) == 0 && ok;
    if (!ok) user_error("MEGATRON_DUMP_PARAMS: writing ", tmp, " failed: ", std::strerror(errno));
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      user_error("MEGATRON_DUMP_PARAMS: cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
    guard.release();
  }
}

void dump_fp8_state(const std::string& dir, int global_rank, const std::vector<models::gpt::GPTModel*>& chunks) {
  const std::string path = dir + "/fp8_state_rank" + std::to_string(global_rank) + ".txt";
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) user_error("MEGATRON_DUMP_FP8_STATE: cannot append to ", path, "; create the folder first");
  bool ok = true;
  for (auto* m : chunks) {
    const fp8::Fp8State* st = m->fp8_state();
    if (!st) continue;
    for (int r = 0; r < st->num_roles(); ++r) {
      const fp8::Fp8TensorMeta& meta = st->meta(r);
      ok = std::fprintf(f, "step %lld %s %d amax_history", static_cast<long long>(st->steps_done()),
                        st->linear_name(r - r % fp8::kNumRoles).c_str(), r % fp8::kNumRoles) > 0 && ok;
      for (float a : meta.amax_history) ok = std::fprintf(f, " %a", static_cast<double>(a)) > 0 && ok;
      ok = std::fprintf(f, " scale %a scale_inv %a\n", static_cast<double>(meta.scale),
                        static_cast<double>(meta.scale_inv)) > 0 && ok;
    }
  }
  ok = std::fclose(f) == 0 && ok;
  if (!ok) user_error("MEGATRON_DUMP_FP8_STATE: writing ", path, " failed: ", std::strerror(errno));
}

}  // namespace megatron::training
