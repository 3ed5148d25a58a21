#include "core/testing/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/reduce.h"

namespace halka {
namespace {

void StoreDouble(DType dtype, double v, uint8_t* out) {
  switch (dtype) {
    case DType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(out, &f, 4);
      break;
    }
    case DType::kFloat64:
      std::memcpy(out, &v, 8);
      break;
    case DType::kFloat16: {
      const uint16_t h = FloatToHalf(static_cast<float>(v));
      std::memcpy(out, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t h = FloatToBFloat16(static_cast<float>(v));
      std::memcpy(out, &h, 2);
      break;
    }
    case DType::kInt32: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(out, &x, 4);
      break;
    }
    case DType::kInt64: {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(out, &x, 8);
      break;
    }
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
    case DType::kInt16: {
      // In the type's range by construction (IntegerRange); stored modulo
      // 2^bits, little-endian.
      const uint64_t x = static_cast<uint64_t>(static_cast<int64_t>(v));
      std::memcpy(out, &x, DTypeSize(dtype));
      break;
    }
  }
}

// The integers MakeRankData draws for `dtype` under `op`: small enough for
// PROD, and within the type (bool: 0 or 1).
std::pair<int, int> IntegerRange(DType dtype, bool prod) {
  switch (dtype) {
    case DType::kBool:
      return {0, 1};
    case DType::kUInt8:
      return {0, prod ? 3 : 255};
    case DType::kInt8:
      return {prod ? -3 : -100, prod ? 3 : 100};
    default:
      return {prod ? -3 : -1000, prod ? 3 : 1000};
  }
}

// `v` (an integer) as the element type holds it: modulo 2^bits, as the
// engine's SUM and PROD wrap (bool: non-zero is 1).
double WrapToType(DType dtype, double v) {
  const int64_t x = static_cast<int64_t>(v);
  switch (dtype) {
    case DType::kInt8:
      return static_cast<int8_t>(static_cast<uint8_t>(x));
    case DType::kUInt8:
      return static_cast<uint8_t>(x);
    case DType::kInt16:
      return static_cast<int16_t>(static_cast<uint16_t>(x));
    case DType::kBool:
      return x != 0 ? 1 : 0;
    default:
      return v;
  }
}

}  // namespace

RankDataStream::RankDataStream(DType dtype, ReduceOp op, int rank,
                               uint64_t seed)
    : dtype_(dtype),
      prod_(op == ReduceOp::kProd),
      rng_(seed * 1000003u + static_cast<uint64_t>(rank) * 7919u +
           static_cast<uint64_t>(dtype) * 31u + static_cast<uint64_t>(op)),
      range_(IntegerRange(dtype, prod_)) {}

void RankDataStream::Fill(uint8_t* out, size_t count) {
  const size_t es = DTypeSize(dtype_);
  // The distributions keep no state between calls: a buffer made a block
  // at a time has the same elements as one made at once.
  if (IsFloatingPoint(dtype_)) {
    std::uniform_real_distribution<double> mag(0.5, 1.5);
    for (size_t i = 0; i < count; ++i) {
      double v = mag(rng_);
      if (!prod_ && (rng_() & 1)) v = -v;
      StoreDouble(dtype_, v, out + i * es);
    }
  } else {
    std::uniform_int_distribution<int> dist(range_.first, range_.second);
    for (size_t i = 0; i < count; ++i) {
      StoreDouble(dtype_, dist(rng_), out + i * es);
    }
  }
}

std::vector<uint8_t> MakeRankData(DType dtype, ReduceOp op, size_t count,
                                  int rank, uint64_t seed) {
  std::vector<uint8_t> out(count * DTypeSize(dtype));
  RankDataStream(dtype, op, rank, seed).Fill(out.data(), count);
  return out;
}

std::vector<std::vector<uint8_t>> MakeRanksData(DType dtype, ReduceOp op,
                                                size_t count, int world_size,
                                                uint64_t seed) {
  std::vector<std::vector<uint8_t>> out;
  for (int r = 0; r < world_size; ++r) {
    out.push_back(MakeRankData(dtype, op, count, r, seed));
  }
  return out;
}

double ElementAsDouble(DType dtype, const void* data, size_t i) {
  const uint8_t* p = static_cast<const uint8_t*>(data) + i * DTypeSize(dtype);
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return BFloat16ToFloat(h);
    }
    case DType::kInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DType::kInt64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case DType::kInt8:
      return static_cast<int8_t>(p[0]);
    case DType::kUInt8:
      return p[0];
    case DType::kBool:
      return p[0] != 0 ? 1 : 0;
    case DType::kInt16: {
      int16_t x;
      std::memcpy(&x, p, 2);
      return x;
    }
  }
  return 0;
}

double Tolerance(DType dtype, int world_size) {
  double unit = 0;  // unit roundoff of the type
  switch (dtype) {
    case DType::kFloat32:
      unit = std::ldexp(1.0, -24);
      break;
    case DType::kFloat64:
      unit = std::ldexp(1.0, -53);
      break;
    case DType::kFloat16:
      unit = std::ldexp(1.0, -11);
      break;
    case DType::kBFloat16:
      unit = std::ldexp(1.0, -8);
      break;
    default:
      return 0;
  }
  // world_size-1 roundings in the chain, one more for AVG's division.
  return (world_size + 1) * unit;
}

namespace {

// The float64 reduction of element i over one input per rank, and the
// magnitude the tolerance scales with.
struct Expected {
  double acc;
  double mag;
};
Expected ExpectedAt(DType dtype, ReduceOp op,
                    const std::vector<const uint8_t*>& inputs, size_t i) {
  const int g = static_cast<int>(inputs.size());
  const bool integer = !IsFloatingPoint(dtype);
  double acc = ElementAsDouble(dtype, inputs[0], i);
  double mag = std::fabs(acc);
  // bool: SUM is an or (MAX on 0/1), PROD an and (MIN).
  const ReduceOp as = dtype != DType::kBool ? op
                      : op == ReduceOp::kSum  ? ReduceOp::kMax
                      : op == ReduceOp::kProd ? ReduceOp::kMin
                                              : op;
  for (int r = 1; r < g; ++r) {
    const double v = ElementAsDouble(dtype, inputs[static_cast<size_t>(r)], i);
    mag += std::fabs(v);
    switch (as) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::fmin(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::fmax(acc, v);
        break;
    }
  }
  // The 8- and 16-bit types wrap (the wider ones do not, at these
  // ranges); AVG divides the wrapped sum.
  acc = WrapToType(dtype, acc);
  if (op == ReduceOp::kAvg) {
    acc = integer ? std::trunc(acc / g) : acc / g;
    mag /= g;
  }
  if (op == ReduceOp::kProd) mag = std::fabs(acc);
  return Expected{acc, mag};
}

// Compares element i of `result` with what it should be (`tol`:
// Tolerance of the dtype and world); counts it and describes the first
// wrong one.
void CheckElement(DType dtype, ReduceOp op, double tol, const void* result,
                  size_t i, Expected want, CheckResult& out) {
  const double got = ElementAsDouble(dtype, result, i);
  bool ok;
  if (!IsFloatingPoint(dtype) || op == ReduceOp::kMin ||
      op == ReduceOp::kMax) {
    ok = got == want.acc;
  } else {
    // Absolute slack of one unit in the last place at the result's scale
    // covers results that cancel to near zero.
    ok = std::fabs(got - want.acc) <=
         tol * (want.mag + std::fabs(want.acc)) + 1e-300;
  }
  if (!ok && out.wrong++ == 0) {
    out.first = absl::StrFormat(
        "element %d: got %.17g, expected %.17g (tolerance %.3g relative)", i,
        got, want.acc, tol);
  }
}

}  // namespace

CheckResult CheckAllReduce(DType dtype, ReduceOp op,
                           const std::vector<std::vector<uint8_t>>& inputs,
                           const void* result, size_t count) {
  CheckResult out;
  std::vector<const uint8_t*> in;
  for (const std::vector<uint8_t>& v : inputs) in.push_back(v.data());
  const double tol = Tolerance(dtype, static_cast<int>(in.size()));
  for (size_t i = 0; i < count; ++i) {
    CheckElement(dtype, op, tol, result, i, ExpectedAt(dtype, op, in, i), out);
  }
  return out;
}

AllReduceReference::AllReduceReference(DType dtype, ReduceOp op, int world,
                                       uint64_t seed, size_t count)
    : dtype_(dtype),
      op_(op),
      world_(world),
      count_(count),
      exact_(!IsFloatingPoint(dtype) || op == ReduceOp::kMin ||
             op == ReduceOp::kMax) {
  const size_t es = DTypeSize(dtype);
  if (exact_) {
    exact_result_.resize(count * es);
  } else {
    acc_.resize(count);
    mag_.resize(count);
  }
  // Every rank's data a block at a time: memory for `world` blocks, and
  // no more than the buffer has.
  const size_t block = std::min(count, size_t{1} << 16);
  std::vector<RankDataStream> streams;
  std::vector<std::vector<uint8_t>> blocks(static_cast<size_t>(world));
  std::vector<const uint8_t*> in;
  for (int r = 0; r < world; ++r) {
    streams.emplace_back(dtype, op, r, seed);
    blocks[static_cast<size_t>(r)].resize(block * es);
    in.push_back(blocks[static_cast<size_t>(r)].data());
  }
  for (size_t at = 0; at < count; at += block) {
    const size_t n = std::min(block, count - at);
    for (int r = 0; r < world; ++r) {
      streams[static_cast<size_t>(r)].Fill(blocks[static_cast<size_t>(r)].data(), n);
    }
    for (size_t i = 0; i < n; ++i) {
      const Expected e = ExpectedAt(dtype, op, in, i);
      if (exact_) {
        // An exact result is representable in the dtype (wrapped,
        // truncated, or one of the inputs): stored, it reads back as is.
        StoreDouble(dtype, e.acc, exact_result_.data() + (at + i) * es);
        continue;
      }
      acc_[at + i] = e.acc;
      float m = static_cast<float>(e.mag);
      if (static_cast<double>(m) < e.mag) {
        m = std::nextafter(m, std::numeric_limits<float>::infinity());
      }
      mag_[at + i] = m;
    }
  }
}

CheckResult AllReduceReference::Check(const void* result) const {
  CheckResult out;
  const double tol = Tolerance(dtype_, world_);
  for (size_t i = 0; i < count_; ++i) {
    const Expected want =
        exact_ ? Expected{ElementAsDouble(dtype_, exact_result_.data(), i), 0}
               : Expected{acc_[i], static_cast<double>(mag_[i])};
    CheckElement(dtype_, op_, tol, result, i, want, out);
  }
  return out;
}

CheckResult CheckReduceScatter(DType dtype, ReduceOp op,
                               const std::vector<std::vector<uint8_t>>& inputs,
                               const void* result, int rank,
                               size_t recv_count) {
  const size_t bytes = recv_count * DTypeSize(dtype);
  std::vector<std::vector<uint8_t>> slices;
  for (const std::vector<uint8_t>& in : inputs) {
    const size_t from = static_cast<size_t>(rank) * bytes;
    if (in.size() < from + bytes) {
      return CheckResult{recv_count, "an input is shorter than world x recv_count"};
    }
    slices.emplace_back(in.begin() + static_cast<long>(from),
                        in.begin() + static_cast<long>(from + bytes));
  }
  return CheckAllReduce(dtype, op, slices, result, recv_count);
}

CheckResult CheckAllGather(DType dtype,
                           const std::vector<std::vector<uint8_t>>& inputs,
                           const void* result, size_t send_count) {
  CheckResult out;
  const size_t es = DTypeSize(dtype);
  const uint8_t* got = static_cast<const uint8_t*>(result);
  for (size_t r = 0; r < inputs.size(); ++r) {
    for (size_t i = 0; i < send_count; ++i) {
      const uint8_t* want = inputs[r].data() + i * es;
      if (inputs[r].size() < (i + 1) * es ||
          std::memcmp(got + (r * send_count + i) * es, want, es) != 0) {
        if (out.wrong++ == 0) {
          out.first = absl::StrCat(
              "slice ", r, " element ", i, ": got ",
              ElementAsDouble(dtype, got, r * send_count + i), ", want rank ",
              r, "'s ",
              inputs[r].size() < (i + 1) * es
                  ? std::string("(missing)")
                  : absl::StrCat(ElementAsDouble(dtype, want, 0)));
        }
      }
    }
  }
  return out;
}

}  // namespace halka
