// ExportDevicePointer's logic over an interface to the few CUDA calls it
// makes, so that the rule it must follow -- work from any thread -- can be
// tested without a GPU (tests/unit/device_export_test.cc, with a fake that
// enforces the driver's context rule).
//
// The rule. cuMemGetAddressRange (and every other driver call that works on
// an allocation) needs a context current in the *calling thread*. The
// runtime makes its primary context current only when a thread makes its
// first runtime call that needs one; cudaPointerGetAttributes does not. So a
// thread that had not touched CUDA before -- a DDP communication thread, the
// RunRanks threads of device_tensor_test on the first H200 run -- got
// CUDA_ERROR_INVALID_CONTEXT from the driver, which was then reported as
// "the pointer is not CUDA device memory". ExportDevicePointerWith now pushes
// the primary context of the pointer's device for the driver calls and pops
// it afterwards, leaving the thread's runtime state (its current device) as
// it was.
#ifndef HALKA_CORE_CUDA_DEVICE_EXPORT_H_
#define HALKA_CORE_CUDA_DEVICE_EXPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/device_memory.h"

namespace halka {

class CudaPointerApi {
 public:
  struct Range {
    uintptr_t base = 0;
    size_t size = 0;
  };
  virtual ~CudaPointerApi() = default;
  // The device owning `ptr` (cudaPointerGetAttributes), or INVALID_ARGUMENT
  // when `ptr` is not device memory.
  virtual absl::StatusOr<int> DeviceOf(const void* ptr) = 0;
  // Makes `device`'s primary context current in the calling thread until
  // PopContext (cuDevicePrimaryCtxRetain + cuCtxPushCurrent).
  virtual absl::Status PushContext(int device) = 0;
  virtual void PopContext(int device) = 0;
  // The allocation holding `ptr` (cuMemGetAddressRange: needs a current
  // context in the calling thread).
  virtual absl::StatusOr<Range> AllocationOf(const void* ptr) = 0;
  // cudaIpcGetMemHandle of the allocation starting at `base` (64 bytes).
  virtual absl::StatusOr<std::string> IpcHandle(uintptr_t base) = 0;
  // This process's id.
  virtual uint64_t Pid() = 0;
};

// ExportDevicePointer through `api`; safe on any thread.
absl::StatusOr<DeviceHandle> ExportDevicePointerWith(CudaPointerApi& api,
                                                     const void* ptr);

}  // namespace halka

#endif  // HALKA_CORE_CUDA_DEVICE_EXPORT_H_
