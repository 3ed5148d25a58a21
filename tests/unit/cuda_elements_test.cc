// The host/device element logic of the CUDA reducers
// (core/cuda/cuda_elements.h), run on the CPU: every GPU thread of a
// launch in turn, against the CPU reducer (core/reduce.h). Needs no
// CUDA at all, so CI covers the split of a call into head, vectors and tail,
// the byte assembly of misaligned elements, and the division by a constant
// that finalize_avg uses, bit for bit.
#include "core/cuda/cuda_elements.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <limits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/payload.h"
#include "core/reduce.h"

namespace halka {
namespace {

// memcpy and memcmp take no null pointer, even for 0 bytes: an empty
// vector's data() may be one.
const unsigned char* P(const std::vector<unsigned char>& v) {
  static const unsigned char kNone = 0;
  return v.empty() ? &kNone : v.data();
}

using cuda_elements::BytewiseBody;
using cuda_elements::ByteOf;
using cuda_elements::DivideByConstant;
using cuda_elements::ElementwiseBody;
using cuda_elements::LoadBytes;
using cuda_elements::MakePlan;
using cuda_elements::Plan;
using cuda_elements::StoreBytes;

TEST(CudaElements, ByteOfPicksOneByteZeroExtended) {
  const uint32_t word = 0xa1b2c3d4u;
  EXPECT_EQ(ByteOf(word, 0), 0xd4u);
  EXPECT_EQ(ByteOf(word, 1), 0xc3u);
  EXPECT_EQ(ByteOf(word, 2), 0xb2u);
  EXPECT_EQ(ByteOf(word, 3), 0xa1u);
}

// Little-endian bytes at every misalignment, neighbours untouched.
template <typename Storage>
void CheckBytesRoundTrip() {
  std::mt19937_64 rng(sizeof(Storage));
  for (size_t offset = 0; offset < 16; ++offset) {
    unsigned char buffer[32];
    std::memset(buffer, 0xa5, sizeof(buffer));
    uint64_t raw = rng();
    Storage value;
    std::memcpy(&value, &raw, sizeof(value));
    StoreBytes<Storage>(buffer + offset, value);
    for (size_t i = 0; i < sizeof(buffer); ++i) {
      if (i >= offset && i < offset + sizeof(Storage)) {
        EXPECT_EQ(buffer[i], static_cast<unsigned char>(raw >> (8 * (i - offset))))
            << "byte " << i << " of a " << sizeof(Storage)
            << "-byte element at offset " << offset;
      } else {
        EXPECT_EQ(buffer[i], 0xa5) << "neighbour byte " << i << " changed";
      }
    }
    const Storage back = LoadBytes<Storage>(buffer + offset);
    EXPECT_EQ(std::memcmp(&back, &value, sizeof(value)), 0);
  }
}

TEST(CudaElements, BytesRoundTripAtEveryOffset) {
  CheckBytesRoundTrip<uint8_t>();  // int8, uint8, bool: one byte exactly
  CheckBytesRoundTrip<uint16_t>();
  CheckBytesRoundTrip<uint32_t>();
  CheckBytesRoundTrip<float>();
  CheckBytesRoundTrip<uint64_t>();
  CheckBytesRoundTrip<double>();
}

TEST(CudaElements, PlanCoversEveryElementOnce) {
  // uint16_t: 8 lanes per vector.
  Plan p = MakePlan<uint16_t>(0x1000, 0x2000, 100);
  EXPECT_FALSE(p.bytewise);
  EXPECT_EQ(p.head, 0u);
  EXPECT_EQ(p.nvec, 12u);  // 96 elements, tail of 4
  EXPECT_EQ(p.work, 12u);
  p = MakePlan<uint16_t>(0x1002, 0x2002, 100);  // 7 elements to alignment
  EXPECT_EQ(p.head, 7u);
  EXPECT_EQ(p.nvec, 11u);
  p = MakePlan<uint16_t>(0x1002, 0x2004, 100);  // never both aligned
  EXPECT_EQ(p.head, 100u);
  EXPECT_EQ(p.nvec, 0u);
  p = MakePlan<uint16_t>(0x1001, 0x2003, 100);
  EXPECT_TRUE(p.bytewise);
  EXPECT_EQ(p.work, 100u);
  p = MakePlan<double>(0x1008, 0x2008, 1);  // head longer than the call
  EXPECT_EQ(p.head, 1u);
  EXPECT_EQ(p.nvec, 0u);
}

// Element functions for the test: one element through the CPU reducer
// itself (ReduceInto, or FinalizeAvg when kDivide), so that whatever the
// bodies do with indices and bytes is compared with the CPU reducer over
// the whole buffer.
template <typename S, bool kDivide>
struct CpuFn {
  using Storage = S;
  static constexpr bool kHasSrc = !kDivide;
  DType dtype;
  ReduceOp op;
  int divisor;
  Storage operator()(Storage d, Storage s) const {
    if constexpr (kDivide) {
      FinalizeAvg(dtype, &d, 1, divisor);
    } else {
      ReduceInto(dtype, op, &d, &s, 1);
    }
    return d;
  }
};

// Runs a launch of `threads` threads one after the other, as the kernels
// would (LaunchElementwise's choice between the two bodies).
template <typename Fn>
void RunLaunch(unsigned char* dst, const unsigned char* src, size_t count,
               Fn fn, size_t threads) {
  using Storage = typename Fn::Storage;
  const Plan plan = MakePlan<Storage>(reinterpret_cast<uintptr_t>(dst),
                                      reinterpret_cast<uintptr_t>(src), count);
  for (size_t t = 0; t < threads; ++t) {
    if (plan.bytewise) {
      BytewiseBody(dst, src, count, fn, t, threads);
    } else {
      ElementwiseBody(reinterpret_cast<Storage*>(dst),
                      reinterpret_cast<const Storage*>(src), plan.head,
                      plan.nvec, count, fn, t, threads);
    }
  }
}

std::vector<unsigned char> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> out(n);
  for (auto& b : out) b = static_cast<unsigned char>(rng());
  return out;
}

template <typename S>
void CheckLaunches(DType dtype) {
  const size_t size = sizeof(S);
  // 2 threads exercise the unrolled loop (4 vectors per thread) with small
  // counts; 256 a block; 5 a stride that is not a power of two.
  for (size_t threads : {size_t{1}, size_t{2}, size_t{5}, size_t{256}}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{33},
                         size_t{515}}) {
      for (size_t dst_off = 0; dst_off < 17; dst_off += 1) {
        for (size_t src_off : {size_t{0}, size_t{1}, size_t{3}, dst_off}) {
          SCOPED_TRACE(std::string(DTypeName(dtype)) + " threads=" +
                       std::to_string(threads) + " count=" +
                       std::to_string(count) + " dst+" +
                       std::to_string(dst_off) + " src+" +
                       std::to_string(src_off));
          const size_t bytes = count * size;
          // 16-byte aligned storage, the operands at the offsets.
          std::vector<cuda_elements::Vec16> dst_mem(bytes / 16 + 4);
          std::vector<cuda_elements::Vec16> src_mem(bytes / 16 + 4);
          auto* dst = reinterpret_cast<unsigned char*>(dst_mem.data()) + dst_off;
          auto* src = reinterpret_cast<unsigned char*>(src_mem.data()) + src_off;
          const auto a = RandomBytes(bytes, count * 31 + dst_off);
          const auto b = RandomBytes(bytes, count * 37 + src_off + 1);
          std::memcpy(dst, P(a), bytes);
          std::memcpy(src, P(b), bytes);
          std::vector<unsigned char> expected = a;
          ReduceInto(dtype, ReduceOp::kSum, expected.data(), b.data(), count);
          RunLaunch(dst, src, count, CpuFn<S, false>{dtype, ReduceOp::kSum, 0},
                    threads);
          EXPECT_EQ(std::memcmp(dst, P(expected), bytes), 0);
          // src untouched, and the byte past dst too.
          EXPECT_EQ(std::memcmp(src, P(b), bytes), 0);
          EXPECT_EQ(dst[bytes], 0);

          // FinalizeAvg's launch shape (no src).
          std::memcpy(dst, P(a), bytes);
          expected = a;
          FinalizeAvg(dtype, expected.data(), count, 3);
          RunLaunch(dst, dst, count, CpuFn<S, true>{dtype, ReduceOp::kSum, 3}, threads);
          EXPECT_EQ(std::memcmp(dst, P(expected), bytes), 0);
        }
      }
    }
  }
}

TEST(CudaElements, LaunchesMatchTheCpuReducerAtEveryAlignment) {
  CheckLaunches<uint16_t>(DType::kFloat16);
  CheckLaunches<uint16_t>(DType::kBFloat16);
  CheckLaunches<uint32_t>(DType::kInt32);
  CheckLaunches<uint64_t>(DType::kInt64);
  CheckLaunches<uint8_t>(DType::kInt8);
  CheckLaunches<uint8_t>(DType::kUInt8);
  CheckLaunches<uint16_t>(DType::kInt16);
}

// ---------------------------------------------------------------------------
// DivideByConstant against the CPU's `/` (FinalizeAvg).

const int kDivisors[] = {2,      3,       5,       7,        10,
                         -1,     -3,      1000003, 16777217, INT_MAX,
                         INT_MIN, 12345678};

bool SameOrBothNaN(double want, double got) {
  if (std::isnan(want)) return std::isnan(got);
  return std::memcmp(&want, &got, sizeof(double)) == 0;
}

// Every float16 / bfloat16 value, as finalize_avg computes it: widen, divide
// in float, round once.
TEST(CudaElements, DivideMatchesTheCpuForEveryHalfValue) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (int divisor : kDivisors) {
      const auto divide =
          DivideByConstant<float>::Make(static_cast<float>(divisor));
      size_t mismatches = 0;
      for (uint32_t bits = 0; bits < 0x10000; ++bits) {
        uint16_t want = static_cast<uint16_t>(bits);
        FinalizeAvg(dtype, &want, 1, divisor);
        const float x = dtype == DType::kFloat16
                            ? HalfToFloat(static_cast<uint16_t>(bits))
                            : BFloat16ToFloat(static_cast<uint16_t>(bits));
        const float q = divide(x);
        const uint16_t got =
            dtype == DType::kFloat16 ? FloatToHalf(q) : FloatToBFloat16(q);
        const float wf = dtype == DType::kFloat16 ? HalfToFloat(want)
                                                  : BFloat16ToFloat(want);
        if (got != want && !(std::isnan(wf) && std::isnan(q))) {
          if (mismatches++ < 3) {
            ADD_FAILURE() << DTypeName(dtype) << " 0x" << std::hex << bits
                          << " / " << std::dec << divisor << ": cpu 0x"
                          << std::hex << want << ", divide 0x" << got;
          }
        }
      }
      EXPECT_EQ(mismatches, 0u) << DTypeName(dtype) << " / " << divisor;
    }
  }
}

// Edges (zeros, subnormals, the tiny-operand boundary, the largest values,
// infinities, NaN) and random bit patterns of float32 and float64.
template <typename F, typename Bits>
void CheckDivide(size_t random_count) {
  std::vector<F> values = {F(0), -F(0), F(1), F(-1), F(3),
                           std::numeric_limits<F>::denorm_min(),
                           std::numeric_limits<F>::min(),
                           std::numeric_limits<F>::max(),
                           -std::numeric_limits<F>::max(),
                           std::numeric_limits<F>::infinity(),
                           -std::numeric_limits<F>::infinity(),
                           std::numeric_limits<F>::quiet_NaN(),
                           DivideByConstant<F>::kTiny,
                           std::nextafter(DivideByConstant<F>::kTiny, F(0)),
                           std::nextafter(DivideByConstant<F>::kTiny, F(1))};
  std::mt19937_64 rng(sizeof(F));
  for (size_t i = 0; i < random_count; ++i) {
    const Bits bits = static_cast<Bits>(rng());
    F x;
    std::memcpy(&x, &bits, sizeof(x));
    values.push_back(x);
    // Values near 1 and near the tiny boundary, where rounding is dense.
    values.push_back(std::ldexp(F(1) + F(i) / F(random_count), -(int)(i % 64)));
  }
  for (int divisor : kDivisors) {
    const F d = static_cast<F>(divisor);
    const auto divide = DivideByConstant<F>::Make(d);
    size_t mismatches = 0;
    for (F x : values) {
      const F want = x / d;
      const F got = divide(x);
      if (!SameOrBothNaN(want, got)) {
        if (mismatches++ < 3) {
          ADD_FAILURE() << std::hexfloat << x << " / " << divisor << ": cpu "
                        << want << ", divide " << got;
        }
      }
    }
    EXPECT_EQ(mismatches, 0u) << sizeof(F) << "-byte floats / " << divisor;
  }
}

TEST(CudaElements, DivideMatchesTheCpuForFloat32AndFloat64) {
  CheckDivide<float, uint32_t>(200000);
  CheckDivide<double, uint64_t>(200000);
}

// The device buffer gathers a received frame into pinned memory slice by
// slice (DeviceOpBuffer::Apply): any byte range of a payload split at odd
// places must come out as the same bytes of the payload in one piece.
TEST(DeviceStaging, CopyPayloadBytesAcrossPieces) {
  std::vector<uint8_t> payload(1000);
  for (size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<uint8_t>(i * 7 + 3);
  }
  InFrame frame;
  const size_t cuts[] = {0, 1, 2, 255, 256, 700, 999, 1000};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    frame.pieces.emplace_back(payload.data() + cuts[i], cuts[i + 1] - cuts[i]);
  }
  for (size_t from : {size_t{0}, size_t{1}, size_t{254}, size_t{600}}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{256}, size_t{399}}) {
      if (from + n > payload.size()) continue;
      std::vector<uint8_t> out(n + 1, 0xee);
      CopyPayloadBytes(frame, from, n, out.data());
      EXPECT_TRUE(std::equal(out.begin(), out.begin() + n,
                             payload.begin() + from))
          << "from " << from << " n " << n;
      EXPECT_EQ(out[n], 0xee) << "wrote past n";
    }
  }
  // A payload shorter than asked: copies what there is, no overrun.
  std::vector<uint8_t> out(40, 0xee);
  CopyPayloadBytes(frame, 990, 20, out.data());
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 10, payload.begin() + 990));
  EXPECT_EQ(out[10], 0xee);
}

}  // namespace
}  // namespace halka
