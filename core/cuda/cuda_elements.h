// The element logic of the CUDA reducers (core/cuda/cuda_reduce.cu),
// written once as host/device code: the kernels run it on the GPU, and
// tests/unit/cuda_elements_test.cc runs the very same functions on the CPU
// (thread after thread), so that CI covers the index arithmetic, the byte
// assembly of misaligned elements and the division by a constant without a
// GPU. Plain C++ compilers see it without any CUDA header.
//
// What the CPU cannot show is the GPU compiler's code for it; the comments
// at ByteOf and DivideByConstant say what differs on the device and why the
// device branch gives the same bits.
#ifndef HALKA_CORE_CUDA_CUDA_ELEMENTS_H_
#define HALKA_CORE_CUDA_CUDA_ELEMENTS_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <math.h>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __CUDACC__
#define HALKA_HD __host__ __device__ __forceinline__
#else
#define HALKA_HD inline
#endif

namespace halka {
namespace cuda_elements {

constexpr size_t kVectorBytes = 16;
constexpr int kUnroll = 4;  // vectors in flight per thread and iteration

// 16 bytes moved by one load or store: uint4 on the GPU (ld.global.v4.u32).
#ifdef __CUDACC__
using Vec16 = uint4;
#else
struct alignas(16) Vec16 {
  uint32_t x, y, z, w;
};
#endif
static_assert(sizeof(Vec16) == kVectorBytes, "16-byte vectors");

template <typename Storage>
struct Pack {
  static constexpr int kLanes = kVectorBytes / sizeof(Storage);
  Storage lane[kLanes];
};

template <typename Storage>
HALKA_HD Pack<Storage> LoadPack(const Vec16* p) {
  const Vec16 raw = *p;
  Pack<Storage> pack;
  memcpy(&pack, &raw, sizeof(raw));
  return pack;
}

template <typename Storage>
HALKA_HD void StorePack(Vec16* p, const Pack<Storage>& pack) {
  Vec16 raw;
  memcpy(&raw, &pack, sizeof(raw));
  *p = raw;
}

// ---------------------------------------------------------------------------
// Misaligned elements, byte by byte (little endian).

// The unsigned integer as wide as Storage.
template <typename Storage>
using BitsOf = std::conditional_t<
    sizeof(Storage) == 8, uint64_t,
    std::conditional_t<
        sizeof(Storage) == 4, uint32_t,
        std::conditional_t<sizeof(Storage) == 2, uint16_t, uint8_t>>>;
static_assert(sizeof(BitsOf<uint8_t>) == 1 && sizeof(BitsOf<uint16_t>) == 2,
              "BitsOf is as wide as its type");

// Byte k (0..3) of `word`, zero-extended to 32 bits.
//
// Why a permute on the GPU. Written as `(unsigned char)(bits >> 0)` for a
// 2-byte element, nvcc (CUDA 13) emitted `st.global.u8 [p], %rs` straight
// from the 16-bit register that cvt.rn.f16.f32 / cvt.rn.bf16.f32 had just
// written, and on an H200 that byte came out as the *value* of the half,
// truncated and saturated to 0..255 (0x5925 = 164.6 -> 0xa4, +inf and
// anything >= 255 -> 0xff, 1.5 -> 0x01, negatives -> 0x00), while the high
// byte (through shr.u16, an integer op) was right: the 24 float16/bfloat16
// failures of the first H200 run (commit af6d447). prmt is a 32-bit integer
// instruction, so the byte that reaches the store is an integer byte, never
// a narrowed half register.
HALKA_HD uint32_t ByteOf(uint32_t word, unsigned k) {
#ifdef __CUDA_ARCH__
  return __byte_perm(word, 0u, 0x4440u | k);  // byte k, then three zeros
#else
  return (word >> (8 * k)) & 0xffu;
#endif
}

template <typename Storage>
HALKA_HD Storage LoadBytes(const unsigned char* p) {
  using Bits = BitsOf<Storage>;
  uint64_t bits = 0;
#pragma unroll
  for (unsigned k = 0; k < sizeof(Storage); ++k) {
    bits |= static_cast<uint64_t>(p[k]) << (8 * k);
  }
  const Bits narrow = static_cast<Bits>(bits);
  Storage value;
  memcpy(&value, &narrow, sizeof(value));
  return value;
}

template <typename Storage>
HALKA_HD void StoreBytes(unsigned char* p, Storage value) {
  using Bits = BitsOf<Storage>;
  Bits narrow;
  memcpy(&narrow, &value, sizeof(narrow));
  const uint64_t bits = narrow;  // integer from here on
#pragma unroll
  for (unsigned k = 0; k < sizeof(Storage); ++k) {
    const uint32_t word = static_cast<uint32_t>(bits >> (32 * (k / 4)));
    p[k] = static_cast<unsigned char>(ByteOf(word, k % 4));
  }
}

// ---------------------------------------------------------------------------
// Loop bodies, for one thread out of `threads` (the kernels pass their grid
// index; the CPU test runs every thread in turn).

// Elements [0, head) and [head + nvec * lanes, count) one at a time; the
// nvec vectors in between start at a 16-byte aligned address in both
// buffers. dst may equal src: every element is read before it is written,
// by the same thread.
// One element stored: a 1-byte element through StoreBytes, so that the
// byte reaches memory from a 32-bit integer register (prmt), never from a
// 16-bit one (see ByteOf; tests/cuda/ptx_byte_stores_test.sh).
template <typename Storage>
HALKA_HD void StoreElement(Storage* p, Storage value) {
  if constexpr (sizeof(Storage) == 1) {
    StoreBytes<Storage>(reinterpret_cast<unsigned char*>(p), value);
  } else {
    *p = value;
  }
}

template <typename Fn>
HALKA_HD void ElementwiseBody(typename Fn::Storage* dst,
                              const typename Fn::Storage* src, size_t head,
                              size_t nvec, size_t count, Fn fn, size_t thread,
                              size_t threads) {
  using Storage = typename Fn::Storage;
  constexpr int kLanes = Pack<Storage>::kLanes;
  for (size_t i = thread; i < head; i += threads) {
    StoreElement(dst + i, fn(dst[i], Fn::kHasSrc ? src[i] : Storage{}));
  }
  const size_t tail_begin = head + nvec * kLanes;
  for (size_t i = tail_begin + thread; i < count; i += threads) {
    StoreElement(dst + i, fn(dst[i], Fn::kHasSrc ? src[i] : Storage{}));
  }
  if (nvec == 0) return;
  Vec16* dv = reinterpret_cast<Vec16*>(dst + head);
  const Vec16* sv =
      Fn::kHasSrc ? reinterpret_cast<const Vec16*>(src + head) : nullptr;
  size_t v = thread;
  // kUnroll vectors per iteration: all loads are issued before the first
  // store, which keeps more memory requests in flight per thread.
  for (; v + (kUnroll - 1) * threads < nvec; v += kUnroll * threads) {
    Pack<Storage> a[kUnroll];
    Pack<Storage> b[kUnroll]{};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      a[u] = LoadPack<Storage>(dv + v + u * threads);
      if constexpr (Fn::kHasSrc) b[u] = LoadPack<Storage>(sv + v + u * threads);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int k = 0; k < kLanes; ++k) {
        a[u].lane[k] = fn(a[u].lane[k], Fn::kHasSrc ? b[u].lane[k] : Storage{});
      }
      StorePack<Storage>(dv + v + u * threads, a[u]);
    }
  }
  for (; v < nvec; v += threads) {
    Pack<Storage> a = LoadPack<Storage>(dv + v);
    Pack<Storage> b{};
    if constexpr (Fn::kHasSrc) b = LoadPack<Storage>(sv + v);
#pragma unroll
    for (int k = 0; k < kLanes; ++k) {
      a.lane[k] = fn(a.lane[k], Fn::kHasSrc ? b.lane[k] : Storage{});
    }
    StorePack<Storage>(dv + v, a);
  }
}

// Pointers not aligned to the element size (the CPU contract allows any
// address; a misaligned load would fault on the GPU).
template <typename Fn>
HALKA_HD void BytewiseBody(unsigned char* dst, const unsigned char* src,
                           size_t count, Fn fn, size_t thread,
                           size_t threads) {
  using Storage = typename Fn::Storage;
  constexpr size_t kSize = sizeof(Storage);
  for (size_t i = thread; i < count; i += threads) {
    const Storage d = LoadBytes<Storage>(dst + i * kSize);
    const Storage s =
        Fn::kHasSrc ? LoadBytes<Storage>(src + i * kSize) : Storage{};
    StoreBytes<Storage>(dst + i * kSize, fn(d, s));
  }
}

// ---------------------------------------------------------------------------
// How a call splits into the kernels' parts.

struct Plan {
  bool bytewise = false;
  size_t head = 0;  // scalar elements before the vectors
  size_t nvec = 0;  // 16-byte vectors
  size_t work = 0;  // the most loop iterations any part needs in total
};

template <typename Storage>
inline Plan MakePlan(uintptr_t d, uintptr_t s, size_t count) {
  Plan plan;
  if (d % sizeof(Storage) != 0 || s % sizeof(Storage) != 0) {
    plan.bytewise = true;
    plan.work = count;
    return plan;
  }
  if ((d - s) % kVectorBytes != 0) {  // never both aligned: element-wise
    plan.head = count;
    plan.work = count;
    return plan;
  }
  constexpr size_t kLanes = Pack<Storage>::kLanes;
  const size_t to_aligned = (kVectorBytes - d % kVectorBytes) % kVectorBytes;
  plan.head = std::min(count, to_aligned / sizeof(Storage));
  plan.nvec = (count - plan.head) / kLanes;
  const size_t scalar = count - plan.nvec * kLanes;  // head + tail
  plan.work = std::max(plan.nvec, scalar);
  return plan;
}

// ---------------------------------------------------------------------------
// x / d for a divisor fixed for the whole call, correctly rounded, without a
// division instruction sequence per element.
//
// With r = RN(1/d) (computed once, on the host), q0 = RN(x * r) is within
// one ulp of x/d, the remainder x - q0 * d is exact through one fma, and
// RN(q0 + rem * r) -- a second fma -- is RN(x/d) (Markstein's theorem), as
// long as nothing underflows. So:
//  - x = +-0, +-inf, NaN: q0 is already the exact answer (+-0 and +-inf with
//    the sign of x * d; NaN stays NaN);
//  - |x| below kTiny (q or the remainder near the subnormal range): plain
//    IEEE division, the rare slow case;
//  - otherwise the two fmas.
// CUDA's __fdiv_rn instead rebuilds the reciprocal per element and calls a
// slow path for every infinite, subnormal or huge operand; that made
// finalize_avg compute-bound (49-76 % of copy bandwidth on an H200).
// tests/unit/cuda_elements_test.cc checks this function against `x / d` on
// the CPU (every float16 and bfloat16 value, edge and random float32 and
// float64 values); the GPU's fma and multiply are the same IEEE operations.
template <typename F>
struct DivideByConstant {
  F d;  // the divisor
  F r;  // RN(1/d)

  static DivideByConstant Make(F divisor) {
    return DivideByConstant{divisor, F{1} / divisor};
  }

  static constexpr F kTiny = sizeof(F) == 4 ? F(0x1p-90) : F(0x1p-960);
  static constexpr F kMax = sizeof(F) == 4 ? F(FLT_MAX) : F(DBL_MAX);

  // fmaf/fma are the IEEE fused multiply-add on both sides (libm here,
  // FFMA/DFMA there). The plain `*` and `/` below are single IEEE
  // operations: the library is compiled with --fmad=false (nothing is
  // contracted) and --prec-div=true (`/` is correctly rounded).
  HALKA_HD static F Fma(F a, F b, F c) {
    if constexpr (sizeof(F) == 4) {
      return fmaf(a, b, c);
    } else {
      return fma(a, b, c);
    }
  }

  HALKA_HD F operator()(F x) const {
    const F q0 = x * r;
    const F ax = x < F{0} ? -x : x;
    // Not finite, or zero: q0 is exact. (NaN fails both comparisons.)
    if (!(ax <= kMax) || ax == F{0}) return q0;
    if (ax < kTiny) return x / d;
    const F rem = Fma(-q0, d, x);
    return Fma(rem, r, q0);
  }
};

}  // namespace cuda_elements
}  // namespace halka

#endif  // HALKA_CORE_CUDA_CUDA_ELEMENTS_H_
