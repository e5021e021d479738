#include "megatron/core/ops/normal_init.h"

namespace megatron::ops {

namespace {
DeviceNormalInit g_device_init = nullptr;  // constant-initialized; set by the CUDA backend
}  // namespace

void register_device_normal_init(DeviceNormalInit fn) { g_device_init = fn; }
DeviceNormalInit device_normal_init() { return g_device_init; }

}  // namespace megatron::ops
