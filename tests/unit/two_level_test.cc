// The two-level all-reduce (Algorithm::kTwoLevel, core/algorithms/ring.cc)
// on in-process rings whose members sit on hosts (CommConfig::hosts, as the
// rendezvous publishes them): every rank ends with the same bits, within
// the reference's bound (exact for integers, MIN and MAX); the data that
// crosses between hosts is exactly 2(H-1)/H of the buffer per cross-host
// ring, and goes only to the rank of the same local position on the next
// host; hosts it cannot use (one host, one rank per host, uneven hosts)
// run the flat ring; auto takes it above eager_bytes where it is usable.
#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/algorithms/algorithms.h"
#include "core/communicator.h"
#include "core/ring_plan.h"
#include "core/telemetry.h"
#include "core/testing/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/hosts.h"
#include "tests/testing/inproc_ring.h"

namespace halka {
namespace {

using halka::testing::HostOf;
using halka::testing::Hosts;
using halka::testing::InProcRing;
using halka::testing::Name;
using halka::testing::OrderOf;
using halka::testing::RunRanks;
using halka::testing::WorldOf;

struct HostRing : InProcRing {
  HostRing(const Hosts& hosts, size_t chunk_bytes, int fp_world)
      : InProcRing(WorldOf(hosts), chunk_bytes, [&](CommConfig& c) {
          c.ring_order = OrderOf(hosts);
          c.hosts = hosts;
          c.all_to_all_max_world = fp_world;
        }) {}
};

// 2x2, 2x3, 4x2, 3x2 with hosts interleaved in rank order, 2x4.
std::vector<Hosts> Shapes() {
  return {{{0, 1}, {2, 3}},
          {{0, 1, 2}, {3, 4, 5}},
          {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
          {{0, 3}, {1, 4}, {2, 5}},
          {{0, 2, 4, 6}, {1, 3, 5, 7}}};
}

TEST(TwoLevel, EveryShapeCountOpAndDtypeAgreesEverywhereAndWithTheReference) {
  for (const Hosts& hosts : Shapes()) {
    for (int fp_world : {16, 1}) {  // fingerprints all-to-all, around the ring
      SCOPED_TRACE(absl::StrCat(Name(hosts), " fp_world ", fp_world));
      HostRing(hosts, 40, fp_world)
          .ExpectAllReduceMatrixAgrees(Algorithm::kTwoLevel, "two_level", 11);
    }
  }
}

TEST(TwoLevel, OnlyTheCrossHostRingsCrossHostsAndWithTheirShareOnly) {
  for (const Hosts& hosts : Shapes()) {
    SCOPED_TRACE(Name(hosts));
    HostRing ring(hosts, 4096, 16);
    const int g = ring.g;
    const int h = static_cast<int>(hosts.size());
    const size_t count = 6000;
    const std::vector<std::map<int, uint64_t>> sent_by =
        ring.SentDuringAllReduce(count, Algorithm::kTwoLevel);
    uint64_t across = 0;
    for (int r = 0; r < g; ++r) {
      const int host = HostOf(hosts, r);
      const auto& mine = hosts[static_cast<size_t>(host)];
      const int local = static_cast<int>(
          std::find(mine.begin(), mine.end(), r) - mine.begin());
      const int cross_succ =
          hosts[static_cast<size_t>((host + 1) % h)][static_cast<size_t>(local)];
      for (auto [peer, sent] : sent_by[r]) {
        if (HostOf(hosts, peer) == host) continue;
        if (peer == cross_succ) {
          EXPECT_GT(sent, 0u) << r << "->" << peer;
          across += sent;
        } else {
          EXPECT_EQ(sent, 0u) << r << "->" << peer << " crosses hosts";
        }
      }
    }
    // Each cross-host ring all-reduces its part: 2(H-1) steps that together
    // carry the part once per step; the parts make up the buffer.
    EXPECT_EQ(across, 2u * static_cast<uint64_t>(h - 1) * count * 4)
        << "payload bytes across hosts";
  }
}

TEST(TwoLevel, HostsItCannotUseRunTheFlatRing) {
  const std::vector<Hosts> unusable = {
      {{0, 1, 2, 3}},          // one host
      {{0}, {1}, {2}},         // one rank per host
      {{0, 1, 2}, {3}},        // uneven
      {}};                     // not known
  for (const Hosts& hosts : unusable) {
    SCOPED_TRACE(Name(hosts));
    const int g = hosts.empty() ? 3 : WorldOf(hosts);
    InProcRing ring(g, 64, [&](CommConfig& c) {
      c.ring_order = OrderOf(hosts);
      c.hosts = hosts;
    });
    EXPECT_FALSE(TwoLevelUsable(ring.comms[0]->config()));
    const size_t count = 300;
    std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(DType::kInt64, ReduceOp::kSum, count, g, 2);
    std::vector<std::vector<uint8_t>> bufs = inputs;
    auto results = ring.AllReduce(bufs, count, DType::kInt64, ReduceOp::kSum,
                                  Algorithm::kTwoLevel);
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(results[r]->algorithm, "ring");
      EXPECT_EQ(bufs[r], bufs[0]);
    }
    EXPECT_EQ(CheckAllReduce(DType::kInt64, ReduceOp::kSum, inputs,
                             bufs[0].data(), count).wrong, 0u);
  }
}

// auto above eager_bytes: two-level on hosts it can use, the flat ring on
// hosts it cannot; at or below eager_bytes as before (naive on these
// worlds of at most all_to_all_max_world ranks).
TEST(TwoLevel, AutoTakesItAboveEagerBytesWhereHostsAllowIt) {
  const std::vector<std::pair<Hosts, bool>> shapes = {
      {{{0, 1}, {2, 3}}, true},
      {{{0, 3}, {1, 4}, {2, 5}}, true},
      {{{0, 1, 2}, {3}}, false},
      {{{0, 1, 2, 3}}, false},
      {{{0}, {1}, {2}}, false}};
  for (const auto& [hosts, usable] : shapes) {
    for (int fp_world : {16, 1}) {
      SCOPED_TRACE(absl::StrCat(Name(hosts), " fp_world ", fp_world));
      InProcRing ring(WorldOf(hosts), 256, [&](CommConfig& c) {
        c.ring_order = OrderOf(hosts);
        c.hosts = hosts;
        c.all_to_all_max_world = fp_world;
        c.eager_bytes = 4096;
        c.doubling_bytes = 0;  // the flat ring above eager_bytes
      });
      ring.ExpectAllReduceAgrees(DType::kFloat32, ReduceOp::kSum, 1025,
                                 Algorithm::kAuto, usable ? "two_level" : "ring",
                                 7);
      ring.ExpectAllReduceAgrees(DType::kInt64, ReduceOp::kMax, 512,
                                 Algorithm::kAuto,
                                 fp_world == 16 ? "recursive_doubling" : "tree",
                                 8);
    }
  }
}

// A worker whose auto runs the ring where this one's runs two-level (an
// older version): it says so in its fingerprint (resolved ring) or says
// nothing (older than the tree); either way the others name it before any
// data moves and no buffer changes.
TEST(TwoLevel, AWorkerWhoseAutoRunsTheRingIsNamedBeforeAnyDataMoves) {
  const Hosts hosts = {{0, 1}, {2, 3}};
  for (Algorithm says : {Algorithm::kRing, Algorithm::kAuto}) {
    SCOPED_TRACE(AlgorithmName(says));
    InProcRing ring(4, 256, [&](CommConfig& c) {
      c.ring_order = OrderOf(hosts);
      c.hosts = hosts;
      c.eager_bytes = 4096;
    });
    ring.net.SetTamper(2, [says](FrameMeta& m) {
      if (m.kind == FrameKind::kFingerprint) m.fingerprint.resolved = says;
    });
    std::vector<std::vector<float>> bufs(4, std::vector<float>(2000, 1.0f));
    auto results = RunRanks<absl::StatusOr<OpResult>>(4, [&](int r) {
      return ring.comms[r]->AllReduce(bufs[r].data(), 2000, DType::kFloat32,
                                      ReduceOp::kSum, absl::Seconds(5),
                                      Algorithm::kAuto);
    });
    for (int r = 0; r < 4; ++r) {
      ASSERT_FALSE(results[r].ok()) << "rank " << r;
      EXPECT_EQ(bufs[r], std::vector<float>(2000, 1.0f)) << "rank " << r;
      if (r == 2) continue;  // it checks its own view, which looks new
      EXPECT_EQ(results[r].status().code(),
                absl::StatusCode::kFailedPrecondition)
          << results[r].status();
      EXPECT_TRUE(absl::StrContains(
          results[r].status().message(),
          absl::StrCat("this rank runs two_level, rank 2 (w2, inproc:2) runs ring (",
                       says == Algorithm::kAuto ? "a worker older than the tree"
                                                : "both ask for auto")))
          << results[r].status();
    }
  }
}

}  // namespace
}  // namespace halka
