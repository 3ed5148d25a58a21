// Recursive doubling (core/algorithms/doubling.cc): the same bits on every
// rank and within the reference's bound for every world (powers of two and
// the ranks that fold in beyond them), dtype and op; each rank talks only
// to its partners, in host order, with the payload the plan says; a
// mismatch touches no buffer; a rank that never calls or dies is named by
// every other, and nobody hangs, whether fingerprints would go all-to-all
// or around the ring.
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/algorithms/algorithms.h"
#include "core/communicator.h"
#include "core/testing/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/algorithm_faults.h"
#include "tests/testing/hosts.h"
#include "tests/testing/inproc_ring.h"

namespace halka {
namespace {

using halka::testing::ExpectKilledRankNamed;
using halka::testing::ExpectMismatchTouchesNoBuffer;
using halka::testing::ExpectMissingRankNamed;
using halka::testing::Hosts;
using halka::testing::InProcRing;
using halka::testing::OrderOf;
using halka::testing::ResolvedAt;
using halka::testing::RunRanks;
using halka::testing::WorldOf;

constexpr Algorithm kRd = Algorithm::kRecursiveDoubling;

InProcRing FlatRing(int g, int fp_world) {
  return InProcRing(g, 40, [&](CommConfig& c) {
    c.all_to_all_max_world = fp_world;
  });
}

TEST(Doubling, EveryWorldCountOpAndDtypeAgreesEverywhereAndWithTheReference) {
  for (int g : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16}) {
    for (int fp_world : {16, 1}) {
      SCOPED_TRACE(absl::StrCat("g ", g, " fp_world ", fp_world));
      FlatRing(g, fp_world)
          .ExpectAllReduceMatrixAgrees(kRd, "recursive_doubling", 17);
    }
  }
}

// The partners by position on the ring's path: with hosts {0,3},{1,4},{2,5}
// the path is 0 3 1 4 2 5, so the two fold-ins stay inside hosts.
TEST(Doubling, PartnersFollowTheRingsPathAndSendWhatThePlanSays) {
  const Hosts hosts = {{0, 3}, {1, 4}, {2, 5}};
  InProcRing ring(WorldOf(hosts), 64, [&](CommConfig& c) {
    c.ring_order = OrderOf(hosts);
    c.hosts = hosts;
  });
  const size_t count = 1000;
  const uint64_t bytes = count * 4;
  auto sent = ring.SentDuringAllReduce(count, kRd);
  // G = 6: p = 4, positions 0..3 (ranks 0 3 1 4) fold in pairs: position 1
  // (rank 3) into 0 (rank 0), position 3 (rank 4) into 2 (rank 1); virtual
  // ranks 0..3 are positions 0, 2, 4, 5 (ranks 0, 1, 2, 5).
  const std::map<int, std::map<int, uint64_t>> want = {
      {0, {{3, bytes}, {1, bytes}, {2, bytes}}},  // back to 3; v1; v2
      {3, {{0, bytes}}},                          // folds into 0
      {1, {{4, bytes}, {0, bytes}, {5, bytes}}},  // back to 4; v0; v3
      {4, {{1, bytes}}},
      {2, {{5, bytes}, {0, bytes}}},  // v2: v3, v0
      {5, {{2, bytes}, {1, bytes}}},  // v3: v2, v1
  };
  for (int r = 0; r < ring.g; ++r) {
    std::map<int, uint64_t> nonzero;
    for (const auto& [peer, b] : sent[r]) {
      if (b > 0) nonzero[peer] = b;
    }
    EXPECT_EQ(nonzero, want.at(r)) << "rank " << r;
  }
}

// Each frame carries the whole buffer: asked for above kDoublingMaxBytes
// (frames hold at most 32 MiB), an all-reduce runs the ring.
TEST(Doubling, AskedForOnALargeBufferRunsTheRing) {
  CommConfig c;
  c.world_size = 4;
  EXPECT_EQ(ResolvedAt(c, kRd, kDoublingMaxBytes), kRd);
  EXPECT_EQ(ResolvedAt(c, kRd, kDoublingMaxBytes + 4), Algorithm::kRing);
  EXPECT_EQ(ResolvedAt(c, Algorithm::kAuto, 400), kRd);
}

// auto: up to doubling_bytes (256 KiB) on a flat ring of at most
// all_to_all_max_world ranks, then halving-doubling (4 ranks) or the ring
// (halving_bytes 0); on hosts that two-level can
// use, two-level above eager_bytes; above all_to_all_max_world, the tree up
// to eager_bytes and the ring above.
TEST(Doubling, AutoRunsItUpToDoublingBytesWhereTwoLevelCannotRun) {
  CommConfig c;
  c.world_size = 4;
  auto at = [&](uint64_t bytes) {
    return ResolvedAt(c, Algorithm::kAuto, bytes);
  };
  EXPECT_EQ(at(64 << 10), kRd);
  EXPECT_EQ(at((64 << 10) + 4), kRd);
  EXPECT_EQ(at(c.doubling_bytes), kRd);
  // (Then halving-doubling on 4 ranks: halving_test.)
  EXPECT_EQ(at(c.doubling_bytes + 4), Algorithm::kHalvingDoubling);
  c.hosts = {{0, 1}, {2, 3}};
  EXPECT_EQ(at(64 << 10), kRd);
  EXPECT_EQ(at((64 << 10) + 4), Algorithm::kTwoLevel);
  c.hosts.clear();
  c.world_size = 17;
  EXPECT_EQ(at(64 << 10), Algorithm::kTree);
  EXPECT_EQ(at((64 << 10) + 4), Algorithm::kRing);
  // A doubling size below eager_bytes leaves eager_bytes the bound.
  c.world_size = 4;
  c.doubling_bytes = 0;
  c.halving_bytes = 0;
  EXPECT_EQ(at(64 << 10), kRd);
  EXPECT_EQ(at((64 << 10) + 4), Algorithm::kRing);
}

// Two ranks on one host: recursive doubling only up to eager_bytes (the
// ring's extra same-host hop costs less than reducing the other half);
// two ranks on two hosts, or whose hosts are not known, keep it up to
// doubling_bytes.
TEST(Doubling, TwoRanksOnOneHostRunTheRingAboveEagerBytes) {
  CommConfig c;
  c.world_size = 2;
  auto at = [&](uint64_t bytes) {
    return ResolvedAt(c, Algorithm::kAuto, bytes);
  };
  c.hosts = {{0, 1}};
  EXPECT_EQ(at(64 << 10), kRd);
  EXPECT_EQ(at((64 << 10) + 4), Algorithm::kRing);
  EXPECT_EQ(at(c.doubling_bytes), Algorithm::kRing);
  // Forced, it still runs.
  EXPECT_EQ(ResolvedAt(c, Algorithm::kRecursiveDoubling, c.doubling_bytes),
            kRd);
  c.hosts = {{0}, {1}};
  EXPECT_EQ(at(c.doubling_bytes), kRd);
  c.hosts.clear();
  EXPECT_EQ(at(c.doubling_bytes), kRd);
  // Four ranks on one host keep it (over TCP measured faster; on shared
  // memory within the noise, docs/performance.md).
  c.world_size = 4;
  c.hosts = {{0, 1, 2, 3}};
  EXPECT_EQ(at(c.doubling_bytes), kRd);
}

// A worker of an earlier version, whose auto runs the ring above 64 KiB
// (here: doubling_bytes and halving_bytes 0 on rank 2), meets this one's recursive doubling
// at 128 KiB: every rank fails before any buffer changes, the others name
// what rank 2 runs, well before the deadline; on 4 ranks and on 5 (one
// folds in).
TEST(Doubling, AnAutoThatRunsTheRingAbove64KiBIsNamed) {
  for (int g : {4, 5}) {
    SCOPED_TRACE(absl::StrCat("G ", g));
    InProcRing ring(g, 1 << 20, [](CommConfig& c) {
      if (c.rank == 2) {
        c.doubling_bytes = 0;
        c.halving_bytes = 0;
      }
    });
    constexpr size_t kCount = (128 << 10) / 4;
    std::vector<std::vector<float>> bufs(g, std::vector<float>(kCount, 1.0f));
    const absl::Time t0 = absl::Now();
    auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      return ring.comms[r]->AllReduce(bufs[r].data(), kCount, DType::kFloat32,
                                      ReduceOp::kSum, absl::Seconds(20),
                                      Algorithm::kAuto);
    });
    EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
    for (int r = 0; r < g; ++r) {
      ASSERT_FALSE(results[r].ok()) << "rank " << r;
      EXPECT_EQ(bufs[r], std::vector<float>(kCount, 1.0f)) << "rank " << r;
      const absl::StatusCode code = results[r].status().code();
      EXPECT_TRUE(code == absl::StatusCode::kFailedPrecondition ||
                  code == absl::StatusCode::kAborted)
          << "rank " << r << ": " << results[r].status();
      if (r == 2) continue;  // its own view: the others run another thing
      EXPECT_NE(results[r].status().message().find("runs ring"),
                absl::string_view::npos)
          << "rank " << r << ": " << results[r].status();
    }
  }
}

TEST(Doubling, AMismatchTouchesNoBufferAndTheRingRunsOn) {
  ExpectMismatchTouchesNoBuffer(kRd);
}

TEST(Doubling, AnAlgorithmMismatchIsNamed) {
  InProcRing ring = FlatRing(4, 16);
  std::vector<std::vector<float>> bufs(4, std::vector<float>(50, 1.0f));
  auto results = RunRanks<absl::StatusOr<OpResult>>(4, [&](int r) {
    return ring.comms[r]->AllReduce(bufs[r].data(), 50, DType::kFloat32,
                                    ReduceOp::kSum, absl::Seconds(10),
                                    r == 2 ? Algorithm::kNaive : kRd);
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_EQ(bufs[r], std::vector<float>(50, 1.0f)) << "rank " << r;
  }
  // Rank 2's partner in the first round (rank 3) sees its naive frame.
  EXPECT_EQ(results[3].status().code(), absl::StatusCode::kFailedPrecondition)
      << results[3].status();
}

TEST(Doubling, ARankThatNeverCallsIsNamedAndNobodyHangs) {
  ExpectMissingRankNamed(kRd);
}

// A rank killed while the partial results move (every rank reduces
// slowly): within 4 s of the kill, before its 10 s deadline, every
// survivor either fails naming it or, where every partial result it needed
// had left the dead rank before it died, ends with the whole, right sum.
TEST(Doubling, AKilledRankIsNamedByEverySurvivor) {
  // Its partner of the second round waits for it at least.
  ExpectKilledRankNamed(kRd, /*min_failed=*/1);
}

}  // namespace
}  // namespace halka
