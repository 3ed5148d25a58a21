// Halving-doubling (core/algorithms/halving.cc): the same bits on every
// rank and within the reference's bound for every world (powers of two and
// the ranks that fold in beyond them), dtype, op and chunking; each rank
// sends each partner exactly what the plan says, nearest partners first
// (on hosts, the largest halves stay inside them); a mismatch touches no
// buffer; a rank that never calls or dies is named by every other, and
// nobody hangs, whether fingerprints go all-to-all or around the ring. With
// fingerprints all-to-all, a first send that reads only the caller's input
// leaves while they are compared, and changes no bit of any result.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/algorithms/algorithms.h"
#include "core/communicator.h"
#include "core/op_buffer.h"
#include "core/telemetry.h"
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

constexpr Algorithm kHd = Algorithm::kHalvingDoubling;

InProcRing FlatRing(int g, int fp_world, size_t chunk_bytes = 40) {
  return InProcRing(g, chunk_bytes, [&](CommConfig& c) {
    c.all_to_all_max_world = fp_world;
  });
}

TEST(HalvingDoubling, EveryWorldCountOpAndDtypeAgreesEverywhereAndWithTheReference) {
  for (int g : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16}) {
    for (int fp_world : {16, 1}) {
      SCOPED_TRACE(absl::StrCat("g ", g, " fp_world ", fp_world));
      FlatRing(g, fp_world).ExpectAllReduceMatrixAgrees(kHd, "halving_doubling",
                                                        23);
    }
  }
}

// Chunks larger than a block, and a buffer that p does not divide: the
// same bits everywhere, within the bound.
TEST(HalvingDoubling, AgreesWithWholeBlocksPerFrameAndUnevenBlocks) {
  for (int g : {4, 6, 8}) {
    SCOPED_TRACE(absl::StrCat("g ", g));
    FlatRing(g, 16, 1 << 20).ExpectAllReduceAgrees(
        DType::kFloat32, ReduceOp::kSum, 100003, kHd, "halving_doubling", 7);
    FlatRing(g, 16, 4096).ExpectAllReduceAgrees(
        DType::kFloat64, ReduceOp::kAvg, 100003, kHd, "halving_doubling", 8);
  }
}

// G = 8, buffer S: round k's partner (position ^ 2^k) receives S / 2^(k+1)
// in the reduce-scatter and as much back in the all-gather; nobody else
// receives anything. On two hosts of four in the ring's path order only
// round 2 crosses a host: S/8 each way per rank, 2 S / 8 of each rank's
// 14 S / 8.
TEST(HalvingDoubling, EachPartnerGetsWhatThePlanSays) {
  const Hosts hosts = {{0, 2, 4, 6}, {1, 3, 5, 7}};
  InProcRing ring(WorldOf(hosts), 4096, [&](CommConfig& c) {
    c.ring_order = OrderOf(hosts);
    c.hosts = hosts;
  });
  const size_t count = 8 * 1000;
  const uint64_t s = count * 4;
  const std::vector<int> path = OrderOf(hosts);  // 0 2 4 6 1 3 5 7
  auto sent = ring.SentDuringAllReduce(count, kHd);
  for (int pos = 0; pos < 8; ++pos) {
    const int r = path[static_cast<size_t>(pos)];
    std::map<int, uint64_t> want;
    for (int k = 0; k < 3; ++k) {
      want[path[static_cast<size_t>(pos ^ (1 << k))]] = 2 * s >> (k + 1);
    }
    std::map<int, uint64_t> nonzero;
    for (const auto& [peer, b] : sent[r]) {
      if (b > 0) nonzero[peer] = b;
    }
    EXPECT_EQ(nonzero, want) << "rank " << r;
    uint64_t across = 0;
    const bool first_host = pos < 4;
    for (const auto& [peer, b] : nonzero) {
      const bool peer_first = std::find(hosts[0].begin(), hosts[0].end(),
                                        peer) != hosts[0].end();
      if (peer_first != first_host) across += b;
    }
    EXPECT_EQ(across, 2 * s / 8) << "rank " << r;
  }
}

// G = 6: positions 1 and 3 fold their whole buffer into 0 and 2 and take
// the whole result back; the four virtual ranks (positions 0, 2, 4, 5)
// halve and double among themselves.
TEST(HalvingDoubling, RanksBeyondThePowerOfTwoFoldInAndOut) {
  InProcRing ring = FlatRing(6, 16, 4096);
  const size_t count = 4 * 1000;
  const uint64_t s = count * 4;
  auto sent = ring.SentDuringAllReduce(count, kHd);
  // Virtual rank v is at position v < 2 ? 2v : v + 2.
  const std::map<int, std::map<int, uint64_t>> want = {
      {0, {{1, s}, {2, s}, {4, s / 2}}},  // back to 1; v1 (S/2 x 2); v2
      {1, {{0, s}}},
      {2, {{3, s}, {0, s}, {5, s / 2}}},
      {3, {{2, s}}},
      {4, {{5, s}, {0, s / 2}}},
      {5, {{4, s}, {2, s / 2}}},
  };
  for (int r = 0; r < 6; ++r) {
    std::map<int, uint64_t> nonzero;
    for (const auto& [peer, b] : sent[r]) {
      if (b > 0) nonzero[peer] = b;
    }
    EXPECT_EQ(nonzero, want.at(r)) << "rank " << r;
  }
}

// auto: above doubling_bytes and up to halving_bytes on a ring of 4 or 8
// ranks without usable hosts; the ring on other worlds, above
// halving_bytes, above all_to_all_max_world and where two-level runs.
// Asked for, it runs at any size and world, as an all-reduce only.
TEST(HalvingDoubling, AutoRunsItBetweenDoublingAndHalvingBytes) {
  CommConfig c;
  auto at = [&](uint64_t bytes) {
    return ResolvedAt(c, Algorithm::kAuto, bytes);
  };
  for (int g : {4, 8}) {
    SCOPED_TRACE(absl::StrCat("g ", g));
    c.world_size = g;
    EXPECT_EQ(at(c.doubling_bytes), Algorithm::kRecursiveDoubling);
    EXPECT_EQ(at(c.doubling_bytes + 4), kHd);
    EXPECT_EQ(at(c.halving_bytes), kHd);
    EXPECT_EQ(at(c.halving_bytes + 4), Algorithm::kRing);
  }
  for (int g : {2, 3, 5, 6, 12, 16}) {
    SCOPED_TRACE(absl::StrCat("g ", g));
    c.world_size = g;
    EXPECT_EQ(at(c.doubling_bytes + 4), Algorithm::kRing);
  }
  c.world_size = 32;
  c.all_to_all_max_world = 16;
  EXPECT_EQ(at(1 << 20), Algorithm::kRing);
  c.world_size = 8;
  c.hosts = {{0, 1, 2, 3}, {4, 5, 6, 7}};
  EXPECT_EQ(at(1 << 20), Algorithm::kTwoLevel);
  c.hosts = {{0, 1, 2, 3, 4, 5, 6, 7}};
  EXPECT_EQ(at(1 << 20), kHd);
  c.world_size = 6;
  EXPECT_EQ(ResolvedAt(c, kHd, 64), kHd);
  EXPECT_EQ(ResolvedAt(c, kHd, uint64_t{64} << 20), kHd);
}

// Reduce-scatter and all-gather refuse it, naming what they run; the
// numbering holds.
TEST(HalvingDoubling, OnlyAllReduceRunsIt) {
  InProcRing ring = FlatRing(4, 16);
  std::vector<std::vector<float>> bufs(4, std::vector<float>(8, 1.0f));
  auto results = RunRanks<absl::StatusOr<OpResult>>(4, [&](int r) {
    HostOpBuffer b(bufs[r].data());
    return ring.comms[r]->ReduceScatter(b, 8, 2, DType::kFloat32,
                                        ReduceOp::kSum, absl::Seconds(10),
                                        kHd);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kUnimplemented)
        << results[r].status();
    EXPECT_NE(results[r].status().message().find("halving_doubling"),
              absl::string_view::npos)
        << results[r].status();
  }
  auto again = ring.AllReduce(bufs, 8, DType::kFloat32, ReduceOp::kSum, kHd);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(again[r].ok()) << again[r].status();
    EXPECT_EQ(bufs[r], std::vector<float>(8, 4.0f));
  }
}

// A worker of the previous version, whose auto runs the ring above
// 256 KiB (here: halving_bytes 0 on rank 2), meets this one's
// halving-doubling at 1 MiB: every rank fails before any buffer changes,
// and the others name what rank 2 runs, well before the deadline.
TEST(HalvingDoubling, AnAutoThatRunsTheRingIsNamed) {
  const int g = 4;
  InProcRing ring(g, 1 << 20, [](CommConfig& c) {
    if (c.rank == 2) c.halving_bytes = 0;
  });
  constexpr size_t kCount = (1 << 20) / 4;
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
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << "rank " << r << ": " << results[r].status();
    const std::string want = r == 2 ? "runs halving_doubling" : "runs ring";
    EXPECT_NE(results[r].status().message().find(want),
              absl::string_view::npos)
        << "rank " << r << ": " << results[r].status();
  }
}

// The fingerprints agree before any data moves: every rank fails
// FAILED_PRECONDITION naming the odd call.
TEST(HalvingDoubling, AMismatchTouchesNoBufferAndTheRingRunsOn) {
  ExpectMismatchTouchesNoBuffer(kHd);
}

// One rank asks for the ring: every rank fails before its buffer changes,
// naming what the other runs.
TEST(HalvingDoubling, AnAlgorithmMismatchIsNamed) {
  InProcRing ring = FlatRing(4, 16);
  std::vector<std::vector<float>> bufs(4, std::vector<float>(500, 1.0f));
  auto results = RunRanks<absl::StatusOr<OpResult>>(4, [&](int r) {
    return ring.comms[r]->AllReduce(bufs[r].data(), 500, DType::kFloat32,
                                    ReduceOp::kSum, absl::Seconds(10),
                                    r == 2 ? Algorithm::kRing : kHd);
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(bufs[r], std::vector<float>(500, 1.0f)) << "rank " << r;
  }
}

TEST(HalvingDoubling, ARankThatNeverCallsIsNamedAndNobodyHangs) {
  ExpectMissingRankNamed(kHd);
}

// A rank killed while the halves move (every rank reduces slowly): within
// 4 s of the kill, before the 10 s deadline, every survivor either fails
// naming it or, where every block it needed had left the dead rank before
// it died, ends with the whole, right sum.
TEST(HalvingDoubling, AKilledRankIsNamedByEverySurvivor) {
  // Its three partners wait for it at least.
  ExpectKilledRankNamed(kHd, /*min_failed=*/3);
}

// With the first send leaving before the fingerprints agree (all-to-all)
// every result is the one without it (fingerprints around the ring: no
// early send), bit for bit, on every rank, and within the reference's
// bound: worlds with and without ranks that fold in, three dtypes,
// SUM/AVG/MAX, 1, 5 and 1001 elements in 40-byte chunks.
TEST(HalvingDoublingEarly, EveryWorldCountOpAndDtypeGivesTheSameBitsAsWithoutIt) {
  for (int g : {2, 3, 4, 5, 6, 8}) {
    InProcRing early = FlatRing(g, 16);
    InProcRing plain = FlatRing(g, 1);
    for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        for (size_t count : {size_t{1}, size_t{5}, size_t{1001}}) {
          SCOPED_TRACE(absl::StrCat("g ", g, " ", DTypeName(dtype), " op ",
                                    static_cast<int>(op), " count ", count));
          const std::vector<std::vector<uint8_t>> inputs =
              MakeRanksData(dtype, op, count, g, 21);
          std::vector<std::vector<uint8_t>> a = inputs, b = inputs;
          auto ra = early.AllReduce(a, count, dtype, op, kHd);
          auto rb = plain.AllReduce(b, count, dtype, op, kHd);
          for (int r = 0; r < g; ++r) {
            ASSERT_TRUE(ra[r].ok()) << "rank " << r << ": " << ra[r].status();
            ASSERT_TRUE(rb[r].ok()) << "rank " << r << ": " << rb[r].status();
            EXPECT_EQ(ra[r]->algorithm, "halving_doubling");
            ASSERT_EQ(a[r], a[0]) << "rank " << r;
            ASSERT_EQ(a[r], b[r]) << "rank " << r << ": the early send differs";
          }
          const CheckResult check =
              CheckAllReduce(dtype, op, inputs, a[0].data(), count);
          EXPECT_EQ(check.wrong, 0u) << check.first;
        }
      }
    }
  }
}

// Which ranks' first send leaves inside the fingerprint phase, seen in a
// failed operation's trace (one rank's count disagrees, so nobody gets past
// the fingerprints): on 6 ranks, positions 1 and 3 fold into 0 and 2 (their
// whole buffer: early), 4 and 5 take no fold-in (half of it in round 0:
// early), 0 and 2 must reduce a fold-in first (nothing early). Every buffer
// stays as it was, and the next call is exact. With fingerprints around the
// ring nobody sends data early.
TEST(HalvingDoublingEarly, TheFirstSendLeavesEarlyExactlyWhereItReadsOnlyTheInput) {
  for (int fp_world : {16, 1}) {
    SCOPED_TRACE(absl::StrCat("fp_world ", fp_world));
    const int g = 6;
    const size_t n = 600;
    InProcRing ring = FlatRing(g, fp_world, 256);
    std::vector<std::vector<float>> bufs(g, std::vector<float>(n));
    for (int r = 0; r < g; ++r) {
      for (size_t i = 0; i < n; ++i) {
        bufs[r][i] = static_cast<float>((i % 11) + 10 * (r + 1));
      }
    }
    const std::vector<std::vector<float>> before = bufs;
    auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      return ring.comms[r]->AllReduce(bufs[r].data(), r == 4 ? n - 1 : n,
                                      DType::kFloat32, ReduceOp::kSum,
                                      absl::Seconds(10), kHd);
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_EQ(results[r].status().code(),
                absl::StatusCode::kFailedPrecondition)
          << "rank " << r << ": " << results[r].status();
      EXPECT_EQ(bufs[r], before[r]) << "rank " << r << "'s buffer was touched";
      const bool want = fp_world == 16 && r != 0 && r != 2;
      EXPECT_EQ(ring.SentDataBeforeAgreeing(r), want) << "rank " << r;
      // An early first step leaves with the fingerprints (HeldWrites):
      // every frame of the fingerprint phase, the 5 fingerprints and the
      // step's chunks, at one release; a rank that sends nothing early
      // holds nothing.
      EXPECT_EQ(ring.net.WritesHeld(r),
                want ? ring.SendsBeforeAgreeing(r) : size_t{0})
          << "rank " << r;
      if (want) EXPECT_GT(ring.net.WritesHeld(r), size_t{5}) << "rank " << r;
    }
    auto again = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      return ring.comms[r]->AllReduce(bufs[r].data(), n, DType::kFloat32,
                                      ReduceOp::kSum, absl::Seconds(10), kHd);
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(again[r].ok()) << again[r].status();
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(bufs[r][i],
                  static_cast<float>(g * (i % 11) + 10 * (1 + 2 + 3 + 4 + 5 + 6)))
            << "rank " << r << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace halka
