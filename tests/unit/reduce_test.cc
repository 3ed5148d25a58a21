// Tests of the CPU reducers and the float16/bfloat16 conversions.
//
// Every expected value is computed here by a path that shares no code with
// core/reduce.cc: integers with unsigned arithmetic, floats in double,
// and float16/bfloat16 decoded with ldexp and rounded with frexp/nearbyint
// (RefDecode/RefRound below). A double result rounded to float, half or
// bfloat16 equals the correctly rounded result of the operation because
// double has more than 2p+2 bits for each of those formats' p, which is
// also why the library's compute-in-float-then-round agrees with it.
#include "core/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "core/dtype.h"

namespace halka {
namespace {

// ---------------------------------------------------------------------------
// Independent reference helpers.

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

uint64_t Bits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FloatFromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

double DoubleFromBits(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// A 16-bit binary floating-point format: float16 has 10 fraction bits and 5
// exponent bits, bfloat16 7 and 8.
struct Format16 {
  int fraction_bits;
  int exponent_bits;
  int Bias() const { return (1 << (exponent_bits - 1)) - 1; }
  uint32_t ExponentMask() const {
    return ((1u << exponent_bits) - 1) << fraction_bits;
  }
  uint32_t FractionMask() const { return (1u << fraction_bits) - 1; }
};
constexpr Format16 kHalf{10, 5};
constexpr Format16 kBF16{7, 8};

bool RefIsNaN(Format16 f, uint32_t bits) {
  return (bits & f.ExponentMask()) == f.ExponentMask() &&
         (bits & f.FractionMask()) != 0;
}

double RefDecode(Format16 f, uint32_t bits) {
  const bool negative = (bits & 0x8000u) != 0;
  const uint32_t exponent = (bits & f.ExponentMask()) >> f.fraction_bits;
  const uint32_t fraction = bits & f.FractionMask();
  double magnitude;
  if (exponent == (1u << f.exponent_bits) - 1) {
    magnitude = fraction != 0 ? std::numeric_limits<double>::quiet_NaN()
                              : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(fraction),
                           1 - f.Bias() - f.fraction_bits);
  } else {
    magnitude =
        std::ldexp(static_cast<double>(fraction | (1u << f.fraction_bits)),
                   static_cast<int>(exponent) - f.Bias() - f.fraction_bits);
  }
  return negative ? -magnitude : magnitude;
}

// Rounds x to the format, to nearest with ties to even (nearbyint in the
// default rounding mode), with subnormals and overflow to infinity.
uint16_t RefRound(Format16 f, double x) {
  const uint32_t sign = std::signbit(x) ? 0x8000u : 0u;
  const uint32_t inf = f.ExponentMask();
  if (std::isnan(x)) return static_cast<uint16_t>(sign | inf | 1u);
  const double magnitude = std::fabs(x);
  if (std::isinf(magnitude)) return static_cast<uint16_t>(sign | inf);
  if (magnitude == 0) return static_cast<uint16_t>(sign);
  const int min_exponent = 1 - f.Bias();
  int exponent;
  std::frexp(magnitude, &exponent);
  exponent -= 1;  // magnitude is in [2^exponent, 2^(exponent + 1))
  if (exponent < min_exponent) exponent = min_exponent;  // subnormal
  double n = std::nearbyint(std::ldexp(magnitude, f.fraction_bits - exponent));
  if (n == std::ldexp(1.0, f.fraction_bits + 1)) {  // rounded up a binade
    n /= 2;
    exponent += 1;
  }
  if (exponent > f.Bias()) return static_cast<uint16_t>(sign | inf);
  const uint32_t significand = static_cast<uint32_t>(n);
  if (significand < (1u << f.fraction_bits)) {
    return static_cast<uint16_t>(sign | significand);  // subnormal
  }
  return static_cast<uint16_t>(
      sign | (static_cast<uint32_t>(exponent + f.Bias()) << f.fraction_bits) |
      (significand & f.FractionMask()));
}

// ---------------------------------------------------------------------------
// Buffers: elements are kept as raw bits (up to 8 bytes) and written at an
// arbitrary byte offset into a uint8_t vector, so the reducer sees pointers
// with any alignment. Guard bytes around the elements catch stray writes.

constexpr uint8_t kGuard = 0xA5;
constexpr size_t kGuardBytes = 64;

class Buffer {
 public:
  Buffer(DType dtype, const std::vector<uint64_t>& elements, size_t offset)
      : size_(DTypeSize(dtype)),
        count_(elements.size()),
        offset_(offset + kGuardBytes),
        bytes_(offset_ + count_ * size_ + kGuardBytes, kGuard) {
    for (size_t i = 0; i < count_; ++i) Set(i, elements[i]);
  }

  void* data() { return bytes_.data() + offset_; }

  uint64_t Get(size_t i) const {
    uint64_t bits = 0;  // little-endian: the low bytes are the element
    std::memcpy(&bits, bytes_.data() + offset_ + i * size_, size_);
    return bits;
  }
  void Set(size_t i, uint64_t bits) {
    std::memcpy(bytes_.data() + offset_ + i * size_, &bits, size_);
  }

  bool GuardsIntact() const {
    for (size_t i = 0; i < offset_; ++i) {
      if (bytes_[i] != kGuard) return false;
    }
    for (size_t i = offset_ + count_ * size_; i < bytes_.size(); ++i) {
      if (bytes_[i] != kGuard) return false;
    }
    return true;
  }

 private:
  size_t size_;
  size_t count_;
  size_t offset_;
  std::vector<uint8_t> bytes_;
};

// ---------------------------------------------------------------------------
// Random data. Each dtype mixes ordinary values with the special ones the
// kernels must get right.

uint64_t RandomElement(DType dtype, std::mt19937_64& rng) {
  const uint64_t r = rng();
  const bool special = (r & 0x3f) == 0;  // 1 in 64
  switch (dtype) {
    case DType::kInt32: {
      static constexpr int32_t kEdges[] = {
          std::numeric_limits<int32_t>::min(),
          std::numeric_limits<int32_t>::min() + 1,
          std::numeric_limits<int32_t>::max(),
          std::numeric_limits<int32_t>::max() - 1,
          -1,
          0,
          1,
          65536,
          -65536};
      // Edge values 1 in 8 so that wrap-around happens often.
      if ((r & 7) == 0) {
        return static_cast<uint32_t>(kEdges[(r >> 8) % std::size(kEdges)]);
      }
      return static_cast<uint32_t>(r >> 32);
    }
    case DType::kInt64: {
      static constexpr int64_t kEdges[] = {
          std::numeric_limits<int64_t>::min(),
          std::numeric_limits<int64_t>::min() + 1,
          std::numeric_limits<int64_t>::max(),
          std::numeric_limits<int64_t>::max() - 1,
          -1,
          0,
          1,
          int64_t{1} << 32,
          -(int64_t{1} << 32)};
      if ((r & 7) == 0) {
        return static_cast<uint64_t>(kEdges[(r >> 8) % std::size(kEdges)]);
      }
      return rng();
    }
    case DType::kFloat32: {
      if (special) {
        static const float kSpecials[] = {
            std::numeric_limits<float>::quiet_NaN(),
            std::numeric_limits<float>::infinity(),
            -std::numeric_limits<float>::infinity(),
            0.0f,
            -0.0f,
            std::numeric_limits<float>::denorm_min(),
            std::numeric_limits<float>::max(),
            -std::numeric_limits<float>::max()};
        return Bits(kSpecials[(r >> 8) % std::size(kSpecials)]);
      }
      // Random sign and mantissa, exponent within 2^+-40: sums and
      // products stay finite and both round.
      const uint32_t exponent = 127 - 40 + static_cast<uint32_t>((r >> 8) % 81);
      return (static_cast<uint32_t>(r >> 63) << 31) | (exponent << 23) |
             static_cast<uint32_t>((r >> 20) & 0x7fffff);
    }
    case DType::kFloat64: {
      if (special) {
        static const double kSpecials[] = {
            std::numeric_limits<double>::quiet_NaN(),
            std::numeric_limits<double>::infinity(),
            -std::numeric_limits<double>::infinity(),
            0.0,
            -0.0,
            std::numeric_limits<double>::denorm_min(),
            std::numeric_limits<double>::max(),
            -std::numeric_limits<double>::max()};
        return Bits(kSpecials[(r >> 8) % std::size(kSpecials)]);
      }
      const uint64_t exponent = 1023 - 300 + (r >> 8) % 601;
      return (r & (uint64_t{1} << 63)) | (exponent << 52) |
             (rng() & ((uint64_t{1} << 52) - 1));
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      // Half the elements are arbitrary bit patterns (every exponent,
      // subnormals, infinities and NaNs; products over- and underflow), half
      // have exponents near 1.0 so that sums really round.
      const Format16 f = dtype == DType::kFloat16 ? kHalf : kBF16;
      const uint32_t bits = static_cast<uint32_t>(r >> 16) & 0xffffu;
      if ((r & 1) == 0) return bits;
      const uint32_t exponent =
          static_cast<uint32_t>(f.Bias() - 3 + static_cast<int>((r >> 40) % 7));
      return (bits & 0x8000u) | (exponent << f.fraction_bits) |
             (bits & f.FractionMask());
    }
  }
  return 0;
}

std::vector<uint64_t> RandomElements(DType dtype, size_t count,
                                     std::mt19937_64& rng) {
  std::vector<uint64_t> out(count);
  for (uint64_t& e : out) e = RandomElement(dtype, rng);
  return out;
}

// ---------------------------------------------------------------------------
// The reference for one element: the expected bits, or "any NaN".

struct Expected {
  uint64_t bits;
  bool nan;
};

template <typename T>
T RefApplyFloat(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMin:
      if (std::isnan(a) || std::isnan(b)) return a + b;
      return b < a ? b : a;
    case ReduceOp::kMax:
      if (std::isnan(a) || std::isnan(b)) return a + b;
      return a < b ? b : a;
  }
  return 0;
}

template <typename S>
uint64_t RefApplyInt(ReduceOp op, uint64_t a_bits, uint64_t b_bits) {
  using U = std::make_unsigned_t<S>;
  const U ua = static_cast<U>(a_bits);
  const U ub = static_cast<U>(b_bits);
  const S sa = static_cast<S>(ua);
  const S sb = static_cast<S>(ub);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<U>(ua + ub);
    case ReduceOp::kProd:
      return static_cast<U>(ua * ub);
    case ReduceOp::kMin:
      return static_cast<U>(sb < sa ? sb : sa);
    case ReduceOp::kMax:
      return static_cast<U>(sa < sb ? sb : sa);
  }
  return 0;
}

Expected RefReduce(DType dtype, ReduceOp op, uint64_t a, uint64_t b) {
  switch (dtype) {
    case DType::kInt32:
      return {RefApplyInt<int32_t>(op, a, b), false};
    case DType::kInt64:
      return {RefApplyInt<int64_t>(op, a, b), false};
    case DType::kFloat32: {
      const double r =
          RefApplyFloat<double>(op, FloatFromBits(static_cast<uint32_t>(a)),
                                FloatFromBits(static_cast<uint32_t>(b)));
      return {Bits(static_cast<float>(r)), std::isnan(r)};
    }
    case DType::kFloat64: {
      const double r =
          RefApplyFloat<double>(op, DoubleFromBits(a), DoubleFromBits(b));
      return {Bits(r), std::isnan(r)};
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const Format16 f = dtype == DType::kFloat16 ? kHalf : kBF16;
      const double r =
          RefApplyFloat<double>(op, RefDecode(f, static_cast<uint32_t>(a)),
                                RefDecode(f, static_cast<uint32_t>(b)));
      return {RefRound(f, r), std::isnan(r)};
    }
  }
  return {0, false};
}

bool IsNaNBits(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::kFloat32:
      return std::isnan(FloatFromBits(static_cast<uint32_t>(bits)));
    case DType::kFloat64:
      return std::isnan(DoubleFromBits(bits));
    case DType::kFloat16:
      return RefIsNaN(kHalf, static_cast<uint32_t>(bits));
    case DType::kBFloat16:
      return RefIsNaN(kBF16, static_cast<uint32_t>(bits));
    default:
      return false;
  }
}

// Compares every element of `actual` with `expected`; reports the first few
// mismatches and returns how many there were.
size_t CountMismatches(DType dtype, const std::vector<Expected>& expected,
                       const Buffer& actual, const std::vector<uint64_t>& a,
                       const std::vector<uint64_t>& b) {
  size_t mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const uint64_t got = actual.Get(i);
    const bool ok =
        expected[i].nan ? IsNaNBits(dtype, got) : got == expected[i].bits;
    if (!ok && ++mismatches <= 5) {
      ADD_FAILURE() << DTypeName(dtype) << " element " << i << ": a=0x"
                    << std::hex << a[i] << " b=0x" << b[i] << " expected 0x"
                    << expected[i].bits << (expected[i].nan ? " (NaN)" : "")
                    << " got 0x" << got << std::dec;
    }
  }
  return mismatches;
}

// ---------------------------------------------------------------------------
// ReduceInto: every dtype x op, several sizes and alignments.

class ReduceIntoTest
    : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

TEST_P(ReduceIntoTest, MatchesReference) {
  const auto [dtype, op] = GetParam();
  std::mt19937_64 rng(0x4a11 * static_cast<int>(dtype) + static_cast<int>(op));
  // Sizes around the vector widths and a large odd one (vector body plus a
  // scalar tail); offsets make dst and src misaligned for every dtype,
  // together and separately.
  constexpr size_t kSizes[] = {0, 1, 7, 8, 9, 1000003};
  constexpr std::pair<size_t, size_t> kOffsets[] = {
      {0, 0}, {1, 1}, {1, 0}, {0, 3}};
  for (size_t size : kSizes) {
    const std::vector<uint64_t> a = RandomElements(dtype, size, rng);
    const std::vector<uint64_t> b = RandomElements(dtype, size, rng);
    std::vector<Expected> expected(size);
    for (size_t i = 0; i < size; ++i) {
      expected[i] = RefReduce(dtype, op, a[i], b[i]);
    }
    for (const auto& [dst_offset, src_offset] : kOffsets) {
      SCOPED_TRACE(testing::Message()
                   << "size " << size << " dst offset " << dst_offset
                   << " src offset " << src_offset);
      Buffer dst(dtype, a, dst_offset);
      Buffer src(dtype, b, src_offset);
      ReduceInto(dtype, op, dst.data(), src.data(), size);
      EXPECT_EQ(CountMismatches(dtype, expected, dst, a, b), 0u);
      EXPECT_TRUE(dst.GuardsIntact());
      // src is const input; it must come back unchanged.
      for (size_t i = 0; i < size; ++i) {
        if (src.Get(i) != b[i]) {
          ADD_FAILURE() << "src modified at " << i;
          break;
        }
      }
    }
  }
}

TEST_P(ReduceIntoTest, DstEqualsSrc) {
  const auto [dtype, op] = GetParam();
  std::mt19937_64 rng(99 + static_cast<int>(dtype) * 7 + static_cast<int>(op));
  for (size_t size : {size_t{1}, size_t{7}, size_t{1001}}) {
    for (size_t offset : {0, 1}) {
      SCOPED_TRACE(testing::Message()
                   << "size " << size << " offset " << offset);
      const std::vector<uint64_t> a = RandomElements(dtype, size, rng);
      std::vector<Expected> expected(size);
      for (size_t i = 0; i < size; ++i) {
        expected[i] = RefReduce(dtype, op, a[i], a[i]);
      }
      Buffer buffer(dtype, a, offset);
      ReduceInto(dtype, op, buffer.data(), buffer.data(), size);
      EXPECT_EQ(CountMismatches(dtype, expected, buffer, a, a), 0u);
      EXPECT_TRUE(buffer.GuardsIntact());
    }
  }
}

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<DType, ReduceOp>>& info) {
  return std::string(DTypeName(std::get<0>(info.param))) + "_" +
         std::string(ReduceOpName(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ReduceIntoTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kAllReduceOps)),
                         ParamName);

TEST(ReduceIntoTest, CountZeroTouchesNothing) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      Buffer dst(dtype, {}, 1);
      Buffer src(dtype, {}, 0);
      ReduceInto(dtype, op, dst.data(), src.data(), 0);
      EXPECT_TRUE(dst.GuardsIntact()) << DTypeName(dtype);
    }
  }
  // Null pointers with count 0 are fine too (empty segments).
  ReduceInto(DType::kFloat32, ReduceOp::kSum, nullptr, nullptr, 0);
}

// Hand-computed integer cases, in case the random reference and the kernel
// shared a misunderstanding.
TEST(ReduceIntoTest, IntegerWrapAroundByHand) {
  int32_t dst32[] = {INT32_MAX, INT32_MIN, -7, 65536};
  const int32_t src32[] = {1, -1, 3, 65536};
  ReduceInto(DType::kInt32, ReduceOp::kSum, dst32, src32, 4);
  EXPECT_EQ(dst32[0], INT32_MIN);
  EXPECT_EQ(dst32[1], INT32_MAX);
  EXPECT_EQ(dst32[2], -4);
  EXPECT_EQ(dst32[3], 131072);

  int32_t prod32[] = {65536, INT32_MIN, -3, 46341};
  const int32_t factors32[] = {65536, -1, 5, 46341};
  ReduceInto(DType::kInt32, ReduceOp::kProd, prod32, factors32, 4);
  EXPECT_EQ(prod32[0], 0);          // 2^32 wraps to 0
  EXPECT_EQ(prod32[1], INT32_MIN);  // -(-2^31) wraps to itself
  EXPECT_EQ(prod32[2], -15);
  EXPECT_EQ(prod32[3], -2147479015);  // 46341^2 = 2147488281 - 2^32

  int64_t dst64[] = {INT64_MAX, INT64_MIN, int64_t{1} << 62};
  const int64_t src64[] = {1, -1, 4};
  ReduceInto(DType::kInt64, ReduceOp::kSum, dst64, src64, 2);
  EXPECT_EQ(dst64[0], INT64_MIN);
  EXPECT_EQ(dst64[1], INT64_MAX);
  EXPECT_EQ(dst64[2], int64_t{1} << 62);  // beyond count: untouched
  ReduceInto(DType::kInt64, ReduceOp::kProd, dst64 + 2, src64 + 2, 1);
  EXPECT_EQ(dst64[2], 0);  // 2^64 wraps to 0

  int64_t min64[] = {-5, 9, INT64_MIN};
  const int64_t other64[] = {3, -9, INT64_MAX};
  ReduceInto(DType::kInt64, ReduceOp::kMin, min64, other64, 3);
  EXPECT_EQ(min64[0], -5);
  EXPECT_EQ(min64[1], -9);
  EXPECT_EQ(min64[2], INT64_MIN);
}

TEST(ReduceIntoTest, InvalidDTypeOrOpLeavesDstUntouched) {
  float dst[] = {1.0f, 2.0f};
  const float src[] = {3.0f, 4.0f};
  ReduceInto(static_cast<DType>(0), ReduceOp::kSum, dst, src, 2);
  ReduceInto(static_cast<DType>(11), ReduceOp::kSum, dst, src, 2);
  ReduceInto(DType::kFloat32, static_cast<ReduceOp>(0), dst, src, 2);
  ReduceInto(DType::kFloat32, static_cast<ReduceOp>(6), dst, src, 2);
  EXPECT_EQ(dst[0], 1.0f);
  EXPECT_EQ(dst[1], 2.0f);
}

// ---------------------------------------------------------------------------
// MIN/MAX NaN propagation, with enough elements for the vector paths.

TEST(ReduceIntoTest, MinMaxPropagateNaN) {
  constexpr size_t kCount = 67;
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " " +
                   std::string(ReduceOpName(op)));
      // Values are small integers, exact in every format.
      auto encode = [dtype](double v) -> uint64_t {
        switch (dtype) {
          case DType::kFloat32:
            return Bits(static_cast<float>(v));
          case DType::kFloat64:
            return Bits(v);
          case DType::kFloat16:
            return RefRound(kHalf, v);
          default:
            return RefRound(kBF16, v);
        }
      };
      const double nan = std::numeric_limits<double>::quiet_NaN();
      std::vector<uint64_t> a(kCount);
      std::vector<uint64_t> b(kCount);
      std::vector<double> a_values(kCount);
      std::vector<double> b_values(kCount);
      for (size_t i = 0; i < kCount; ++i) {
        // NaN in dst only, in src only, in both, and in neither.
        a_values[i] = i % 3 == 0 ? nan : static_cast<double>(i % 11) - 5;
        b_values[i] = i % 5 == 0 ? nan : static_cast<double>(i % 7) - 3;
        a[i] = encode(a_values[i]);
        b[i] = encode(b_values[i]);
      }
      Buffer dst(dtype, a, 0);
      Buffer src(dtype, b, 0);
      ReduceInto(dtype, op, dst.data(), src.data(), kCount);
      for (size_t i = 0; i < kCount; ++i) {
        const bool any_nan = i % 3 == 0 || i % 5 == 0;
        if (any_nan) {
          EXPECT_TRUE(IsNaNBits(dtype, dst.Get(i))) << "element " << i;
        } else {
          const double want = op == ReduceOp::kMin
                                  ? std::min(a_values[i], b_values[i])
                                  : std::max(a_values[i], b_values[i]);
          EXPECT_EQ(dst.Get(i), encode(want)) << "element " << i;
        }
      }
    }
  }
}

// +0 and -0 compare equal; on ties MIN and MAX keep dst's value (the same
// rule as the reference above), on every path, so all ranks agree bit for
// bit. 16 elements so that the vector loops handle them.
TEST(ReduceIntoTest, MinMaxOfSignedZerosKeepDst) {
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const size_t bits = DTypeSize(dtype) * 8;
    const uint64_t minus_zero = uint64_t{1} << (bits - 1);
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<uint64_t> a(16);
      std::vector<uint64_t> b(16);
      for (size_t i = 0; i < 16; ++i) {
        a[i] = i % 2 == 0 ? minus_zero : 0;
        b[i] = i % 2 == 0 ? 0 : minus_zero;
      }
      Buffer dst(dtype, a, 0);
      Buffer src(dtype, b, 0);
      ReduceInto(dtype, op, dst.data(), src.data(), a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(dst.Get(i), a[i])
            << DTypeName(dtype) << " " << ReduceOpName(op) << " " << i;
      }
    }
  }
}

TEST(ReduceIntoTest, FloatMinMaxByHand) {
  const float inf = std::numeric_limits<float>::infinity();
  float dst[] = {1.0f, -inf, 3.5f, -2.0f, inf, 0.25f, 7.0f, -8.0f, 9.0f};
  const float src[] = {2.0f,  0.0f, -3.5f,
                       -1.0f, 5.0f, 0.5f,
                       7.0f,  8.0f, std::numeric_limits<float>::quiet_NaN()};
  float max[9];
  std::memcpy(max, dst, sizeof(dst));
  ReduceInto(DType::kFloat32, ReduceOp::kMin, dst, src, 9);
  ReduceInto(DType::kFloat32, ReduceOp::kMax, max, src, 9);
  const float want_min[] = {1.0f, -inf, -3.5f, -2.0f, 5.0f, 0.25f, 7.0f, -8.0f};
  const float want_max[] = {2.0f, 0.0f, 3.5f, -1.0f, inf, 0.5f, 7.0f, 8.0f};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(dst[i], want_min[i]) << i;
    EXPECT_EQ(max[i], want_max[i]) << i;
  }
  EXPECT_TRUE(std::isnan(dst[8]));
  EXPECT_TRUE(std::isnan(max[8]));
}

// ---------------------------------------------------------------------------
// FinalizeAvg.

Expected RefDivide(DType dtype, uint64_t a, int divisor) {
  switch (dtype) {
    case DType::kInt32:
    case DType::kInt64: {
      // Truncation toward zero done on magnitudes, without relying on `/`
      // for negative operands.
      const bool is32 = dtype == DType::kInt32;
      const int64_t value =
          is32 ? static_cast<int32_t>(a) : static_cast<int64_t>(a);
      const bool negative = (value < 0) != (divisor < 0);
      const uint64_t magnitude =
          value < 0 ? uint64_t{0} - static_cast<uint64_t>(value)
                    : static_cast<uint64_t>(value);
      const uint64_t divisor_magnitude = static_cast<uint64_t>(
          divisor < 0 ? -static_cast<int64_t>(divisor) : divisor);
      const uint64_t q = magnitude / divisor_magnitude;
      const uint64_t result = negative ? uint64_t{0} - q : q;
      return {is32 ? static_cast<uint32_t>(result) : result, false};
    }
    case DType::kFloat32: {
      const double r =
          static_cast<double>(FloatFromBits(static_cast<uint32_t>(a))) /
          divisor;
      return {Bits(static_cast<float>(r)), std::isnan(r)};
    }
    case DType::kFloat64: {
      const double r = DoubleFromBits(a) / divisor;
      return {Bits(r), std::isnan(r)};
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const Format16 f = dtype == DType::kFloat16 ? kHalf : kBF16;
      const double r = RefDecode(f, static_cast<uint32_t>(a)) / divisor;
      return {RefRound(f, r), std::isnan(r)};
    }
  }
  return {0, false};
}

class FinalizeAvgTest : public ::testing::TestWithParam<DType> {};

TEST_P(FinalizeAvgTest, MatchesReference) {
  const DType dtype = GetParam();
  std::mt19937_64 rng(777 + static_cast<int>(dtype));
  for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{1000003}}) {
    const std::vector<uint64_t> a = RandomElements(dtype, size, rng);
    for (int divisor : {1, 2, 3, 7, 1000, -1, -3}) {
      for (size_t offset : {0, 1}) {
        SCOPED_TRACE(testing::Message() << "size " << size << " divisor "
                                        << divisor << " offset " << offset);
        std::vector<Expected> expected(size);
        for (size_t i = 0; i < size; ++i) {
          expected[i] = RefDivide(dtype, a[i], divisor);
        }
        Buffer buffer(dtype, a, offset);
        FinalizeAvg(dtype, buffer.data(), size, divisor);
        EXPECT_EQ(CountMismatches(dtype, expected, buffer, a, a), 0u);
        EXPECT_TRUE(buffer.GuardsIntact());
      }
    }
  }
}

std::string DTypeParamName(const ::testing::TestParamInfo<DType>& info) {
  return std::string(DTypeName(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, FinalizeAvgTest,
                         ::testing::ValuesIn(kAllDTypes), DTypeParamName);

TEST(FinalizeAvgTest, IntegersTruncateTowardZero) {
  int32_t v32[] = {7, -7, 6, -6, 1, -1, 0, INT32_MIN, INT32_MAX};
  FinalizeAvg(DType::kInt32, v32, 9, 4);
  const int32_t want32[] = {1, -1, 1, -1, 0, 0, 0, -536870912, 536870911};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(v32[i], want32[i]) << i;

  int64_t v64[] = {-10, 10, -11, INT64_MIN, INT64_MAX};
  FinalizeAvg(DType::kInt64, v64, 5, 3);
  const int64_t want64[] = {-3, 3, -3, INT64_MIN / 3, INT64_MAX / 3};
  EXPECT_EQ(want64[3], -3074457345618258602);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(v64[i], want64[i]) << i;

  // The most negative value over -1 wraps instead of trapping.
  int32_t min32[] = {INT32_MIN, 5};
  FinalizeAvg(DType::kInt32, min32, 2, -1);
  EXPECT_EQ(min32[0], INT32_MIN);
  EXPECT_EQ(min32[1], -5);
}

TEST(FinalizeAvgTest, FloatsByHand) {
  float f[] = {1.0f, -3.0f, 0.0f};
  FinalizeAvg(DType::kFloat32, f, 3, 3);
  EXPECT_EQ(f[0], 1.0f / 3.0f);
  EXPECT_EQ(f[1], -1.0f);
  EXPECT_EQ(f[2], 0.0f);

  double d[] = {1.0, 10.0};
  FinalizeAvg(DType::kFloat64, d, 2, 4);
  EXPECT_EQ(d[0], 0.25);
  EXPECT_EQ(d[1], 2.5);

  uint16_t h[] = {0x3C00, 0x4200};  // 1.0, 3.0
  FinalizeAvg(DType::kFloat16, h, 2, 3);
  EXPECT_EQ(h[0], 0x3555);  // 1/3 rounds to 0x3555 (0.33325)
  EXPECT_EQ(h[1], 0x3C00);

  uint16_t bf[] = {0x3F80, 0x4040};  // 1.0, 3.0
  FinalizeAvg(DType::kBFloat16, bf, 2, 3);
  EXPECT_EQ(bf[0], 0x3EAB);  // 1/3 = 0x3EAAAAAB as float -> 0x3EAB
  EXPECT_EQ(bf[1], 0x3F80);
}

TEST(FinalizeAvgTest, DivisorZeroLeavesBufferUntouched) {
  int32_t v[] = {5, -5};
  FinalizeAvg(DType::kInt32, v, 2, 0);
  EXPECT_EQ(v[0], 5);
  EXPECT_EQ(v[1], -5);
  float f[] = {2.0f};
  FinalizeAvg(DType::kFloat32, f, 1, 0);
  EXPECT_EQ(f[0], 2.0f);
}

// ---------------------------------------------------------------------------
// Conversions.

float Pow2(int exponent) { return std::ldexp(1.0f, exponent); }

TEST(HalfConversionTest, KnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(0.1f), 0x2E66);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  // Just below the halfway point to 65536 rounds down; the halfway point
  // (65520) rounds to even, which is infinity.
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xFC00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7C00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xFC00);
  // Subnormals.
  EXPECT_EQ(FloatToHalf(Pow2(-14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalf(Pow2(-24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(-Pow2(-24)), 0x8001);
  EXPECT_EQ(FloatToHalf(Pow2(-14) - Pow2(-24)), 0x03FF);
  EXPECT_EQ(FloatToHalf(Pow2(-25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(FloatToHalf(-Pow2(-25)), 0x8000);
  EXPECT_EQ(FloatToHalf(3 * Pow2(-25)), 0x0002);  // tie -> even (2)
  EXPECT_EQ(FloatToHalf(5 * Pow2(-25)), 0x0002);  // tie -> even (2)
  EXPECT_EQ(FloatToHalf(Pow2(-25) * 1.0001f), 0x0001);
  EXPECT_EQ(FloatToHalf(Pow2(-30)), 0x0000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  // Subnormal rounding up into the smallest normal.
  EXPECT_EQ(FloatToHalf(Pow2(-14) - Pow2(-26)), 0x0400);
  // Ties between normals: 1 + 2^-11 is halfway between 0x3C00 and 0x3C01.
  EXPECT_EQ(FloatToHalf(1.0f + Pow2(-11)), 0x3C00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * Pow2(-11)), 0x3C02);
  EXPECT_EQ(FloatToHalf(1.0f + Pow2(-11) + Pow2(-20)), 0x3C01);
  // Rounding up across a binade: 2 - 2^-12 rounds to 2.0.
  EXPECT_EQ(FloatToHalf(2.0f - Pow2(-12)), 0x4000);

  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), Pow2(-24));
  EXPECT_EQ(HalfToFloat(0x03FF), Pow2(-14) - Pow2(-24));
  EXPECT_EQ(HalfToFloat(0x0400), Pow2(-14));
  EXPECT_EQ(HalfToFloat(0x2E66), 0.0999755859375f);
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bits(HalfToFloat(0x8000)), 0x80000000u);
}

TEST(HalfConversionTest, NaNStaysNaN) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(RefIsNaN(kHalf, FloatToHalf(qnan)));
  EXPECT_TRUE(RefIsNaN(kHalf, FloatToHalf(-qnan)));
  EXPECT_NE(FloatToHalf(-qnan) & 0x8000, 0);
  // Payload only in the bits that are dropped: must not become infinity.
  EXPECT_TRUE(RefIsNaN(kHalf, FloatToHalf(FloatFromBits(0x7F800001u))));
  EXPECT_TRUE(RefIsNaN(kHalf, FloatToHalf(FloatFromBits(0xFF800001u))));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7C01)));  // signalling
  // Signalling NaNs come out quiet, as the F16C instructions make them.
  EXPECT_NE(Bits(HalfToFloat(0x7C01)) & 0x00400000u, 0u);
  EXPECT_NE(FloatToHalf(FloatFromBits(0x7F800001u)) & 0x0200, 0);
  EXPECT_TRUE(std::isnan(HalfToFloat(0xFFFF)));
}

TEST(HalfConversionTest, AllPatternsRoundTrip) {
  int checked = 0;
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = HalfToFloat(bits);
    if (RefIsNaN(kHalf, bits)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_TRUE(RefIsNaN(kHalf, FloatToHalf(f))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), RefDecode(kHalf, bits)) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    ASSERT_EQ(FloatToHalf(f), bits) << std::hex << h;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 1023);
}

// For every pair of neighbouring finite halves: their midpoint rounds to
// the even one, and one float ulp either side of it rounds to the nearer.
TEST(HalfConversionTest, AllMidpoints) {
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    const float lo = HalfToFloat(static_cast<uint16_t>(h));
    const float hi = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = (lo + hi) / 2;  // exact: needs 12 significant bits
    const uint16_t even = (h & 1) == 0 ? h : h + 1;
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t sign_bit = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(FloatToHalf(sign * mid), even | sign_bit) << std::hex << h;
      ASSERT_EQ(FloatToHalf(sign * std::nextafter(mid, 0.0f)), h | sign_bit)
          << std::hex << h;
      ASSERT_EQ(FloatToHalf(sign * std::nextafter(mid, 1e30f)),
                (h + 1) | sign_bit)
          << std::hex << h;
    }
  }
}

TEST(HalfConversionTest, RandomFloatsMatchReference) {
  std::mt19937 rng(12345);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t r = rng();
    // Exponents from well below the subnormal range to above the largest
    // half, random sign and mantissa.
    const uint32_t exponent = 127 - 28 + (r >> 24) % 47;
    const uint32_t bits =
        (r & 0x80000000u) | (exponent << 23) | (rng() & 0x7fffffu);
    const float f = FloatFromBits(bits);
    ASSERT_EQ(FloatToHalf(f), RefRound(kHalf, f)) << std::hex << bits;
  }
}

TEST(BFloat16ConversionTest, KnownValues) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  // Ties to even: 0x3F808000 is halfway between 0x3F80 and 0x3F81.
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x3F808000u)), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x3F818000u)), 0x3F82);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0xBF818000u)), 0xBF82);
  // Carry across the binade and into infinity.
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x3FFFFFFFu)), 0x4000);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x7F7F8000u)), 0x7F80);  // tie, odd
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xFF80);
  // Subnormals.
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x00008000u)), 0x0000);  // tie
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x00018000u)), 0x0002);  // tie
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x00010001u)), 0x0001);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x007FFFFFu)), 0x0080);  // -> normal

  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0x4049), 3.140625f);
  EXPECT_EQ(BFloat16ToFloat(0x0001), FloatFromBits(0x00010000u));
  EXPECT_EQ(BFloat16ToFloat(0xFF80), -std::numeric_limits<float>::infinity());
}

TEST(BFloat16ConversionTest, NaNStaysNaN) {
  // A signalling NaN with its payload only in the low 16 bits: truncation
  // or plain rounding would give infinity.
  EXPECT_TRUE(RefIsNaN(kBF16, FloatToBFloat16(FloatFromBits(0x7F800001u))));
  EXPECT_TRUE(RefIsNaN(kBF16, FloatToBFloat16(FloatFromBits(0xFF800001u))));
  EXPECT_NE(FloatToBFloat16(FloatFromBits(0xFF800001u)) & 0x8000, 0);
  // All-ones payload: rounding up would carry into the sign.
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x7FFFFFFFu)) & 0x8000, 0);
  EXPECT_TRUE(RefIsNaN(kBF16, FloatToBFloat16(FloatFromBits(0x7FFFFFFFu))));
  EXPECT_TRUE(RefIsNaN(
      kBF16, FloatToBFloat16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7FC0)));
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7F81)));
}

TEST(BFloat16ConversionTest, AllPatternsRoundTrip) {
  int checked = 0;
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = BFloat16ToFloat(bits);
    if (RefIsNaN(kBF16, bits)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_TRUE(RefIsNaN(kBF16, FloatToBFloat16(f))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), RefDecode(kBF16, bits)) << std::hex << h;
    ASSERT_EQ(FloatToBFloat16(f), bits) << std::hex << h;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 127);
}

TEST(BFloat16ConversionTest, RandomFloatsMatchReference) {
  std::mt19937 rng(54321);
  for (int i = 0; i < 4000000; ++i) {
    uint32_t bits = rng();
    if ((bits & 0x7f800000u) == 0x7f800000u) continue;  // NaN/inf: above
    if (i % 8 == 0) bits &= 0x807fffffu;  // make a float subnormal
    const float f = FloatFromBits(bits);
    ASSERT_EQ(FloatToBFloat16(f), RefRound(kBF16, f)) << std::hex << bits;
  }
}

// The reference helpers themselves, against values worked out by hand, so a
// bug there cannot hide one in the library.
TEST(ReferenceTest, RefRoundAndDecodeByHand) {
  EXPECT_EQ(RefRound(kHalf, 1.0), 0x3C00);
  EXPECT_EQ(RefRound(kHalf, 65504.0), 0x7BFF);
  EXPECT_EQ(RefRound(kHalf, 65520.0), 0x7C00);
  EXPECT_EQ(RefRound(kHalf, std::ldexp(1.0, -24)), 0x0001);
  EXPECT_EQ(RefRound(kHalf, std::ldexp(1.0, -25)), 0x0000);
  EXPECT_EQ(RefRound(kHalf, 0.1), 0x2E66);
  EXPECT_EQ(RefRound(kHalf, -2.0), 0xC000);
  EXPECT_EQ(RefRound(kBF16, 1.0), 0x3F80);
  EXPECT_EQ(RefRound(kBF16, 1.0 + std::ldexp(1.0, -8)), 0x3F80);
  EXPECT_EQ(RefRound(kBF16, 1.0 + 3 * std::ldexp(1.0, -8)), 0x3F82);
  EXPECT_EQ(RefDecode(kHalf, 0x3555), 0.333251953125);
  EXPECT_EQ(RefDecode(kBF16, 0x0001), std::ldexp(1.0, -133));
  EXPECT_TRUE(std::isnan(RefDecode(kHalf, 0x7C01)));
  EXPECT_TRUE(std::isinf(RefDecode(kBF16, 0xFF80)));
}

}  // namespace
}  // namespace halka

namespace halka {
namespace {

// The 8- and 16-bit integers wrap like the wider ones (two's complement),
// PROD included: 16-bit products do not overflow a promoted int.
TEST(ReduceIntoSmallIntegers, WrapAroundTheirWidth) {
  int8_t a8[] = {100, -128, 7, 127};
  const int8_t b8[] = {100, -1, -8, 1};
  ReduceInto(DType::kInt8, ReduceOp::kSum, a8, b8, 4);
  EXPECT_EQ(a8[0], -56);   // 200 - 256
  EXPECT_EQ(a8[1], 127);   // -129 + 256
  EXPECT_EQ(a8[2], -1);
  EXPECT_EQ(a8[3], -128);  // 128 - 256
  uint8_t u[] = {200, 16, 3, 0};
  const uint8_t v[] = {100, 16, 5, 255};
  ReduceInto(DType::kUInt8, ReduceOp::kProd, u, v, 4);
  EXPECT_EQ(u[0], static_cast<uint8_t>(20000 % 256));
  EXPECT_EQ(u[1], 0);  // 256
  EXPECT_EQ(u[2], 15);
  EXPECT_EQ(u[3], 0);
  int16_t p[] = {-32768, 200, 181};
  const int16_t q[] = {-1, 200, 181};
  ReduceInto(DType::kInt16, ReduceOp::kProd, p, q, 3);
  EXPECT_EQ(p[0], -32768);  // 32768 wraps
  EXPECT_EQ(p[1], static_cast<int16_t>(40000 - 65536));
  EXPECT_EQ(p[2], static_cast<int16_t>(32761));
  int8_t m[] = {-5, 9};
  const int8_t n[] = {3, -9};
  ReduceInto(DType::kInt8, ReduceOp::kMin, m, n, 2);
  EXPECT_EQ(m[0], -5);
  EXPECT_EQ(m[1], -9);
}

// AVG's divisor is a world size, which need not fit an 8-bit element.
TEST(ReduceIntoSmallIntegers, AvgDividesByWorldsWiderThanTheType) {
  int8_t a[] = {100, -100, -128};
  FinalizeAvg(DType::kInt8, a, 2, 300);
  EXPECT_EQ(a[0], 0);
  EXPECT_EQ(a[1], 0);
  FinalizeAvg(DType::kInt8, a + 2, 1, -1);
  EXPECT_EQ(a[2], -128);  // 128 wraps, as SUM would
  uint8_t u[] = {255, 7};
  FinalizeAvg(DType::kUInt8, u, 2, 2);
  EXPECT_EQ(u[0], 127);
  EXPECT_EQ(u[1], 3);
  int16_t s[] = {-30001};
  FinalizeAvg(DType::kInt16, s, 1, 1000);
  EXPECT_EQ(s[0], -30);  // truncates toward zero
}

// bool: SUM and MAX are or, PROD and MIN and; any non-zero byte is true
// and every result is 0 or 1.
TEST(ReduceIntoBool, OrAndAndOnBytes) {
  const uint8_t src[] = {0, 1, 0, 7};
  struct Case {
    ReduceOp op;
    uint8_t dst[4];
    uint8_t want[4];
  };
  const Case cases[] = {
      {ReduceOp::kSum, {0, 0, 2, 1}, {0, 1, 1, 1}},   // or
      {ReduceOp::kMax, {0, 0, 2, 1}, {0, 1, 1, 1}},   // or
      {ReduceOp::kProd, {0, 3, 2, 1}, {0, 1, 0, 1}},  // and
      {ReduceOp::kMin, {0, 3, 2, 1}, {0, 1, 0, 1}},   // and
  };
  for (Case c : cases) {
    ReduceInto(DType::kBool, c.op, c.dst, src, 4);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(c.dst[i], c.want[i]) << ReduceOpName(c.op) << " element " << i;
    }
  }
}

}  // namespace
}  // namespace halka
