#include "worker/core/reduce.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "worker/core/dtype.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HALKA_HAVE_F16C_PATH 1
#else
#define HALKA_HAVE_F16C_PATH 0
#endif

// Reducers never read the floating-point exception flags, and with the
// default -ftrapping-math GCC must assume any comparison or arithmetic may
// trap, so it keeps the branches of MinOp/MaxOp and the float16/bfloat16
// conversions instead of turning them into selects, and the loops are not
// vectorised. Dropping that assumption changes no result. It is set here,
// after the includes, so that it covers only this file's functions.
#pragma GCC optimize("no-trapping-math")

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
      // Only 32- and 64-bit integers reach here, so U does not promote to
      // (signed) int before the multiplication.
      using U = std::make_unsigned_t<T>;
      static_assert(sizeof(U) >= sizeof(unsigned int));
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
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
      // Everything is computed unconditionally and combined with a select:
      // under the default -ftrapping-math GCC refuses to if-convert (and so
      // to vectorise) a conditionally evaluated a + b or a short-circuit ||.
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
// Element loops. One instantiation per (codec, op); the dispatch picks one
// per call so the loops themselves contain no type or op decisions.

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

// Distinct buffers: restrict parameters, so that GCC need not version the
// loop for aliasing (the contract rules out partial overlap).
template <typename Codec, typename Op>
void ReduceDistinct(Element<typename Codec::Storage>* __restrict dst,
                    const Element<typename Codec::Storage>* __restrict src,
                    size_t count) {
  for (size_t i = 0; i < count; ++i) {
    dst[i] = Codec::Encode(
        Op::Apply(Codec::Decode(dst[i]), Codec::Decode(src[i])));
  }
}

// dst == src, which the contract allows. A loop of its own because restrict
// on two names for the same memory would be undefined behaviour.
template <typename Codec, typename Op>
void ReduceSelf(Element<typename Codec::Storage>* data, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const typename Codec::Compute value = Codec::Decode(data[i]);
    data[i] = Codec::Encode(Op::Apply(value, value));
  }
}

template <typename Codec, typename Op>
void ReduceTyped(void* dst, const void* src, size_t count) {
  using E = Element<typename Codec::Storage>;
  if (dst == src) {
    ReduceSelf<Codec, Op>(static_cast<E*>(dst), count);
  } else {
    ReduceDistinct<Codec, Op>(static_cast<E*>(dst),
                              static_cast<const E*>(src), count);
  }
}

#if HALKA_HAVE_F16C_PATH
// float16 with the F16C conversion instructions, 8 elements at a time.
// x86-64's baseline (SSE2) has no half conversions, so the portable loop
// above spends most of its time converting; F16C does each direction in one
// instruction with the same round-to-nearest-even result. Only called after
// a runtime CPU check, hence the function-level target attribute rather
// than a global -mf16c.
template <typename Op>
struct F16COp;

template <>
struct F16COp<SumOp> {
  __attribute__((target("avx,f16c"))) static __m256 Apply(__m256 a,
                                                          __m256 b) {
    return _mm256_add_ps(a, b);
  }
};
template <>
struct F16COp<ProdOp> {
  __attribute__((target("avx,f16c"))) static __m256 Apply(__m256 a,
                                                          __m256 b) {
    return _mm256_mul_ps(a, b);
  }
};
// Same semantics as MinOp/MaxOp: minps(x, y) is `x < y ? x : y`, so
// minps(b, a) is `b < a ? b : a`; unordered lanes take a + b (a NaN).
template <>
struct F16COp<MinOp> {
  __attribute__((target("avx,f16c"))) static __m256 Apply(__m256 a,
                                                          __m256 b) {
    const __m256 unordered = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_min_ps(b, a), _mm256_add_ps(a, b),
                            unordered);
  }
};
template <>
struct F16COp<MaxOp> {
  __attribute__((target("avx,f16c"))) static __m256 Apply(__m256 a,
                                                          __m256 b) {
    const __m256 unordered = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_max_ps(b, a), _mm256_add_ps(a, b),
                            unordered);
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
    // Unaligned loads/stores: the contract allows any alignment. A block
    // is fully loaded before it is stored, so dst == src is fine.
    const __m128i a =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + 2 * i));
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
    const __m256 r =
        F16COp<Op>::Apply(_mm256_cvtph_ps(a), _mm256_cvtph_ps(b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
  }
  // The tail goes through the portable code, which rounds identically.
  ReduceTyped<HalfCodec, Op>(d + 2 * i, s + 2 * i, count - i);
}

bool CpuHasF16C() {
  // Resolved once; __builtin_cpu_supports also checks that the OS saves the
  // AVX register state, which the 256-bit path needs.
  static const bool has_f16c =
      __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return has_f16c;
}
#endif  // HALKA_HAVE_F16C_PATH

template <typename Op>
void ReduceHalf(void* dst, const void* src, size_t count) {
#if HALKA_HAVE_F16C_PATH
  if (CpuHasF16C()) {
    ReduceHalfF16C<Op>(dst, src, count);
    return;
  }
#endif
  ReduceTyped<HalfCodec, Op>(dst, src, count);
}

template <typename Codec>
void ReduceWithOp(ReduceOp op, void* dst, const void* src, size_t count) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // divided later by FinalizeAvg
      ReduceTyped<Codec, SumOp>(dst, src, count);
      return;
    case ReduceOp::kProd:
      ReduceTyped<Codec, ProdOp>(dst, src, count);
      return;
    case ReduceOp::kMin:
      ReduceTyped<Codec, MinOp>(dst, src, count);
      return;
    case ReduceOp::kMax:
      ReduceTyped<Codec, MaxOp>(dst, src, count);
      return;
  }
}

template <>
void ReduceWithOp<HalfCodec>(ReduceOp op, void* dst, const void* src,
                             size_t count) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      ReduceHalf<SumOp>(dst, src, count);
      return;
    case ReduceOp::kProd:
      ReduceHalf<ProdOp>(dst, src, count);
      return;
    case ReduceOp::kMin:
      ReduceHalf<MinOp>(dst, src, count);
      return;
    case ReduceOp::kMax:
      ReduceHalf<MaxOp>(dst, src, count);
      return;
  }
}

// ---------------------------------------------------------------------------
// FinalizeAvg loop.

template <typename Codec>
void DivideTyped(void* dst, size_t count, int divisor) {
  using Storage = typename Codec::Storage;
  using Compute = typename Codec::Compute;
  Element<Storage>* data = static_cast<Element<Storage>*>(dst);
  if constexpr (std::is_integral_v<Compute>) {
    if (divisor == -1) {
      // The most negative value divided by -1 overflows; negation in
      // unsigned arithmetic wraps instead, like SUM and PROD do.
      using U = std::make_unsigned_t<Compute>;
      for (size_t i = 0; i < count; ++i) {
        data[i] = static_cast<Compute>(U{0} - static_cast<U>(data[i]));
      }
      return;
    }
  }
  // Integer `/` truncates toward zero, as the contract asks. Floats divide
  // in their own precision; half types in float (the divisor is exact below
  // 2^24) and round once in Encode.
  const Compute typed_divisor = static_cast<Compute>(divisor);
  for (size_t i = 0; i < count; ++i) {
    data[i] = Codec::Encode(Codec::Decode(data[i]) / typed_divisor);
  }
}

}  // namespace

void ReduceInto(DType dtype, ReduceOp op, void* dst, const void* src,
                size_t count) {
  if (count == 0) return;
  switch (dtype) {
    case DType::kFloat32:
      ReduceWithOp<NativeCodec<float>>(op, dst, src, count);
      return;
    case DType::kFloat64:
      ReduceWithOp<NativeCodec<double>>(op, dst, src, count);
      return;
    case DType::kFloat16:
      ReduceWithOp<HalfCodec>(op, dst, src, count);
      return;
    case DType::kBFloat16:
      ReduceWithOp<BFloat16Codec>(op, dst, src, count);
      return;
    case DType::kInt32:
      ReduceWithOp<NativeCodec<int32_t>>(op, dst, src, count);
      return;
    case DType::kInt64:
      ReduceWithOp<NativeCodec<int64_t>>(op, dst, src, count);
      return;
  }
  // An out-of-range dtype or op leaves dst untouched: callers validate wire
  // values with IsValidDType/IsValidReduceOp before they get here.
}

void FinalizeAvg(DType dtype, void* dst, size_t count, int divisor) {
  // Dividing by one changes nothing; dividing by zero is a caller bug (a
  // group of zero members) that for integers would be undefined behaviour,
  // so the buffer is left as it is.
  if (count == 0 || divisor == 1 || divisor == 0) return;
  switch (dtype) {
    case DType::kFloat32:
      DivideTyped<NativeCodec<float>>(dst, count, divisor);
      return;
    case DType::kFloat64:
      DivideTyped<NativeCodec<double>>(dst, count, divisor);
      return;
    case DType::kFloat16:
      DivideTyped<HalfCodec>(dst, count, divisor);
      return;
    case DType::kBFloat16:
      DivideTyped<BFloat16Codec>(dst, count, divisor);
      return;
    case DType::kInt32:
      DivideTyped<NativeCodec<int32_t>>(dst, count, divisor);
      return;
    case DType::kInt64:
      DivideTyped<NativeCodec<int64_t>>(dst, count, divisor);
      return;
  }
}

uint16_t FloatToHalf(float value) { return FloatToHalfImpl(value); }
float HalfToFloat(uint16_t bits) { return HalfToFloatImpl(bits); }
uint16_t FloatToBFloat16(float value) { return FloatToBFloat16Impl(value); }
float BFloat16ToFloat(uint16_t bits) { return BFloat16ToFloatImpl(bits); }

}  // namespace halka
