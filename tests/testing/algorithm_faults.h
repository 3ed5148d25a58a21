// The failure contract, checked alike for any all-reduce algorithm on an
// InProcRing: a count mismatch touches no buffer and the ring runs on; a
// rank that never calls, or dies mid-way, is named by every other rank and
// nobody hangs. And what an all-reduce of a size resolves to.
#ifndef HALKA_TESTS_TESTING_ALGORITHM_FAULTS_H_
#define HALKA_TESTS_TESTING_ALGORITHM_FAULTS_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/algorithms/algorithms.h"
#include "gtest/gtest.h"
#include "tests/testing/inproc_ring.h"

namespace halka::testing {

// What a float32 all-reduce of `bytes` asked to run `algo` resolves to on
// a ring of `c`.
inline Algorithm ResolvedAt(const CommConfig& c, Algorithm algo,
                            uint64_t bytes) {
  Fingerprint fp;
  fp.kind = OpKind::kAllReduce;
  fp.dtype = DType::kFloat32;
  fp.algorithm = algo;
  fp.count = bytes / 4;
  return ResolveAlgorithm(c, fp);
}

// A flat ring of g ranks (40-byte chunks) whose fingerprints go to every
// rank at once up to fp_world ranks, around the ring above.
inline InProcRing FaultRing(int g, int fp_world,
                            absl::Duration reduce_delay = absl::ZeroDuration(),
                            size_t chunk_bytes = 40) {
  return InProcRing(g, chunk_bytes, [&](CommConfig& c) {
    c.all_to_all_max_world = fp_world;
    c.test_reduce_delay = reduce_delay;
  });
}

// On 6 ranks, fingerprints all-to-all and around the ring: rank 4 calls
// with 299 elements where the others call with 300: every rank fails
// naming the odd call ("float32x299"; the pair that met it
// FAILED_PRECONDITION, the others through the ABORT that carries that
// text), every buffer unchanged; then every rank's next call succeeds.
inline void ExpectMismatchTouchesNoBuffer(InProcRing& ring, Algorithm algo);
inline void ExpectMismatchTouchesNoBuffer(Algorithm algo) {
  for (int fp_world : {16, 1}) {
    SCOPED_TRACE(absl::StrCat("fp_world ", fp_world));
    InProcRing ring = FaultRing(6, fp_world);
    ExpectMismatchTouchesNoBuffer(ring, algo);
  }
}
inline void ExpectMismatchTouchesNoBuffer(InProcRing& ring, Algorithm algo) {
  const int g = ring.g;
  std::vector<std::vector<float>> bufs(g, std::vector<float>(300, 1.0f));
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    return ring.comms[r]->AllReduce(bufs[r].data(), r == 4 ? 299 : 300,
                                    DType::kFloat32, ReduceOp::kSum,
                                    absl::Seconds(10), algo);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_NE(results[r].status().message().find("float32x299"),
              absl::string_view::npos)
        << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(bufs[r], std::vector<float>(300, 1.0f)) << "rank " << r;
  }
  auto again = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    return ring.comms[r]->AllReduce(bufs[r].data(), 300, DType::kFloat32,
                                    ReduceOp::kSum, absl::Seconds(10), algo);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(again[r].ok()) << again[r].status();
    EXPECT_EQ(bufs[r], std::vector<float>(300, static_cast<float>(g)));
  }
}

// Rank `missing` never calls; the others call with a 400 ms deadline:
// within 10 s every one fails naming it, its buffer unchanged.
inline void ExpectMissingRankNamed(InProcRing& ring, Algorithm algo,
                                   int missing);
// The same on 5 ranks (position 1 folds into 0 in the doubling plans; 3 is
// a virtual rank), for ranks 1 and 3 missing, fingerprints all-to-all and
// around the ring.
inline void ExpectMissingRankNamed(Algorithm algo) {
  for (int missing : {1, 3}) {
    for (int fp_world : {16, 1}) {
      SCOPED_TRACE(absl::StrCat("missing ", missing, " fp_world ", fp_world));
      InProcRing ring = FaultRing(5, fp_world);
      ExpectMissingRankNamed(ring, algo, missing);
    }
  }
}
inline void ExpectMissingRankNamed(InProcRing& ring, Algorithm algo,
                                   int missing) {
  const int g = ring.g;
  std::vector<std::vector<float>> bufs(g, std::vector<float>(500, 1.0f));
  const absl::Time start = absl::Now();
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    if (r == missing) {
      return absl::StatusOr<OpResult>(absl::CancelledError("not called"));
    }
    return ring.comms[r]->AllReduce(bufs[r].data(), 500, DType::kFloat32,
                                    ReduceOp::kSum, absl::Milliseconds(400),
                                    algo);
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (int r = 0; r < g; ++r) {
    if (r == missing) continue;
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_NE(results[r].status().message().find(absl::StrCat("rank ", missing)),
              absl::string_view::npos)
        << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(bufs[r], std::vector<float>(500, 1.0f)) << "rank " << r;
  }
}

// Rank `dead` of a ring whose ranks reduce slowly is killed 50 ms into an
// all-reduce of 4096 floats with a 10 s deadline: within 4 s of the kill
// every survivor either fails naming it or, where every partial result it
// needed had left the dead rank before it died, ends with the whole, right
// sum; at least `min_failed` fail.
inline void ExpectKilledRankNamed(InProcRing& ring, Algorithm algo, int dead,
                                  int min_failed);
// The same on 8 ranks that reduce each chunk (1 KiB) 150 ms slowly, rank 5
// killed, fingerprints all-to-all and around the ring.
inline void ExpectKilledRankNamed(Algorithm algo, int min_failed) {
  for (int fp_world : {16, 1}) {
    SCOPED_TRACE(absl::StrCat("fp_world ", fp_world));
    InProcRing ring =
        FaultRing(8, fp_world, absl::Milliseconds(150), /*chunk_bytes=*/1024);
    ExpectKilledRankNamed(ring, algo, /*dead=*/5, min_failed);
  }
}
inline void ExpectKilledRankNamed(InProcRing& ring, Algorithm algo, int dead,
                                  int min_failed) {
  const int g = ring.g;
  std::vector<std::vector<float>> bufs(g, std::vector<float>(4096, 1.0f));
  const InProcRing::KilledRun run = ring.AllReduceKilling(
      bufs, algo, absl::Seconds(10), dead, absl::Milliseconds(50));
  const std::string named = absl::StrCat("rank ", dead, " (w", dead);
  int failed = 0;
  for (int r = 0; r < g; ++r) {
    if (r == dead) continue;
    EXPECT_LT(run.after_kill[r], absl::Seconds(4))
        << "rank " << r << " ended " << run.after_kill[r] << " after the kill";
    if (run.results[r].ok()) {
      EXPECT_EQ(bufs[r], std::vector<float>(4096, static_cast<float>(g)))
          << "rank " << r;
      continue;
    }
    ++failed;
    EXPECT_NE(run.results[r].status().message().find(named),
              absl::string_view::npos)
        << "rank " << r << ": " << run.results[r].status();
  }
  EXPECT_GE(failed, min_failed);
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_ALGORITHM_FAULTS_H_
