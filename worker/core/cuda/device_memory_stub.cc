// Device tensors in a build without CUDA: every call explains why not.
#include "worker/core/cuda/device_memory.h"

namespace halka {

bool DeviceTensorsCompiled() { return false; }

absl::StatusOr<DeviceHandle> ExportDevicePointer(const void*) {
  return absl::UnavailableError(
      "device tensors: halka was built without CUDA");
}

absl::StatusOr<std::unique_ptr<DeviceContext>> DeviceContext::Open(int) {
  return absl::UnavailableError(
      "device tensors: halka was built without CUDA");
}

}  // namespace halka
