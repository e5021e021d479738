#include "megatron/training/param_dump.h"

#include <cstdio>
#include <filesystem>

#include "megatron/core/distributed/gather_params.h"
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

}  // namespace megatron::training
