// core/cuda/cuda_reduce.h for builds without CUDA: the API exists so
// that callers need no #ifdefs, and every call that would need a GPU returns
// UNAVAILABLE("halka was built without CUDA").
#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cuda_reduce.h"
#include "core/dtype.h"

namespace halka {
namespace {

absl::Status NotBuilt() {
  return absl::UnavailableError("halka was built without CUDA");
}

}  // namespace

bool CudaReducerCompiled() { return false; }

absl::StatusOr<int> CudaDeviceCount() { return NotBuilt(); }

absl::Status CudaReduceInto(DType /*dtype*/, ReduceOp /*op*/, void* /*dst*/,
                            const void* /*src*/, size_t /*count*/,
                            void* /*stream*/) {
  return NotBuilt();
}

absl::Status CudaFinalizeAvg(DType /*dtype*/, void* /*dst*/, size_t /*count*/,
                             int /*divisor*/, void* /*stream*/) {
  return NotBuilt();
}

absl::Status CudaSynchronize(void* /*stream*/) { return NotBuilt(); }

absl::Status CudaCopyToDevice(void* /*device_dst*/, const void* /*host_src*/,
                              size_t /*bytes*/) {
  return NotBuilt();
}

absl::Status CudaCopyToHost(void* /*host_dst*/, const void* /*device_src*/,
                            size_t /*bytes*/) {
  return NotBuilt();
}

namespace cuda_internal {

absl::StatusOr<void*> DeviceAlloc(size_t /*bytes*/) { return NotBuilt(); }

void DeviceFree(void* /*ptr*/) {}

}  // namespace cuda_internal

}  // namespace halka
