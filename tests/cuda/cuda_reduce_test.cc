// The CUDA reducers (core/cuda/cuda_reduce.h) against the CPU ones
// (core/reduce.h), bit for bit.
//
// Every test that needs a GPU first asks CudaDeviceCount() and skips with
// "no CUDA device: <why>" when there is none (or halka was built without
// CUDA), so this binary passes on machines without a GPU; the
// CudaReduceNoDeviceTest cases run everywhere and check what the API says
// there. tests/cuda/run_on_gpu.sh runs it on a GPU machine.
//
// Exactness. Random data (finite floats only) must give identical bytes for
// every dtype x op x size x alignment, floats included: each element gets one
// IEEE operation in the same precision on both sides, float16/bfloat16 are
// rounded once to nearest even. The one legitimate difference is the payload
// of a NaN result (x86 returns the first NaN operand quieted, the GPU its
// canonical NaN; the contract only promises NaN propagation), so the
// special-value tests, whose inputs include NaN and infinities, accept any
// NaN where the CPU produced a NaN and compare every other result exactly.
//
// HALKA_CUDA_TEST_MAX_COUNT=N caps the element counts (for slow runs under
// compute-sanitizer).
#include "core/cuda/cuda_reduce.h"

#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/reduce.h"

namespace halka {
namespace {

using Bytes = std::vector<unsigned char>;

// ---------------------------------------------------------------------------
// Skipping.

// Empty when a device is there, else why not.
std::string NoDeviceReason() {
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) return "";
  std::string message(count.status().message());
  // The CUDA build already says "no CUDA device: ..."; the stub does not.
  const std::string prefix = "no CUDA device: ";
  if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
  return message.empty() ? "unknown" : message;
}

#define SKIP_WITHOUT_CUDA_DEVICE()                                   \
  do {                                                               \
    const std::string reason_ = NoDeviceReason();                    \
    if (!reason_.empty()) GTEST_SKIP() << "no CUDA device: " << reason_; \
  } while (0)

size_t MaxCount() {
  const char* env = std::getenv("HALKA_CUDA_TEST_MAX_COUNT");
  if (env == nullptr || *env == '\0') return std::numeric_limits<size_t>::max();
  return std::strtoull(env, nullptr, 10);
}

// 2^24 + 43 elements exceeds four vectors per thread of a full H200 grid
// (132 SMs x 2048 threads), so the unrolled main loop runs; 1000003 does not.
constexpr size_t kSizes[] = {0, 1, 7, 1000003, (size_t{1} << 24) + 43};
constexpr size_t kLargest = (size_t{1} << 24) + 43;

// ---------------------------------------------------------------------------
// Data.

template <typename T>
T Load(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}
template <typename T>
void Store(unsigned char* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

bool IsNaNBits(DType dtype, const unsigned char* p) {
  switch (dtype) {
    case DType::kFloat32:
      return (Load<uint32_t>(p) & 0x7fffffffu) > 0x7f800000u;
    case DType::kFloat64:
      return (Load<uint64_t>(p) & 0x7fffffffffffffffull) >
             0x7ff0000000000000ull;
    case DType::kFloat16:
      return (Load<uint16_t>(p) & 0x7fffu) > 0x7c00u;
    case DType::kBFloat16:
      return (Load<uint16_t>(p) & 0x7fffu) > 0x7f80u;
    default:
      return false;
  }
}

// One element from a float value, in dtype's encoding (integers truncate).
void StoreValue(DType dtype, unsigned char* p, double value) {
  switch (dtype) {
    case DType::kFloat32:
      Store<float>(p, static_cast<float>(value));
      return;
    case DType::kFloat64:
      Store<double>(p, value);
      return;
    case DType::kFloat16:
      Store<uint16_t>(p, FloatToHalf(static_cast<float>(value)));
      return;
    case DType::kBFloat16:
      Store<uint16_t>(p, FloatToBFloat16(static_cast<float>(value)));
      return;
    case DType::kInt32:
      Store<int32_t>(p, static_cast<int32_t>(value));
      return;
    case DType::kInt64:
      Store<int64_t>(p, static_cast<int64_t>(value));
      return;
  }
}

// Random elements: a mix of arbitrary bit patterns (made finite for floats:
// an all-ones exponent loses its lowest bit), small values whose sums and
// products round, and edge values (zeros of both signs, the smallest
// subnormal, the largest finite value, integer extremes).
Bytes RandomElements(DType dtype, size_t count, uint64_t seed) {
  const size_t size = DTypeSize(dtype);
  Bytes out(count * size);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> small(-4.0, 4.0);
  for (size_t i = 0; i < count; ++i) {
    unsigned char* p = out.data() + i * size;
    const uint64_t r = rng();
    const uint64_t bits = rng();
    switch (r % 4) {
      case 0:
      case 1: {  // arbitrary bits
        switch (dtype) {
          case DType::kFloat32: {
            uint32_t b = static_cast<uint32_t>(bits);
            if (((b >> 23) & 0xffu) == 0xffu) b ^= 1u << 23;
            Store<uint32_t>(p, b);
            break;
          }
          case DType::kFloat64: {
            uint64_t b = bits;
            if (((b >> 52) & 0x7ffu) == 0x7ffu) b ^= uint64_t{1} << 52;
            Store<uint64_t>(p, b);
            break;
          }
          case DType::kFloat16: {
            uint16_t b = static_cast<uint16_t>(bits);
            if (((b >> 10) & 0x1fu) == 0x1fu) b ^= 1u << 10;
            Store<uint16_t>(p, b);
            break;
          }
          case DType::kBFloat16: {
            uint16_t b = static_cast<uint16_t>(bits);
            if (((b >> 7) & 0xffu) == 0xffu) b ^= 1u << 7;
            Store<uint16_t>(p, b);
            break;
          }
          case DType::kInt32:
            Store<uint32_t>(p, static_cast<uint32_t>(bits));
            break;
          case DType::kInt64:
            Store<uint64_t>(p, bits);
            break;
        }
        break;
      }
      case 2:  // small values
        if (IsFloatingPoint(dtype)) {
          StoreValue(dtype, p, small(rng));
        } else {
          StoreValue(dtype, p, static_cast<double>(bits % 201) - 100.0);
        }
        break;
      case 3: {  // edges
        const int which = static_cast<int>(bits % 8);
        const bool negative = (bits >> 8) & 1;
        switch (dtype) {
          case DType::kFloat32: {
            const uint32_t pick[] = {0, 1, 0x7f7fffffu, 0x3f800000u,
                                     0x00800000u, 0x007fffffu, 0x4b000001u,
                                     0x33800000u};
            Store<uint32_t>(p, pick[which] | (negative ? 0x80000000u : 0));
            break;
          }
          case DType::kFloat64: {
            const uint64_t pick[] = {0,
                                     1,
                                     0x7fefffffffffffffull,
                                     0x3ff0000000000000ull,
                                     0x0010000000000000ull,
                                     0x000fffffffffffffull,
                                     0x4330000000000001ull,
                                     0x3ca0000000000000ull};
            Store<uint64_t>(
                p, pick[which] | (negative ? 0x8000000000000000ull : 0));
            break;
          }
          case DType::kFloat16: {
            const uint16_t pick[] = {0,      1,      0x7bff, 0x3c00,
                                     0x0400, 0x03ff, 0x6401, 0x1400};
            Store<uint16_t>(p, static_cast<uint16_t>(
                                   pick[which] | (negative ? 0x8000 : 0)));
            break;
          }
          case DType::kBFloat16: {
            const uint16_t pick[] = {0,      1,      0x7f7f, 0x3f80,
                                     0x0080, 0x007f, 0x4b01, 0x3380};
            Store<uint16_t>(p, static_cast<uint16_t>(
                                   pick[which] | (negative ? 0x8000 : 0)));
            break;
          }
          case DType::kInt32: {
            const int32_t pick[] = {0,  1, -1, std::numeric_limits<int32_t>::min(),
                                    std::numeric_limits<int32_t>::max(),
                                    2, -2, 65536};
            Store<int32_t>(p, pick[which]);
            break;
          }
          case DType::kInt64: {
            const int64_t pick[] = {0,  1, -1, std::numeric_limits<int64_t>::min(),
                                    std::numeric_limits<int64_t>::max(),
                                    2, -2, int64_t{1} << 32};
            Store<int64_t>(p, pick[which]);
            break;
          }
        }
        break;
      }
    }
  }
  return out;
}

// RandomElements with a seed made from (dtype, count, which), remembered
// while the dtype stays the same: the cases of one dtype reuse their
// operands across the five ops instead of drawing them again (the tests run
// dtype by dtype). Returned references stay valid until the dtype changes.
const Bytes& CachedRandom(DType dtype, size_t count, int which) {
  struct Entry {
    DType dtype;
    size_t count;
    int which;
    Bytes data;
  };
  static auto* cache = new std::vector<std::unique_ptr<Entry>>;
  if (!cache->empty() && cache->front()->dtype != dtype) cache->clear();
  for (const auto& entry : *cache) {
    if (entry->count == count && entry->which == which) return entry->data;
  }
  const uint64_t seed = (static_cast<uint64_t>(dtype) << 40) ^
                        (static_cast<uint64_t>(count) << 4) ^
                        static_cast<uint64_t>(which);
  cache->push_back(std::make_unique<Entry>(
      Entry{dtype, count, which, RandomElements(dtype, count, seed)}));
  return cache->back()->data;
}

std::string Hex(const unsigned char* p, size_t size) {
  std::string text = "0x";
  char digit[3];
  for (size_t k = size; k-- > 0;) {  // little endian: most significant last
    std::snprintf(digit, sizeof(digit), "%02x", p[k]);
    text += digit;
  }
  return text;
}

// ---------------------------------------------------------------------------
// Device scratch: two buffers big enough for the largest case, allocated on
// first use and kept for the whole run.

constexpr unsigned char kGuard = 0xa5;
constexpr size_t kSlack = 64;  // guard bytes past the data

struct Scratch {
  CudaBuffer a;
  CudaBuffer b;
};

Scratch& Shared() {
  static Scratch* scratch = [] {
    auto* s = new Scratch;
    const size_t bytes = kLargest * 8 + 2 * kSlack;
    auto a = CudaBuffer::Allocate(bytes);
    auto b = CudaBuffer::Allocate(bytes);
    if (a.ok() && b.ok()) {
      s->a = std::move(*a);
      s->b = std::move(*b);
    }
    return s;
  }();
  return *scratch;
}

// Where the operands sit relative to a 256-byte aligned allocation.
struct Layout {
  const char* name;
  bool dst_elem_offset;  // dst starts one element in
  bool src_elem_offset;  // src starts one element in
  size_t dst_byte_offset;
  size_t src_byte_offset;
  bool self;  // src == dst
};

const Layout kLayouts[] = {
    {"aligned", false, false, 0, 0, false},
    {"both_offset_one_element", true, true, 0, 0, false},
    {"dst_offset_one_element", true, false, 0, 0, false},
    {"src_offset_one_element", false, true, 0, 0, false},
    {"byte_misaligned", false, false, 1, 3, false},
    {"self_aligned", false, false, 0, 0, true},
    {"self_offset_one_element", true, false, 0, 0, true},
};

size_t Offset(DType dtype, bool elem, size_t bytes) {
  return (elem ? DTypeSize(dtype) : 0) + bytes;
}

// Uploads `data` at `offset` in `buffer`, guard bytes around it.
::testing::AssertionResult Upload(const CudaBuffer& buffer, size_t offset,
                                  const Bytes& data, Bytes* image) {
  image->assign(offset + data.size() + kSlack, kGuard);
  std::memcpy(image->data() + offset, data.data(), data.size());
  const absl::Status status =
      CudaCopyToDevice(buffer.data(), image->data(), image->size());
  if (!status.ok()) return ::testing::AssertionFailure() << status;
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Download(const CudaBuffer& buffer, size_t bytes,
                                    Bytes* out) {
  out->assign(bytes, 0);
  const absl::Status status = CudaCopyToHost(out->data(), buffer.data(), bytes);
  if (!status.ok()) return ::testing::AssertionFailure() << status;
  return ::testing::AssertionSuccess();
}

// Compares the device image with the expected one: guard bytes untouched,
// data bytes identical, or, where `nan_ok` and the CPU produced a NaN, a NaN.
// *nan_only counts the elements accepted that way.
::testing::AssertionResult SameImage(DType dtype, const Bytes& expected,
                                     const Bytes& got, size_t offset,
                                     size_t count, bool nan_ok,
                                     size_t* nan_only = nullptr) {
  const size_t size = DTypeSize(dtype);
  if (expected.size() != got.size()) {
    return ::testing::AssertionFailure() << "image sizes differ";
  }
  for (size_t i = 0; i < offset; ++i) {
    if (got[i] != kGuard) {
      return ::testing::AssertionFailure()
             << "guard byte " << i << " before the data was overwritten";
    }
  }
  for (size_t i = offset + count * size; i < got.size(); ++i) {
    if (got[i] != kGuard) {
      return ::testing::AssertionFailure()
             << "guard byte " << (i - offset - count * size)
             << " after the data was overwritten";
    }
  }
  if (std::memcmp(expected.data() + offset, got.data() + offset,
                  count * size) == 0) {
    return ::testing::AssertionSuccess();
  }
  size_t mismatches = 0;
  size_t first = count;
  for (size_t i = 0; i < count; ++i) {
    const unsigned char* e = expected.data() + offset + i * size;
    const unsigned char* g = got.data() + offset + i * size;
    if (std::memcmp(e, g, size) == 0) continue;
    if (nan_ok && IsNaNBits(dtype, e) && IsNaNBits(dtype, g)) {
      if (nan_only != nullptr) ++*nan_only;
      continue;
    }
    if (first == count) first = i;
    ++mismatches;
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  const unsigned char* e = expected.data() + offset + first * size;
  const unsigned char* g = got.data() + offset + first * size;
  return ::testing::AssertionFailure()
         << mismatches << " of " << count << " elements differ; first at "
         << first << ": cpu " << Hex(e, size) << ", cuda " << Hex(g, size);
}

// ---------------------------------------------------------------------------
// ReduceInto, random data, every dtype x op.

class CudaReduceTest
    : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA_DEVICE(); }
};

// Runs one case; `dst_data`/`src_data` are the operands (src ignored when
// layout.self). Returns the device-vs-CPU comparison.
::testing::AssertionResult CheckReduce(DType dtype, ReduceOp op,
                                       const Bytes& dst_data,
                                       const Bytes& src_data,
                                       const Layout& layout, bool nan_ok,
                                       size_t* nan_only = nullptr) {
  Scratch& scratch = Shared();
  if (scratch.a.data() == nullptr) {
    return ::testing::AssertionFailure() << "could not allocate scratch";
  }
  const size_t size = DTypeSize(dtype);
  const size_t count = dst_data.size() / size;
  const size_t dst_off =
      Offset(dtype, layout.dst_elem_offset, layout.dst_byte_offset);
  const size_t src_off =
      Offset(dtype, layout.src_elem_offset, layout.src_byte_offset);

  Bytes dst_image;
  Bytes src_image;
  if (auto r = Upload(scratch.a, dst_off, dst_data, &dst_image); !r) return r;
  unsigned char* dev_dst = static_cast<unsigned char*>(scratch.a.data()) +
                           dst_off;
  const unsigned char* dev_src = dev_dst;
  if (!layout.self) {
    if (auto r = Upload(scratch.b, src_off, src_data, &src_image); !r) {
      return r;
    }
    dev_src = static_cast<const unsigned char*>(scratch.b.data()) + src_off;
  }

  absl::Status status =
      CudaReduceInto(dtype, op, dev_dst, dev_src, count, nullptr);
  if (!status.ok()) {
    return ::testing::AssertionFailure() << "CudaReduceInto: " << status;
  }
  status = CudaSynchronize(nullptr);
  if (!status.ok()) {
    return ::testing::AssertionFailure() << "CudaSynchronize: " << status;
  }

  Bytes expected = dst_image;
  ReduceInto(dtype, op, expected.data() + dst_off,
             layout.self ? expected.data() + dst_off : src_data.data(), count);
  Bytes got;
  if (auto r = Download(scratch.a, dst_image.size(), &got); !r) return r;
  if (auto r = SameImage(dtype, expected, got, dst_off, count, nan_ok,
                         nan_only);
      !r) {
    return r;
  }
  // src must be untouched.
  if (!layout.self) {
    Bytes src_after;
    if (auto r = Download(scratch.b, src_image.size(), &src_after); !r) {
      return r;
    }
    if (src_after != src_image) {
      return ::testing::AssertionFailure() << "src was modified";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST_P(CudaReduceTest, MatchesCpuBitForBit) {
  const auto [dtype, op] = GetParam();
  const size_t cap = MaxCount();
  for (size_t count : kSizes) {
    if (count > cap) continue;
    const Bytes& dst_data = CachedRandom(dtype, count, 0);
    const Bytes& src_data = CachedRandom(dtype, count, 1);
    for (const Layout& layout : kLayouts) {
      // The largest size only where it matters (the vector main loop).
      if (count == kLargest && std::string(layout.name) != "aligned" &&
          std::string(layout.name) != "both_offset_one_element") {
        continue;
      }
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " " +
                   std::string(ReduceOpName(op)) + " count=" +
                   std::to_string(count) + " layout=" + layout.name);
      EXPECT_TRUE(CheckReduce(dtype, op, dst_data, src_data, layout,
                              /*nan_ok=*/false));
    }
  }
}

// NaN, infinities and the other edge values, every pair of them. NaN results
// need only be NaN (see the top of the file); everything else is exact.
Bytes SpecialElements(DType dtype) {
  const size_t size = DTypeSize(dtype);
  std::vector<uint64_t> bits;
  switch (dtype) {
    case DType::kFloat32:
      bits = {0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00000, 0x7f800000,
              0xff800000, 0,          0x80000000, 1,          0x80000001,
              0x7f7fffff, 0xff7fffff, 0x3f800000, 0xbf800000, 0x00800000,
              0x3dcccccd, 0x40400000};
      break;
    case DType::kFloat64:
      bits = {0x7ff8000000000000, 0xfff8000000000000, 0x7ff0000000000001,
              0x7ff4000000000000, 0x7ff0000000000000, 0xfff0000000000000,
              0,                  0x8000000000000000, 1,
              0x8000000000000001, 0x7fefffffffffffff, 0xffefffffffffffff,
              0x3ff0000000000000, 0xbff0000000000000, 0x0010000000000000,
              0x3fb999999999999a, 0x4008000000000000};
      break;
    case DType::kFloat16:
      bits = {0x7e00, 0xfe00, 0x7c01, 0x7d00, 0x7c00, 0xfc00,
              0,      0x8000, 1,      0x8001, 0x7bff, 0xfbff,
              0x3c00, 0xbc00, 0x0400, 0x2e66, 0x4200};
      break;
    case DType::kBFloat16:
      bits = {0x7fc0, 0xffc0, 0x7f81, 0x7fa0, 0x7f80, 0xff80,
              0,      0x8000, 1,      0x8001, 0x7f7f, 0xff7f,
              0x3f80, 0xbf80, 0x0080, 0x3dcd, 0x4040};
      break;
    case DType::kInt32:
      bits = {0, 1, static_cast<uint32_t>(-1), 0x80000000u, 0x7fffffffu, 2,
              static_cast<uint32_t>(-2), 0x10000, 3, static_cast<uint32_t>(-7)};
      break;
    case DType::kInt64:
      bits = {0, 1, ~uint64_t{0}, uint64_t{1} << 63, ~(uint64_t{1} << 63), 2,
              ~uint64_t{1}, uint64_t{1} << 32, 3, static_cast<uint64_t>(-7)};
      break;
  }
  Bytes out(bits.size() * size);
  for (size_t i = 0; i < bits.size(); ++i) {
    std::memcpy(out.data() + i * size, &bits[i], size);  // little endian
  }
  return out;
}

TEST_P(CudaReduceTest, SpecialValuesEveryPair) {
  const auto [dtype, op] = GetParam();
  const size_t size = DTypeSize(dtype);
  const Bytes specials = SpecialElements(dtype);
  const size_t n = specials.size() / size;
  // dst[i * n + j] = specials[i], src[i * n + j] = specials[j]; repeated so
  // that the pairs also go through the vector path.
  Bytes dst_data;
  Bytes src_data;
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        dst_data.insert(dst_data.end(), specials.begin() + i * size,
                        specials.begin() + (i + 1) * size);
        src_data.insert(src_data.end(), specials.begin() + j * size,
                        specials.begin() + (j + 1) * size);
      }
    }
  }
  size_t nan_only = 0;
  for (const Layout& layout : kLayouts) {
    SCOPED_TRACE(std::string(DTypeName(dtype)) + " " +
                 std::string(ReduceOpName(op)) + " layout=" + layout.name);
    EXPECT_TRUE(CheckReduce(dtype, op, dst_data, src_data, layout,
                            /*nan_ok=*/true, &nan_only));
  }
  if (nan_only > 0) {
    std::printf("[   NOTE   ] %s %s: %zu NaN results with a different payload "
                "than the CPU's (allowed)\n",
                std::string(DTypeName(dtype)).c_str(),
                std::string(ReduceOpName(op)).c_str(), nan_only);
  }
}

std::string DTypeOpName(
    const ::testing::TestParamInfo<std::tuple<DType, ReduceOp>>& info) {
  return std::string(DTypeName(std::get<0>(info.param))) + "_" +
         std::string(ReduceOpName(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAndOps, CudaReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kAllReduceOps)),
                         DTypeOpName);

// ---------------------------------------------------------------------------
// FinalizeAvg.

class CudaFinalizeAvgTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA_DEVICE(); }
};

const int kDivisors[] = {0,  1,    -1,    2,
                         3,  7,    -5,    1000,
                         65535, std::numeric_limits<int>::max(),
                         std::numeric_limits<int>::min()};

::testing::AssertionResult CheckFinalize(DType dtype, const Bytes& data,
                                         int divisor, size_t offset,
                                         bool nan_ok,
                                         size_t* nan_only = nullptr) {
  Scratch& scratch = Shared();
  if (scratch.a.data() == nullptr) {
    return ::testing::AssertionFailure() << "could not allocate scratch";
  }
  const size_t count = data.size() / DTypeSize(dtype);
  Bytes image;
  if (auto r = Upload(scratch.a, offset, data, &image); !r) return r;
  absl::Status status = CudaFinalizeAvg(
      dtype, static_cast<unsigned char*>(scratch.a.data()) + offset, count,
      divisor, nullptr);
  if (!status.ok()) {
    return ::testing::AssertionFailure() << "CudaFinalizeAvg: " << status;
  }
  status = CudaSynchronize(nullptr);
  if (!status.ok()) {
    return ::testing::AssertionFailure() << "CudaSynchronize: " << status;
  }
  Bytes expected = image;
  FinalizeAvg(dtype, expected.data() + offset, count, divisor);
  Bytes got;
  if (auto r = Download(scratch.a, image.size(), &got); !r) return r;
  return SameImage(dtype, expected, got, offset, count, nan_ok, nan_only);
}

TEST_P(CudaFinalizeAvgTest, MatchesCpuBitForBit) {
  const DType dtype = GetParam();
  const size_t cap = MaxCount();
  const size_t size = DTypeSize(dtype);
  uint64_t seed = 5000 + static_cast<uint64_t>(dtype);
  for (size_t count : kSizes) {
    if (count > cap || count == kLargest) continue;
    const Bytes data = RandomElements(dtype, count, ++seed);
    for (int divisor : kDivisors) {
      for (size_t offset : {size_t{0}, size, size_t{1}}) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " count=" +
                     std::to_string(count) + " divisor=" +
                     std::to_string(divisor) + " offset=" +
                     std::to_string(offset));
        EXPECT_TRUE(CheckFinalize(dtype, data, divisor, offset,
                                  /*nan_ok=*/false));
      }
    }
  }
  // The largest size once, for the vector main loop.
  if (kLargest <= cap) {
    const Bytes data = RandomElements(dtype, kLargest, ++seed);
    SCOPED_TRACE(std::string(DTypeName(dtype)) + " largest, divisor 3");
    EXPECT_TRUE(CheckFinalize(dtype, data, 3, 0, /*nan_ok=*/false));
  }
}

TEST_P(CudaFinalizeAvgTest, SpecialValues) {
  const DType dtype = GetParam();
  Bytes data;
  for (int repeat = 0; repeat < 8; ++repeat) {
    const Bytes specials = SpecialElements(dtype);
    data.insert(data.end(), specials.begin(), specials.end());
  }
  size_t nan_only = 0;
  for (int divisor : kDivisors) {
    for (size_t offset : {size_t{0}, DTypeSize(dtype), size_t{1}}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " divisor=" +
                   std::to_string(divisor) + " offset=" +
                   std::to_string(offset));
      EXPECT_TRUE(CheckFinalize(dtype, data, divisor, offset, /*nan_ok=*/true,
                                &nan_only));
    }
  }
  if (nan_only > 0) {
    std::printf("[   NOTE   ] %s finalize_avg: %zu NaN results with a "
                "different payload than the CPU's (allowed)\n",
                std::string(DTypeName(dtype)).c_str(), nan_only);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, CudaFinalizeAvgTest,
                         ::testing::ValuesIn(kAllDTypes),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// ---------------------------------------------------------------------------
// Arguments (with a device).

TEST(CudaReduceArgsTest, RejectsBadArgumentsWithADevice) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto buffer = CudaBuffer::Allocate(64);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto* p = static_cast<unsigned char*>(buffer->data());
  EXPECT_EQ(CudaReduceInto(DType::kFloat32, ReduceOp::kSum, p, p + 4, 4,
                           nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument)
      << "partial overlap";
  EXPECT_EQ(CudaReduceInto(DType::kFloat32, ReduceOp::kSum, nullptr, p, 4,
                           nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaFinalizeAvg(DType::kInt32, nullptr, 4, 3, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing above may have poisoned the context.
  EXPECT_TRUE(CudaReduceInto(DType::kInt32, ReduceOp::kSum, p, p, 16, nullptr)
                  .ok());
  EXPECT_TRUE(CudaSynchronize(nullptr).ok());
}

// ---------------------------------------------------------------------------
// Without a device (these run everywhere).

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

TEST(CudaReduceNoDeviceTest, ReportsUnavailableWithAClearMessage) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (!CudaReducerCompiled()) {
    // The stub: every call says so.
    for (const absl::Status& status :
         {count.status(),
          CudaReduceInto(DType::kFloat32, ReduceOp::kSum, nullptr, nullptr, 1,
                         nullptr),
          CudaFinalizeAvg(DType::kFloat32, nullptr, 1, 3, nullptr),
          CudaBuffer::Allocate(16).status(), CudaSynchronize(nullptr),
          CudaCopyToDevice(nullptr, nullptr, 1)}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
      EXPECT_TRUE(Contains(status.message(), "halka was built without CUDA"))
          << status;
    }
    return;
  }
  if (count.ok()) {
    // There is a GPU: the API works (the tests above check the results).
    EXPECT_GT(*count, 0);
    auto buffer = CudaBuffer::Allocate(16);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_TRUE(CudaReduceInto(DType::kInt32, ReduceOp::kSum, buffer->data(),
                               buffer->data(), 4, nullptr)
                    .ok());
    EXPECT_TRUE(CudaSynchronize(nullptr).ok());
    return;
  }
  // Built with CUDA, no usable device (no driver, or no GPU).
  std::printf("[   INFO   ] CudaDeviceCount: %s\n",
              count.status().ToString().c_str());
  EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(count.status().message().rfind("no CUDA device: ", 0), 0u)
      << count.status();
  EXPECT_GT(count.status().message().size(),
            std::string("no CUDA device: ").size())
      << "the CUDA error text is missing";
  for (const absl::Status& status :
       {CudaReduceInto(DType::kFloat32, ReduceOp::kSum, nullptr, nullptr, 1,
                       nullptr),
        CudaReduceInto(DType::kBFloat16, ReduceOp::kMax, nullptr, nullptr,
                       1000, nullptr),
        CudaFinalizeAvg(DType::kFloat32, nullptr, 1, 3, nullptr),
        CudaBuffer::Allocate(16).status(), CudaSynchronize(nullptr)}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_TRUE(Contains(status.message(), "no CUDA device: ")) << status;
  }
  // Asking again gives the same answer (no crash, no state left behind).
  EXPECT_EQ(CudaDeviceCount().status().code(), absl::StatusCode::kUnavailable);
}

TEST(CudaReduceNoDeviceTest, ValidatesArgumentsEverywhere) {
  if (!CudaReducerCompiled()) GTEST_SKIP() << "halka was built without CUDA";
  // Checked before any device is touched, so the same with or without one.
  EXPECT_EQ(CudaReduceInto(static_cast<DType>(0), ReduceOp::kSum, nullptr,
                           nullptr, 1, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaReduceInto(static_cast<DType>(11), ReduceOp::kSum, nullptr,
                           nullptr, 1, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaReduceInto(DType::kFloat32, static_cast<ReduceOp>(6), nullptr,
                           nullptr, 1, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaFinalizeAvg(static_cast<DType>(11), nullptr, 1, 3, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Empty work and no-op divisors touch nothing.
  EXPECT_TRUE(CudaReduceInto(DType::kFloat32, ReduceOp::kSum, nullptr, nullptr,
                             0, nullptr)
                  .ok());
  EXPECT_TRUE(CudaFinalizeAvg(DType::kInt64, nullptr, 0, 3, nullptr).ok());
  EXPECT_TRUE(CudaFinalizeAvg(DType::kInt64, nullptr, 5, 1, nullptr).ok());
  EXPECT_TRUE(CudaFinalizeAvg(DType::kInt64, nullptr, 5, 0, nullptr).ok());
}

}  // namespace
}  // namespace halka
