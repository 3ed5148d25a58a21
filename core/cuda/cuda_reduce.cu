// CUDA kernels behind core/cuda/cuda_reduce.h.
//
// One kernel shape serves every (dtype, op): a grid-stride loop that moves
// 16 bytes per load and store (uint4) over the part of the buffers where both
// pointers are 16-byte aligned, with the few elements before that point (the
// head) and after the last whole vector (the tail) done one at a time. Buffers
// whose addresses differ by a multiple of 16 bytes are thus fully vectorised
// whatever their alignment; others take the element-wise loop (head = count),
// and pointers not even aligned to the element size a byte-wise one. The
// loop bodies, the split and the byte assembly live in cuda_elements.h as
// host/device code, tested on the CPU too.
//
// Bit-exactness with the CPU reducer (core/reduce.cc): every element
// gets exactly one IEEE operation in the same precision as on the CPU (the
// average's division: a correctly rounded quotient, see DivideByConstant), via
// the _rn intrinsics so that nvcc cannot contract a multiply and an add into
// an FMA, and float16/bfloat16 are widened exactly, computed in float32 and
// rounded once with round-to-nearest-even. Denormals are kept (no -ftz; the
// CMakeLists also passes --fmad=false). MIN/MAX use the CPU's selects,
// including its `a + b` on unordered operands; only the payload of a NaN
// result can differ (the GPU's canonical NaN).
#include "core/cuda/cuda_reduce.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cuda_elements.h"
#include "core/dtype.h"
#include "core/dtype_dispatch.h"

namespace halka {
namespace {

using cuda_elements::BytewiseBody;
using cuda_elements::DivideByConstant;
using cuda_elements::ElementwiseBody;
using cuda_elements::Plan;

// ---------------------------------------------------------------------------
// Arithmetic without contraction. The host branches exist only so that the
// element code can also be exercised on a machine without a GPU; the kernels
// use the device branches.

HALKA_HD float AddRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
HALKA_HD double AddRn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
HALKA_HD float MulRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
HALKA_HD double MulRn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
// ---------------------------------------------------------------------------
// Codecs: how a stored element becomes the type arithmetic is done in (the
// same split as in reduce.cc).

template <typename T>
struct NativeCodec {
  using Storage = T;
  using Compute = T;
  static HALKA_HD Compute Decode(Storage value) { return value; }
  static HALKA_HD Storage Encode(Compute value) { return value; }
};

struct HalfCodec {
  using Storage = uint16_t;
  using Compute = float;
  // Widening is exact; cvt.rn.f16.f32 rounds to nearest even and keeps
  // subnormals.
  static HALKA_HD Compute Decode(Storage value) {
    return __half2float(__ushort_as_half(value));
  }
  static HALKA_HD Storage Encode(Compute value) {
    return __half_as_ushort(__float2half_rn(value));
  }
};

// bool: one byte, 0 or 1 (non-zero reads as 1); see core/reduce.cc.
struct BoolCodec {
  using Storage = uint8_t;
  using Compute = uint8_t;
  static HALKA_HD Compute Decode(Storage v) { return v != 0 ? 1 : 0; }
  static HALKA_HD Storage Encode(Compute v) { return v; }
};

struct BFloat16Codec {
  using Storage = uint16_t;
  using Compute = float;
  static HALKA_HD Compute Decode(Storage value) {
    return __bfloat162float(__ushort_as_bfloat16(value));
  }
  static HALKA_HD Storage Encode(Compute value) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(value));
  }
};

// ---------------------------------------------------------------------------
// Operators on the compute type, as in reduce.cc.

struct SumOp {
  template <typename T>
  static HALKA_HD T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;  // wrap instead of overflow
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return AddRn(a, b);
    }
  }
};

struct ProdOp {
  template <typename T>
  static HALKA_HD T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      // At least as wide as unsigned int, as on the CPU (core/reduce.cc):
      // narrower types would promote to int, whose overflow is undefined.
      using U = std::make_unsigned_t<T>;
      using W = std::conditional_t<(sizeof(U) < sizeof(unsigned int)),
                                   unsigned int, U>;
      return static_cast<T>(static_cast<W>(static_cast<U>(a)) *
                            static_cast<W>(static_cast<U>(b)));
    } else {
      return MulRn(a, b);
    }
  }
};

// `b < a ? b : a` keeps a when a == b (so min(+0, -0) is +0 as on the CPU,
// unlike fminf); unordered operands give a + b, a NaN.
struct MinOp {
  template <typename T>
  static HALKA_HD T Apply(T a, T b) {
    const T min = b < a ? b : a;
    if constexpr (std::is_floating_point_v<T>) {
      const bool unordered = (a != a) | (b != b);
      return unordered ? AddRn(a, b) : min;
    } else {
      return min;
    }
  }
};

struct MaxOp {
  template <typename T>
  static HALKA_HD T Apply(T a, T b) {
    const T max = a < b ? b : a;
    if constexpr (std::is_floating_point_v<T>) {
      const bool unordered = (a != a) | (b != b);
      return unordered ? AddRn(a, b) : max;
    } else {
      return max;
    }
  }
};

// ---------------------------------------------------------------------------
// Element functions: what a kernel does to one stored element.

template <typename Codec, typename Op>
struct ReduceFn {
  using Storage = typename Codec::Storage;
  static constexpr bool kHasSrc = true;
  HALKA_HD Storage operator()(Storage d, Storage s) const {
    return Codec::Encode(Op::Apply(Codec::Decode(d), Codec::Decode(s)));
  }
};

// FinalizeAvg. Integer `/` truncates toward zero; the most negative value
// divided by -1 overflows, so -1 negates in unsigned arithmetic (wraps), as
// the CPU does. Floats divide in their own precision (the half types in
// float, rounded once), through DivideByConstant: correctly rounded like
// the CPU's `/`, without a division sequence per element.
template <typename Codec, bool kIntegral = std::is_integral_v<typename Codec::Compute>>
struct DivideFn;

template <typename Codec>
struct DivideFn<Codec, true> {
  using Storage = typename Codec::Storage;
  using Compute = typename Codec::Compute;
  // 8- and 16-bit values divide in int: the divisor (a world size) need
  // not fit their type, and the quotient always fits back.
  static constexpr bool kNarrow = sizeof(Compute) < sizeof(int);
  using Divisor = std::conditional_t<kNarrow, int, Compute>;
  static constexpr bool kHasSrc = false;
  Divisor divisor;
  HALKA_HD Storage operator()(Storage d, Storage /*unused*/) const {
    const Compute value = Codec::Decode(d);
    if constexpr (kNarrow) {
      return static_cast<Compute>(static_cast<int>(value) / divisor);
    }
    if (divisor == Divisor{-1}) {
      using U = std::make_unsigned_t<Compute>;
      return static_cast<Compute>(U{0} - static_cast<U>(value));
    }
    return value / divisor;
  }
};

template <typename Codec>
struct DivideFn<Codec, false> {
  using Storage = typename Codec::Storage;
  using Compute = typename Codec::Compute;
  static constexpr bool kHasSrc = false;
  DivideByConstant<Compute> divide;
  HALKA_HD Storage operator()(Storage d, Storage /*unused*/) const {
    return Codec::Encode(divide(Codec::Decode(d)));
  }
};

// ---------------------------------------------------------------------------
// Kernels.

// No __launch_bounds__: with it ptxas (CUDA 13) aimed at a higher occupancy
// and spilled in the float32 kernels; without, no kernel spills and none
// uses more than 54 registers on sm_90.
constexpr int kThreads = 256;

template <typename Fn>
__global__ void ElementwiseKernel(typename Fn::Storage* dst,
                                  const typename Fn::Storage* src, size_t head,
                                  size_t nvec, size_t count, Fn fn) {
  const size_t thread =
      static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  ElementwiseBody(dst, src, head, nvec, count, fn, thread, threads);
}

// Pointers not aligned to the element size: byte by byte.
template <typename Fn>
__global__ void BytewiseKernel(unsigned char* dst, const unsigned char* src,
                               size_t count, Fn fn) {
  const size_t thread =
      static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  BytewiseBody(dst, src, count, fn, thread, threads);
}

// ---------------------------------------------------------------------------
// Launching.

// Multiprocessor count of the current device, cached per device.
cudaError_t CurrentDeviceSMs(int* sms) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  constexpr int kCached = 64;
  static std::atomic<int> cache[kCached] = {};
  if (device >= 0 && device < kCached) {
    *sms = cache[device].load(std::memory_order_relaxed);
    if (*sms > 0) return cudaSuccess;
  }
  err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  if (*sms < 1) *sms = 1;
  if (device >= 0 && device < kCached) {
    cache[device].store(*sms, std::memory_order_relaxed);
  }
  return cudaSuccess;
}

unsigned GridFor(size_t work, int sms) {
  // Enough blocks to fill every multiprocessor (2048 threads each on recent
  // GPUs) and no more: the loops stride over the rest.
  const size_t max_blocks = static_cast<size_t>(sms) * (2048 / kThreads);
  const size_t wanted = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min(wanted, max_blocks)));
}

template <typename Fn>
cudaError_t LaunchElementwise(void* dst, const void* src, size_t count, Fn fn,
                              int sms, cudaStream_t stream) {
  using Storage = typename Fn::Storage;
  const Plan plan = cuda_elements::MakePlan<Storage>(
      reinterpret_cast<uintptr_t>(dst),
      reinterpret_cast<uintptr_t>(Fn::kHasSrc ? src : dst), count);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(GridFor(plan.work, sms));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  if (plan.bytewise) {
    return cudaLaunchKernelEx(&config, BytewiseKernel<Fn>,
                              static_cast<unsigned char*>(dst),
                              static_cast<const unsigned char*>(src), count,
                              fn);
  }
  return cudaLaunchKernelEx(&config, ElementwiseKernel<Fn>,
                            static_cast<Storage*>(dst),
                            static_cast<const Storage*>(src), plan.head,
                            plan.nvec, count, fn);
}

template <typename Codec>
cudaError_t LaunchReduce(ReduceOp op, void* dst, const void* src, size_t count,
                         int sms, cudaStream_t stream) {
  if constexpr (std::is_same_v<Codec, BoolCodec>) {
    // On 0/1: SUM is MAX (or), PROD is MIN (and), as on the CPU.
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) op = ReduceOp::kMax;
    if (op == ReduceOp::kProd) op = ReduceOp::kMin;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // divided later by CudaFinalizeAvg
      return LaunchElementwise(dst, src, count, ReduceFn<Codec, SumOp>{}, sms,
                               stream);
    case ReduceOp::kProd:
      return LaunchElementwise(dst, src, count, ReduceFn<Codec, ProdOp>{}, sms,
                               stream);
    case ReduceOp::kMin:
      return LaunchElementwise(dst, src, count, ReduceFn<Codec, MinOp>{}, sms,
                               stream);
    case ReduceOp::kMax:
      return LaunchElementwise(dst, src, count, ReduceFn<Codec, MaxOp>{}, sms,
                               stream);
  }
  return cudaErrorInvalidValue;  // validated before
}

template <typename Codec>
cudaError_t LaunchDivide(void* dst, size_t count, int divisor, int sms,
                         cudaStream_t stream) {
  using Compute = typename Codec::Compute;
  DivideFn<Codec> fn;
  if constexpr (std::is_integral_v<Compute>) {
    fn.divisor = static_cast<typename DivideFn<Codec>::Divisor>(divisor);
  } else {
    fn.divide =
        DivideByConstant<Compute>::Make(static_cast<Compute>(divisor));
  }
  return LaunchElementwise(dst, nullptr, count, fn, sms, stream);
}

// The codecs of this file, by dtype (core/dtype_dispatch.h).
struct Codecs {
  template <typename T> using Native = NativeCodec<T>;
  using Half = HalfCodec;
  using BFloat16 = BFloat16Codec;
  using Bool = BoolCodec;
};

// ---------------------------------------------------------------------------
// Errors.

// Errors that mean "there is no usable GPU here" rather than a bug.
bool IsNoDeviceError(cudaError_t err) {
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorStubLibrary:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return true;
    default:
      return false;
  }
}

std::string CudaErrorText(cudaError_t err) {
  return std::string(cudaGetErrorString(err)) + " (" + cudaGetErrorName(err) +
         ")";
}

absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  // Clear the thread's last-error slot so that the failure is not reported
  // again to whoever calls cudaGetLastError next (sticky errors stay).
  (void)cudaGetLastError();
  if (IsNoDeviceError(err)) {
    return absl::UnavailableError("no CUDA device: " + CudaErrorText(err));
  }
  return absl::InternalError(std::string(what) + ": " + CudaErrorText(err));
}

bool Overlap(const void* a, const void* b, size_t bytes) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a);
  const uintptr_t y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

}  // namespace

bool CudaReducerCompiled() { return true; }

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::UnavailableError("no CUDA device: " + CudaErrorText(err));
  }
  if (count <= 0) {
    return absl::UnavailableError(
        "no CUDA device: the CUDA runtime reports 0 devices");
  }
  return count;
}

absl::Status CudaReduceInto(DType dtype, ReduceOp op, void* dst,
                            const void* src, size_t count, void* stream) {
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError("CudaReduceInto: invalid dtype " +
                                      std::to_string(static_cast<int>(dtype)));
  }
  if (!IsValidReduceOp(static_cast<int>(op))) {
    return absl::InvalidArgumentError("CudaReduceInto: invalid op " +
                                      std::to_string(static_cast<int>(op)));
  }
  if (count == 0) return absl::OkStatus();
  int sms = 0;
  absl::Status status = CudaStatus(CurrentDeviceSMs(&sms), "CudaReduceInto");
  if (!status.ok()) return status;
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError("CudaReduceInto: null buffer");
  }
  if (dst != src && Overlap(dst, src, count * DTypeSize(dtype))) {
    return absl::InvalidArgumentError(
        "CudaReduceInto: dst and src overlap partially");
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaErrorInvalidValue;
  WithCodec<Codecs>(dtype, [&](auto tag) {
    err = LaunchReduce<typename decltype(tag)::type>(op, dst, src, count, sms,
                                                     s);
  });
  return CudaStatus(err, "CudaReduceInto: kernel launch");
}

absl::Status CudaFinalizeAvg(DType dtype, void* dst, size_t count, int divisor,
                             void* stream) {
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError("CudaFinalizeAvg: invalid dtype " +
                                      std::to_string(static_cast<int>(dtype)));
  }
  // As on the CPU: dividing by one changes nothing, and dividing by zero (a
  // group with no members, a caller bug) leaves the buffer as it is.
  if (count == 0 || divisor == 1 || divisor == 0) return absl::OkStatus();
  int sms = 0;
  absl::Status status = CudaStatus(CurrentDeviceSMs(&sms), "CudaFinalizeAvg");
  if (!status.ok()) return status;
  if (dst == nullptr) {
    return absl::InvalidArgumentError("CudaFinalizeAvg: null buffer");
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaSuccess;  // bool: AVG is refused (CheckReduction)
  WithCodec<Codecs>(dtype, [&](auto tag) {
    using Codec = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<Codec, BoolCodec>) {
      err = LaunchDivide<Codec>(dst, count, divisor, sms, s);
    }
  });
  return CudaStatus(err, "CudaFinalizeAvg: kernel launch");
}

absl::Status CudaSynchronize(void* stream) {
  return CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                    "cudaStreamSynchronize");
}

absl::Status CudaCopyToDevice(void* device_dst, const void* host_src,
                              size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(
      cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice),
      "cudaMemcpy to device");
}

absl::Status CudaCopyToHost(void* host_dst, const void* device_src,
                            size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(
      cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost),
      "cudaMemcpy to host");
}

namespace cuda_internal {

absl::StatusOr<void*> DeviceAlloc(size_t bytes) {
  void* ptr = nullptr;
  absl::Status status = CudaStatus(cudaMalloc(&ptr, bytes), "cudaMalloc");
  if (!status.ok()) return status;
  return ptr;
}

void DeviceFree(void* ptr) {
  if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace cuda_internal

}  // namespace halka
