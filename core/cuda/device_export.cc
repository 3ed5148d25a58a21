// ExportDevicePointerWith: see device_export.h. Plain C++, no CUDA headers.
#include "core/cuda/device_export.h"

#include "absl/strings/str_cat.h"

namespace halka {

absl::StatusOr<DeviceHandle> ExportDevicePointerWith(CudaPointerApi& api,
                                                     const void* ptr) {
  if (ptr == nullptr) {
    return absl::InvalidArgumentError("device tensors: null device pointer");
  }
  absl::StatusOr<int> device = api.DeviceOf(ptr);
  if (!device.ok()) return device.status();
  absl::Status pushed = api.PushContext(*device);
  if (!pushed.ok()) return pushed;
  // Everything that needs the context, then one pop on every path.
  absl::StatusOr<CudaPointerApi::Range> range = api.AllocationOf(ptr);
  absl::StatusOr<std::string> ipc =
      range.ok() ? api.IpcHandle(range->base) : range.status();
  api.PopContext(*device);
  if (!ipc.ok()) return ipc.status();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (p < range->base || p - range->base >= range->size) {
    return absl::InternalError(absl::StrCat(
        "device tensors: the allocation reported for ", p, " (", range->base,
        " + ", range->size, " bytes) does not contain it"));
  }
  DeviceHandle h;
  h.device = *device;
  h.ipc_handle = *std::move(ipc);
  h.offset = p - range->base;
  h.pid = api.Pid();
  h.pointer = p;
  return h;
}

}  // namespace halka
