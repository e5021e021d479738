#include "megatron/training/param_dump.h"

#include <cstdio>
#include <filesystem>

#include "megatron/core/distributed/gather_params.h"
#include "megatron/core/utils/errors.h"

namespace megatron::training {

void dump_parameters(const std::string& dir, int pp_rank, const std::vector<models::gpt::GPTModel*>& chunks,
                     comm::ProcessGroup& tp_group, bool write) {
  const std::string path = dir + "/params_pp" + std::to_string(pp_rank) + ".bin";
  const std::string tmp = path + ".tmp";
  std::FILE* f = nullptr;
  if (write) {
    f = std::fopen(tmp.c_str(), "wb");
    if (!f) user_error("MEGATRON_DUMP_PARAMS: cannot write ", tmp, "; create the folder first");
  }
  for (auto* m : chunks) {
    for (auto& p : m->parameters()) {
      if (p.shared) continue;
      Tensor g = distributed::gather_tensor_parallel(p, p.data, tp_group).to(Device::cpu()).to(DType::kFloat32);
      if (!f) continue;
      std::fprintf(f, "%s %lld\n", p.name.c_str(), static_cast<long long>(g.numel()));
      std::fwrite(g.data<float>(), sizeof(float), static_cast<size_t>(g.numel()), f);
    }
  }
  if (f) {
    const bool ok = std::fflush(f) == 0 && std::fclose(f) == 0;
    if (!ok) user_error("MEGATRON_DUMP_PARAMS: writing ", tmp, " failed");
    std::filesystem::rename(tmp, path);
  }
}

}  // namespace megatron::training
