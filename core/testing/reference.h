// Test data and the float64 reference that halka's results are checked
// against: by the tests, by `halkactl demo` and by `halkactl bench -c`.
#ifndef HALKA_CORE_TESTING_REFERENCE_H_
#define HALKA_CORE_TESTING_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace halka {

// Deterministic pseudo-random data for `rank`, already representable in
// `dtype`, in a range where `op` over up to 64 ranks stays finite and, for
// integers, free of overflow: floats in ±[0.5, 1.5) (PROD: [0.5, 1.5)),
// integers in [-1000, 1000] (PROD: [-3, 3]).
std::vector<uint8_t> MakeRankData(DType dtype, ReduceOp op, size_t count,
                                  int rank, uint64_t seed);

// MakeRankData's elements a block at a time: each Fill writes the next
// `count` elements (the same bytes MakeRankData makes, from where the last
// Fill stopped), for checking a buffer too large to hold every rank's.
class RankDataStream {
 public:
  RankDataStream(DType dtype, ReduceOp op, int rank, uint64_t seed);
  void Fill(uint8_t* out, size_t count);

 private:
  DType dtype_;
  bool prod_;
  std::mt19937_64 rng_;
  std::pair<int, int> range_;  // integers: [lo, hi]
};

// MakeRankData of ranks 0..world_size-1, by rank.
std::vector<std::vector<uint8_t>> MakeRanksData(DType dtype, ReduceOp op,
                                                size_t count, int world_size,
                                                uint64_t seed);

// Element i of a buffer, widened to double.
double ElementAsDouble(DType dtype, const void* data, size_t i);

// The relative tolerance used for floating results of `world_size` ranks:
// each of the world_size-1 reduction steps rounds once in `dtype`.
double Tolerance(DType dtype, int world_size);

struct CheckResult {
  size_t wrong = 0;       // elements outside the tolerance
  std::string first;      // description of the first one
};

// Compares `result` (count elements) with the float64 reduction of
// `inputs` (one buffer per rank). Integers must match exactly (AVG:
// truncated toward zero), MIN/MAX exactly, other floats within Tolerance()
// times the magnitude of the inputs.
CheckResult CheckAllReduce(DType dtype, ReduceOp op,
                           const std::vector<std::vector<uint8_t>>& inputs,
                           const void* result, size_t count);

// What an all-reduce of MakeRankData(dtype, op, count, r, seed) over
// ranks r of [0, world) must give, made once and a block at a time, not
// from `world` buffers (halkactl's check of a large all-reduce, repeated).
// Where the result must match exactly (integers, bool, MIN and MAX) it
// keeps that result in the dtype (its size per element); where a float
// result may round, the float64 reduction and the magnitude the tolerance
// scales with (12 bytes per element). Check judges a result as
// CheckAllReduce does, except that the magnitude is kept as a float
// rounded up: a tolerance at most 2^-24 of itself looser.
class AllReduceReference {
 public:
  AllReduceReference(DType dtype, ReduceOp op, int world, uint64_t seed,
                     size_t count);
  CheckResult Check(const void* result) const;

 private:
  DType dtype_;
  ReduceOp op_;
  int world_;
  size_t count_;
  bool exact_;                 // the result must match exact_result_
  std::vector<uint8_t> exact_result_;
  std::vector<double> acc_;    // otherwise: the float64 reduction
  std::vector<float> mag_;     // and the magnitude, rounded up
};

// Reduce-scatter: `inputs` hold world x recv_count elements per rank;
// `result` (recv_count elements) is rank `rank`'s, checked as
// CheckAllReduce checks slice `rank` of the inputs. Indices in `first`
// count from the start of the slice.
CheckResult CheckReduceScatter(DType dtype, ReduceOp op,
                               const std::vector<std::vector<uint8_t>>& inputs,
                               const void* result, int rank,
                               size_t recv_count);

// All-gather: `inputs` hold send_count elements per rank; `result` (world x
// send_count) must hold rank i's bytes at slice i, exactly.
CheckResult CheckAllGather(DType dtype,
                           const std::vector<std::vector<uint8_t>>& inputs,
                           const void* result, size_t send_count);

}  // namespace halka

#endif  // HALKA_CORE_TESTING_REFERENCE_H_
