// Device tensors: sharing a CUDA allocation with the local worker, and the
// OpBuffer that lets the collectives reduce it on the GPU.
//
// No CUDA headers here: without CUDA (or without a device) every function
// returns UNAVAILABLE with the reason, and callers need no #ifdefs.
//
// Same process (LocalCluster): the worker uses the caller's pointer as is.
// Another process on the same host: a CUDA IPC memory handle of the
// allocation plus the offset of the tensor in it; the worker opens it once
// and keeps it open (cache keyed by the handle's bytes).
//
// Data path of a device buffer: received chunks land in pinned host memory
// (a mirror of the tensor), are copied to a device scratch area on the
// context's stream and reduced into the tensor by CudaReduceInto, and the
// result is copied back into the mirror in the same stream round (one
// synchronisation per chunk), from where the next step sends it; a chunk
// only copied (all-gather, broadcast) is sent from the mirror as received,
// with no device-to-host copy. The wire overlaps with this work (sends are
// asynchronous). A chunk moves in 256 KiB slices that alternate between
// two streams, so the CPU's gathering of one slice, another's copy to the
// device and kernel, and a third's copy back overlap; one synchronisation
// per chunk. Every entry point binds the context's device in the
// calling thread first, so any worker thread may run an operation.
#ifndef HALKA_CORE_CUDA_DEVICE_MEMORY_H_
#define HALKA_CORE_CUDA_DEVICE_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/op_buffer.h"

namespace halka {

// How a client names a device tensor to its worker.
struct DeviceHandle {
  int device = 0;          // the client's device ordinal
  std::string ipc_handle;  // cudaIpcMemHandle_t bytes (64)
  uint64_t offset = 0;     // bytes from the start of the allocation
  uint64_t pid = 0;        // the exporting process
  uint64_t pointer = 0;    // the pointer in the exporting process
};

// True when this build can move device tensors (CUDA compiled in).
bool DeviceTensorsCompiled();

// Client side: describes device memory `ptr` of this process.
// Errors: UNAVAILABLE (no CUDA), INVALID_ARGUMENT (not device memory).
absl::StatusOr<DeviceHandle> ExportDevicePointer(const void* ptr);

// Client side, for the collectives whose input and output differ: copies
// `bytes` between two device buffers of this process (synchronous), and
// device scratch memory on the device of `like` (freed with
// FreeDeviceMemory). Errors: UNAVAILABLE (no CUDA), INVALID_ARGUMENT (not
// device memory), RESOURCE_EXHAUSTED (out of device memory).
absl::Status CopyDeviceMemory(void* dst, const void* src, size_t bytes);
absl::StatusOr<void*> AllocateDeviceMemory(const void* like, size_t bytes);
void FreeDeviceMemory(void* ptr);

// Worker side: one per worker, bound to one device.
class DeviceContext {
 public:
  virtual ~DeviceContext() = default;
  // Errors: UNAVAILABLE ("no CUDA device: ..." or "built without CUDA"),
  // INVALID_ARGUMENT (device ordinal out of range).
  static absl::StatusOr<std::unique_ptr<DeviceContext>> Open(int device);

  virtual int device() const = 0;
  // The tensor `handle` names, as a pointer valid in this process.
  virtual absl::StatusOr<void*> Resolve(const DeviceHandle& handle) = 0;
  // An OpBuffer over `count` elements at device pointer `data`.
  virtual std::unique_ptr<OpBuffer> MakeBuffer(void* data) = 0;
};

}  // namespace halka

#endif  // HALKA_CORE_CUDA_DEVICE_MEMORY_H_
