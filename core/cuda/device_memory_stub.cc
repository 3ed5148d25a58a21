// Device tensors in a build without CUDA: every call explains why not.
#include "core/cuda/device_memory.h"

namespace halka {

bool DeviceTensorsCompiled() { return false; }

absl::StatusOr<DeviceHandle> ExportDevicePointer(const void*) {
  return absl::UnavailableError(
      "device tensors: halka was built without CUDA");
}

absl::Status CopyDeviceMemory(void*, const void*, size_t) {
  return absl::UnavailableError(
      "device tensors: halka was built without CUDA");
}

absl::StatusOr<void*> AllocateDeviceMemory(const void*, size_t) {
  return absl::UnavailableError(
      "device tensors: halka was built without CUDA");
}

void FreeDeviceMemory(void*) {}

absl::StatusOr<std::unique_ptr<DeviceContext>> DeviceContext::Open(int) {
  return absl::UnavailableError(
      "device tensors: halka was built without CUDA");
}

}  // namespace halka
