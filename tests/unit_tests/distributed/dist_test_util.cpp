#include "dist_test_util.h"

#include <cstdlib>

#include "megatron/core/distributed/init_process_group.h"
#include "megatron/core/distributed/mpi/mpi_process_group.h"

namespace megatron::testing {

std::shared_ptr<distributed::ProcessGroup> dist_world() {
  static std::shared_ptr<distributed::ProcessGroup> w = [] {
    distributed::InitOptions o;
    const char* t = std::getenv("MEGATRON_TEST_DIST_TIMEOUT_S");
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>((t ? std::atof(t) : 120.0) * 1000));
    const char* b = std::getenv("MEGATRON_TEST_DIST_BACKEND");
    if (b) o.backend = b;
    return distributed::init_process_group(o);
  }();
  return w;
}

}  // namespace megatron::testing
