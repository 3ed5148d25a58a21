#include "core/reduce.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "core/dtype_dispatch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// Reducers never read the floating-point exception flags, and with the
// default -ftrapping-math GCC must assume any comparison or arithmetic may
// trap, so it keeps the branches of MinOp/MaxOp and the float16/bfloat16
// conversions instead of turning them into selects, and the loops are not
// vectorised. Dropping that assumption changes no result. It is set here,
// after the includes, so that it covers only this file's functions.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

namespace halka {
namespace {

// ---------------------------------------------------------------------------
// Bit-level helpers.
//
// memcpy is the well-defined way to reinterpret bits in C++17; GCC turns it
// into a register move, so it costs nothing inside vectorised loops.

inline uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// The conversions below are written with selects instead of early returns so
// that, once inlined into the element loops, GCC can if-convert and
// vectorise them; every branch is computed and the right one picked.

// binary16 -> binary32. Exact for every input (float has more range and
// precision than half).
inline float HalfToFloatImpl(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t magnitude = half & 0x7fffu;  // exponent and mantissa
  // Normal numbers: move the 10-bit mantissa to the top of float's 23 bits
  // and rebias the exponent from 15 to 127 (add 112 << 23).
  const uint32_t normal = (magnitude << 13) + (112u << 23);
  // Infinity and NaN: the exponent is all ones in both formats, so rebias by
  // 255 - 31 = 224 instead. The float quiet bit is set so that a signalling
  // half NaN becomes a quiet float NaN, like the hardware converters do;
  // for infinity the mantissa is zero and it stays infinity.
  const uint32_t mantissa = magnitude & 0x3ffu;
  const uint32_t special =
      ((magnitude << 13) + (224u << 23)) | (mantissa != 0 ? 0x00400000u : 0u);
  // Zero and subnormals: the value is magnitude * 2^-24. 0.5f has a unit in
  // the last place of 2^-24, so putting magnitude into 0.5f's mantissa and
  // subtracting 0.5f yields the value exactly, without a shift loop to
  // normalise it.
  const uint32_t subnormal =
      FloatBits(BitsToFloat(0x3f000000u + magnitude) - 0.5f);
  uint32_t bits = magnitude >= 0x7c00u ? special : normal;
  bits = magnitude < 0x0400u ? subnormal : bits;
  return BitsToFloat(bits | sign);
}

// binary32 -> binary16, round to nearest, ties to even.
inline uint16_t FloatToHalfImpl(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;

  // Normal half results (|value| in [2^-14, 65520)): drop 13 mantissa bits.
  // Adding 0xfff plus the lowest kept bit rounds to nearest with ties to
  // even; a carry out of the mantissa correctly bumps the exponent. Then
  // rebias the exponent from 127 to 15. Computed unconditionally; the
  // unsigned arithmetic wraps harmlessly for inputs that take another branch.
  const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  const uint32_t normal = (rounded - (112u << 23)) >> 13;

  // Subnormal half results (|value| < 2^-14): the half value is
  // n * 2^-24 with n in [0, 1024]. Adding 0.5f, whose ulp is 2^-24, makes the
  // FPU round |value| to a multiple of 2^-24 with ties to even, and n is then
  // the difference of the mantissas. n == 1024 is the smallest normal half,
  // whose encoding 0x0400 is exactly n, so the carry needs no special case.
  const uint32_t subnormal =
      FloatBits(BitsToFloat(magnitude) + 0.5f) - 0x3f000000u;

  // NaN: keep the top mantissa bits as payload and force the quiet bit, so
  // that a NaN whose payload lies only in the dropped bits stays a NaN.
  const uint32_t nan = 0x7e00u | ((magnitude >> 13) & 0x3ffu);

  uint32_t half = magnitude < 0x38800000u ? subnormal : normal;
  // 0x477ff000 is 65520, halfway between the largest half (65504) and
  // 65536; it and everything above it (including infinity) round to
  // infinity because 65504's mantissa is odd.
  half = magnitude >= 0x477ff000u ? 0x7c00u : half;
  half = magnitude > 0x7f800000u ? nan : half;
  return static_cast<uint16_t>(half | sign);
}

inline float BFloat16ToFloatImpl(uint16_t bf16) {
  // bfloat16 is the top half of a float, so widening is a shift; NaN,
  // infinity and subnormals all map to themselves.
  return BitsToFloat(static_cast<uint32_t>(bf16) << 16);
}

inline uint16_t FloatToBFloat16Impl(float value) {
  const uint32_t bits = FloatBits(value);
  // Round to nearest even on the 16 dropped bits. Overflow carries into the
  // exponent, which also turns values at or above the halfway point past the
  // largest bfloat16 into infinity, and rounds subnormals correctly.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // NaN must not go through the rounding: a payload only in the low bits
  // would otherwise truncate to infinity (or carry into the sign). Keep the
  // sign and top payload and set the quiet bit.
  const uint32_t nan = (bits >> 16) | 0x0040u;
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

// ---------------------------------------------------------------------------
// Codecs: how a stored element becomes the type arithmetic is done in.

template <typename T>
struct NativeCodec {
  using Storage = T;
  using Compute = T;
  static Compute Decode(Storage value) { return value; }
  static Storage Encode(Compute value) { return value; }
};

struct HalfCodec {
  using Storage = uint16_t;
  using Compute = float;
  static Compute Decode(Storage value) { return HalfToFloatImpl(value); }
  static Storage Encode(Compute value) { return FloatToHalfImpl(value); }
};

// bool as torch and NumPy store it: one byte, 0 or 1 (any non-zero byte
// reads as 1). On 0/1, MAX is a logical or and MIN a logical and; SUM and
// PROD map to them (ReduceWithOp), as gloo does.
struct BoolCodec {
  using Storage = uint8_t;
  using Compute = uint8_t;
  static Compute Decode(Storage value) { return value != 0 ? 1 : 0; }
  static Storage Encode(Compute value) { return value; }
};

struct BFloat16Codec {
  using Storage = uint16_t;
  using Compute = float;
  static Compute Decode(Storage value) { return BFloat16ToFloatImpl(value); }
  static Storage Encode(Compute value) { return FloatToBFloat16Impl(value); }
};

// ---------------------------------------------------------------------------
// Operators on the compute type.

struct SumOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      // Signed overflow is undefined; unsigned arithmetic wraps, and the
      // conversion back is modular on every compiler we support (and
      // guaranteed so from C++20).
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};

struct ProdOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      // In unsigned arithmetic at least as wide as unsigned int: narrower
      // types would promote to (signed) int, whose overflow is undefined
      // (65535 * 65535 > INT_MAX). The conversion back is modular.
      using U = std::make_unsigned_t<T>;
      using W = std::conditional_t<(sizeof(U) < sizeof(unsigned int)),
                                   unsigned int, U>;
      return static_cast<T>(static_cast<W>(static_cast<U>(a)) *
                            static_cast<W>(static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
};

// For floats, `b < a ? b : a` alone would silently drop a NaN in `a` (every
// comparison with NaN is false). a + b is NaN whenever either operand is, so
// selecting it on the unordered case propagates the NaN while keeping the
// loop free of branches (vectorisable as compare + blend).
struct MinOp {
  template <typename T>
  static T Apply(T a, T b) {
    const T min = b < a ? b : a;
    if constexpr (std::is_floating_point_v<T>) {
      // Both candidates are computed unconditionally and combined with a
      // select (and `|`, not `||`), so the loop body has no branches for the
      // vectoriser to give up on.
      const T nan_if_any = a + b;
      const bool unordered = (a != a) | (b != b);
      return unordered ? nan_if_any : min;
    } else {
      return min;
    }
  }
};

struct MaxOp {
  template <typename T>
  static T Apply(T a, T b) {
    const T max = a < b ? b : a;
    if constexpr (std::is_floating_point_v<T>) {
      const T nan_if_any = a + b;  // see MinOp
      const bool unordered = (a != a) | (b != b);
      return unordered ? nan_if_any : max;
    } else {
      return max;
    }
  }
};

// ---------------------------------------------------------------------------
// Element loops. One instantiation per (instruction set, codec, op); the
// dispatch picks one per call so the loops contain no type or op decisions.

// How the loops see caller memory: Element<T> is T with alignment 1 and
// may_alias. may_alias because callers hand over bytes (network buffers,
// uint8_t vectors) and reading those as T would otherwise break strict
// aliasing; alignment 1 because the contract allows any address, and a T*
// not aligned to alignof(T) is undefined behaviour even where the hardware
// tolerates it. GCC then emits unaligned vector moves, which on x86-64 (and
// AArch64) cost the same as aligned ones on aligned data: compiled with an
// aligned view as well, the loops came out instruction for instruction the
// same, so there is no separate aligned path. A typedef inside a class
// rather than a template argument, because GCC drops attributes on template
// arguments.
template <typename T>
struct ElementView {
  typedef T Type __attribute__((aligned(1), may_alias));
};
template <typename T>
using Element = typename ElementView<T>::Type;
static_assert(alignof(Element<double>) == 1 && alignof(Element<float>) == 1,
              "the compiler dropped the aligned(1) attribute");

#define HALKA_ALWAYS_INLINE __attribute__((always_inline)) inline

// Distinct buffers: restrict parameters, so that GCC need not version the
// loop for aliasing (the contract rules out partial overlap).
template <typename Codec, typename Op>
HALKA_ALWAYS_INLINE void ReduceDistinctLoop(
    Element<typename Codec::Storage>* __restrict dst,
    const Element<typename Codec::Storage>* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    dst[i] =
        Codec::Encode(Op::Apply(Codec::Decode(dst[i]), Codec::Decode(src[i])));
  }
}

// dst == src, which the contract allows. A loop of its own because restrict
// on two names for the same memory would be undefined behaviour.
template <typename Codec, typename Op>
HALKA_ALWAYS_INLINE void ReduceSelfLoop(Element<typename Codec::Storage>* data,
                                        size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const typename Codec::Compute value = Codec::Decode(data[i]);
    data[i] = Codec::Encode(Op::Apply(value, value));
  }
}

// FinalizeAvg. Integer `/` truncates toward zero, as the contract asks.
// Floats divide in their own precision, the half types in float (the
// divisor is exact below 2^24) and round once in Encode.
template <typename Codec>
HALKA_ALWAYS_INLINE void DivideLoop(Element<typename Codec::Storage>* data,
                                    size_t count,
                                    typename Codec::Compute divisor) {
  for (size_t i = 0; i < count; ++i) {
    data[i] = Codec::Encode(Codec::Decode(data[i]) / divisor);
  }
}

// ---------------------------------------------------------------------------
// Instruction sets.
//
// The project compiles for baseline x86-64, whose SSE2 has 128-bit vectors
// and lacks 64-bit compares, 32-bit min/max and several packs, so MIN/MAX,
// the 64-bit integer ops and the bfloat16 conversions come out slow. Each
// loop is therefore compiled twice, once as it is and once inside a
// target("avx2") function (the always_inline loop is inlined and vectorised
// there with 256-bit vectors), and ReduceInto/FinalizeAvg pick one per call
// from a cached CPU check. FMA is deliberately not enabled: contracting
// operations would change results between machines.

struct BaselineIsa {
  template <typename Codec, typename Op>
  static void ReduceDistinct(
      Element<typename Codec::Storage>* __restrict dst,
      const Element<typename Codec::Storage>* __restrict src, size_t count) {
    ReduceDistinctLoop<Codec, Op>(dst, src, count);
  }
  template <typename Codec, typename Op>
  static void ReduceSelf(Element<typename Codec::Storage>* data, size_t count) {
    ReduceSelfLoop<Codec, Op>(data, count);
  }
  template <typename Codec>
  static void Divide(Element<typename Codec::Storage>* data, size_t count,
                     typename Codec::Compute divisor) {
    DivideLoop<Codec>(data, count, divisor);
  }
};

// HALKA_NO_X86_DISPATCH builds only the baseline loops and the portable
// float16 conversions, to test them on a machine that has AVX2 and F16C.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(HALKA_NO_X86_DISPATCH)
#define HALKA_X86_DISPATCH 1

struct Avx2Isa {
  template <typename Codec, typename Op>
  __attribute__((target("avx2"))) static void ReduceDistinct(
      Element<typename Codec::Storage>* __restrict dst,
      const Element<typename Codec::Storage>* __restrict src, size_t count) {
    ReduceDistinctLoop<Codec, Op>(dst, src, count);
  }
  template <typename Codec, typename Op>
  __attribute__((target("avx2"))) static void ReduceSelf(
      Element<typename Codec::Storage>* data, size_t count) {
    ReduceSelfLoop<Codec, Op>(data, count);
  }
  template <typename Codec>
  __attribute__((target("avx2"))) static void Divide(
      Element<typename Codec::Storage>* data, size_t count,
      typename Codec::Compute divisor) {
    DivideLoop<Codec>(data, count, divisor);
  }
};

struct CpuFeatures {
  bool avx2;
  bool f16c;
};

const CpuFeatures& Cpu() {
  // Resolved once. __builtin_cpu_supports("avx"/"avx2") also checks that the
  // OS saves the 256-bit register state. __builtin_cpu_init makes this safe
  // even if the first call comes from another static initialiser.
  static const CpuFeatures features = [] {
    __builtin_cpu_init();
    CpuFeatures f;
    f.avx2 = __builtin_cpu_supports("avx2");
    f.f16c = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    return f;
  }();
  return features;
}

#else
#define HALKA_X86_DISPATCH 0
#endif

template <typename Isa, typename Codec, typename Op>
void ReduceTyped(void* dst, const void* src, size_t count) {
  using E = Element<typename Codec::Storage>;
  if (dst == src) {
    Isa::template ReduceSelf<Codec, Op>(static_cast<E*>(dst), count);
  } else {
    Isa::template ReduceDistinct<Codec, Op>(static_cast<E*>(dst),
                                            static_cast<const E*>(src), count);
  }
}

#if HALKA_X86_DISPATCH
// float16 with the F16C conversion instructions, 8 elements at a time.
// Neither SSE2 nor AVX2 converts halves, so the portable loop spends most
// of its time converting (about 2 ns per element with SSE2); F16C does each
// direction in one instruction with the same round-to-nearest-even result,
// and quiets signalling NaNs as the portable code does.
template <typename Op>
struct F16COp;

template <>
struct F16COp<SumOp> {
  __attribute__((target("avx,f16c"))) static __m256 Apply(__m256 a, __m256 b) {
    return _mm256_add_ps(a, b);
  }
};
template <>
struct F16COp<ProdOp> {
  __attribute__((target("avx,f16c"))) static __m256 Apply(__m256 a, __m256 b) {
    return _mm256_mul_ps(a, b);
  }
};

// Same semantics as MinOp/MaxOp: minps(x, y) is `x < y ? x : y`, so
// minps(b, a) is `b < a ? b : a`; unordered lanes take a + b (a NaN).
// The select is spelled and/andnot/or: GCC 12 split _mm256_blendv_ps into
// per-lane branches here, which made MIN/MAX six times slower than SUM.
__attribute__((target("avx,f16c"))) inline __m256 SelectNaN(__m256 a, __m256 b,
                                                            __m256 ordered) {
  const __m256 unordered = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
  return _mm256_or_ps(_mm256_and_ps(unordered, _mm256_add_ps(a, b)),
                      _mm256_andnot_ps(unordered, ordered));
}
template <>
struct F16COp<MinOp> {
  __attribute__((target("avx,f16c"))) static __m256 Apply(__m256 a, __m256 b) {
    return SelectNaN(a, b, _mm256_min_ps(b, a));
  }
};
template <>
struct F16COp<MaxOp> {
  __attribute__((target("avx,f16c"))) static __m256 Apply(__m256 a, __m256 b) {
    return SelectNaN(a, b, _mm256_max_ps(b, a));
  }
};

template <typename Op>
__attribute__((target("avx,f16c"))) void ReduceHalfF16C(void* dst,
                                                        const void* src,
                                                        size_t count) {
  unsigned char* d = static_cast<unsigned char*>(dst);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    // Unaligned loads and stores: the contract allows any alignment. A
    // block is loaded in full before it is stored, so dst == src is fine.
    const __m128i a =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + 2 * i));
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
    const __m256 r = F16COp<Op>::Apply(_mm256_cvtph_ps(a), _mm256_cvtph_ps(b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
  }
  // The tail (under 8 elements) takes the portable code, which rounds the
  // same way.
  ReduceTyped<BaselineIsa, HalfCodec, Op>(d + 2 * i, s + 2 * i, count - i);
}
#endif  // HALKA_X86_DISPATCH

template <typename Isa, typename Codec>
void ReduceWithOp(ReduceOp op, void* dst, const void* src, size_t count) {
#if HALKA_X86_DISPATCH
  if constexpr (std::is_same_v<Codec, HalfCodec>) {
    if (Cpu().f16c) {
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          ReduceHalfF16C<SumOp>(dst, src, count);
          return;
        case ReduceOp::kProd:
          ReduceHalfF16C<ProdOp>(dst, src, count);
          return;
        case ReduceOp::kMin:
          ReduceHalfF16C<MinOp>(dst, src, count);
          return;
        case ReduceOp::kMax:
          ReduceHalfF16C<MaxOp>(dst, src, count);
          return;
      }
      return;
    }
  }
#endif
  if constexpr (std::is_same_v<Codec, BoolCodec>) {
    // On 0/1: SUM is MAX (or), PROD is MIN (and). AVG is refused before
    // (CheckReduction); here it would be an or.
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) op = ReduceOp::kMax;
    if (op == ReduceOp::kProd) op = ReduceOp::kMin;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // divided later by FinalizeAvg
      ReduceTyped<Isa, Codec, SumOp>(dst, src, count);
      return;
    case ReduceOp::kProd:
      ReduceTyped<Isa, Codec, ProdOp>(dst, src, count);
      return;
    case ReduceOp::kMin:
      ReduceTyped<Isa, Codec, MinOp>(dst, src, count);
      return;
    case ReduceOp::kMax:
      ReduceTyped<Isa, Codec, MaxOp>(dst, src, count);
      return;
  }
  // An op outside the enum leaves dst untouched: callers validate wire
  // values with IsValidReduceOp first.
}

// The codecs of this file, by dtype (core/dtype_dispatch.h).
struct Codecs {
  template <typename T> using Native = NativeCodec<T>;
  using Half = HalfCodec;
  using BFloat16 = BFloat16Codec;
  using Bool = BoolCodec;
};

template <typename Isa>
void ReduceIntoIsa(DType dtype, ReduceOp op, void* dst, const void* src,
                   size_t count) {
  WithCodec<Codecs>(dtype, [&](auto tag) {
    ReduceWithOp<Isa, typename decltype(tag)::type>(op, dst, src, count);
  });
}

template <typename Isa, typename Codec>
void DivideTyped(void* dst, size_t count, int divisor) {
  using Compute = typename Codec::Compute;
  auto* data = static_cast<Element<typename Codec::Storage>*>(dst);
  if constexpr (std::is_integral_v<Compute> &&
                sizeof(Compute) < sizeof(int)) {
    // The divisor (a world size) need not fit the element type: divide in
    // int, where the quotient of an 8- or 16-bit value always fits back.
    for (size_t i = 0; i < count; ++i) {
      data[i] = static_cast<Compute>(static_cast<int>(data[i]) / divisor);
    }
    return;
  }
  if constexpr (std::is_integral_v<Compute>) {
    if (divisor == -1) {
      // The most negative value divided by -1 overflows; negation in
      // unsigned arithmetic wraps instead, like SUM and PROD do. Rare, so
      // this loop is not worth a vectorised version.
      using U = std::make_unsigned_t<Compute>;
      for (size_t i = 0; i < count; ++i) {
        data[i] = static_cast<Compute>(U{0} - static_cast<U>(data[i]));
      }
      return;
    }
  }
  Isa::template Divide<Codec>(data, count, static_cast<Compute>(divisor));
}

template <typename Isa>
void FinalizeAvgIsa(DType dtype, void* dst, size_t count, int divisor) {
  // AVG is refused for bool (CheckReduction): nothing to divide.
  if (dtype == DType::kBool) return;
  WithCodec<Codecs>(dtype, [&](auto tag) {
    using Codec = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<Codec, BoolCodec>) {
      DivideTyped<Isa, Codec>(dst, count, divisor);
    }
  });
}

}  // namespace

void ReduceInto(DType dtype, ReduceOp op, void* dst, const void* src,
                size_t count) {
  if (count == 0) return;
#if HALKA_X86_DISPATCH
  if (Cpu().avx2) {
    ReduceIntoIsa<Avx2Isa>(dtype, op, dst, src, count);
    return;
  }
#endif
  ReduceIntoIsa<BaselineIsa>(dtype, op, dst, src, count);
}

void FinalizeAvg(DType dtype, void* dst, size_t count, int divisor) {
  // Dividing by one changes nothing. Dividing by zero is a caller bug (a
  // group with no members) that would be undefined behaviour for integers
  // and fill floats with inf/NaN; the buffer is left as it is instead.
  if (count == 0 || divisor == 1 || divisor == 0) return;
#if HALKA_X86_DISPATCH
  if (Cpu().avx2) {
    FinalizeAvgIsa<Avx2Isa>(dtype, dst, count, divisor);
    return;
  }
#endif
  FinalizeAvgIsa<BaselineIsa>(dtype, dst, count, divisor);
}

uint16_t FloatToHalf(float value) { return FloatToHalfImpl(value); }
float HalfToFloat(uint16_t bits) { return HalfToFloatImpl(bits); }
uint16_t FloatToBFloat16(float value) { return FloatToBFloat16Impl(value); }
float BFloat16ToFloat(uint16_t bits) { return BFloat16ToFloatImpl(bits); }

}  // namespace halka
