// GPU reducers: the CUDA counterparts of ReduceInto and FinalizeAvg in
// core/reduce.h, for buffers that live in device memory.
//
// This header needs no CUDA headers and no nvcc: streams are passed as
// `void*` (a cudaStream_t, or nullptr for the legacy default stream). When
// halka is built without CUDA (HALKA_CUDA=OFF, or AUTO without nvcc) the same
// functions exist and return UNAVAILABLE("halka was built without CUDA"), so
// callers need no #ifdefs: check CudaReducerCompiled() or CudaDeviceCount().
//
// Results equal the CPU reducer's bit for bit (same operation per element in
// the same precision, round to nearest even, no fused multiply-add), with one
// exception: the bits of a NaN result. The contract only promises that NaN
// propagates; the GPU produces its canonical NaN (0x7fffffff, 0x7fff...),
// while x86 returns the first NaN operand quieted.
//
// Errors: no driver or no device -> UNAVAILABLE("no CUDA device: <CUDA
// text>"); a bad dtype, op or pointer -> INVALID_ARGUMENT; any other CUDA
// error -> INTERNAL with the CUDA error name and text.
//
// Thread-safety: every function may be called from any thread. The reducers
// work on the device that is current for the calling thread
// (cudaSetDevice), which must own dst, src and stream.
#ifndef HALKA_CORE_CUDA_CUDA_REDUCE_H_
#define HALKA_CORE_CUDA_CUDA_REDUCE_H_

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace halka {

// True when this binary contains the CUDA kernels (built with nvcc).
bool CudaReducerCompiled();

// Number of CUDA devices visible to this process. UNAVAILABLE when there is
// none or the driver cannot be used ("no CUDA device: <CUDA error text>"),
// or "halka was built without CUDA".
absl::StatusOr<int> CudaDeviceCount();

// dst[i] = dst[i] (op) src[i] for i in [0, count), on device memory, with
// the semantics of halka::ReduceInto: AVG reduces as SUM (divide once with
// CudaFinalizeAvg), integer SUM/PROD wrap around, floating MIN/MAX propagate
// NaN and otherwise pick `b < a ? b : a` (MIN) / `a < b ? b : a` (MAX), so
// min(+0, -0) keeps dst's zero; float16/bfloat16 compute in float32 and
// round to nearest even once per element. dst == src is allowed, partial
// overlap is not (INVALID_ARGUMENT). Any alignment works; buffers that are
// 16-byte aligned (or misaligned by the same amount) take the vectorised
// path, others a slower scalar one.
//
// Asynchronous: the work is enqueued on `stream` and the call returns; an
// error raised while the kernel runs surfaces at the next synchronising CUDA
// call (see CudaSynchronize). count == 0 is a no-op that touches no device.
absl::Status CudaReduceInto(DType dtype, ReduceOp op, void* dst,
                            const void* src, size_t count, void* stream);

// dst[i] = dst[i] / divisor, the last step of AVG, like halka::FinalizeAvg:
// integers truncate toward zero (x / -1 wraps for the most negative value),
// floats divide in their own precision, float16/bfloat16 in float32 with one
// rounding. divisor 0 or 1 and count 0 leave dst alone. Asynchronous like
// CudaReduceInto.
absl::Status CudaFinalizeAvg(DType dtype, void* dst, size_t count, int divisor,
                             void* stream);

// Waits for all work on `stream` (nullptr: the legacy default stream) and
// returns the first error it raised.
absl::Status CudaSynchronize(void* stream);

// Plain (synchronous) copies between host and device memory.
absl::Status CudaCopyToDevice(void* device_dst, const void* host_src,
                              size_t bytes);
absl::Status CudaCopyToHost(void* host_dst, const void* device_src,
                            size_t bytes);

namespace cuda_internal {
// cudaMalloc/cudaFree behind a plain interface, for CudaBuffer.
absl::StatusOr<void*> DeviceAlloc(size_t bytes);
void DeviceFree(void* ptr);  // errors are ignored (used in destructors)
}  // namespace cuda_internal

// An owned cudaMalloc allocation on the current device (tests, benchmarks).
class CudaBuffer {
 public:
  CudaBuffer() = default;
  static absl::StatusOr<CudaBuffer> Allocate(size_t bytes) {
    absl::StatusOr<void*> ptr = cuda_internal::DeviceAlloc(bytes);
    if (!ptr.ok()) return ptr.status();
    return CudaBuffer(*ptr, bytes);
  }
  ~CudaBuffer() { Reset(); }
  CudaBuffer(CudaBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  CudaBuffer& operator=(CudaBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  void Reset() {
    if (data_ != nullptr) cuda_internal::DeviceFree(data_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  CudaBuffer(void* data, size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace halka

#endif  // HALKA_CORE_CUDA_CUDA_REDUCE_H_
