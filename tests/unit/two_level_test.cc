// The two-level all-reduce (Algorithm::kTwoLevel, core/algorithms/ring.cc)
// on in-process rings whose members sit on hosts (CommConfig::hosts, as the
// rendezvous publishes them): every rank ends with the same bits, within
// the reference's bound (exact for integers, MIN and MAX); the data that
// crosses between hosts is exactly 2(H-1)/H of the buffer per cross-host
// ring, and goes only to the rank of the same local position on the next
// host; hosts it cannot use (one host, one rank per host, uneven hosts)
// run the flat ring.
#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/algorithms/algorithms.h"
#include "core/communicator.h"
#include "core/ring_plan.h"
#include "core/telemetry.h"
#include "core/testing/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/inproc_ring.h"

namespace halka {
namespace {

using halka::testing::InProcRing;

using Hosts = std::vector<std::vector<int>>;

// The ring order that keeps each host's ranks adjacent, hosts in order.
std::vector<int> OrderOf(const Hosts& hosts) {
  std::vector<int> order;
  for (const auto& h : hosts) order.insert(order.end(), h.begin(), h.end());
  return order;
}

int WorldOf(const Hosts& hosts) {
  int g = 0;
  for (const auto& h : hosts) g += static_cast<int>(h.size());
  return g;
}

struct HostRing : InProcRing {
  HostRing(const Hosts& hosts, size_t chunk_bytes, int fp_world)
      : InProcRing(WorldOf(hosts), chunk_bytes, [&](CommConfig& c) {
          c.ring_order = OrderOf(hosts);
          c.hosts = hosts;
          c.all_to_all_max_world = fp_world;
        }) {}
};

std::string Name(const Hosts& hosts) {
  std::vector<std::string> parts;
  for (const auto& h : hosts) parts.push_back(absl::StrJoin(h, ","));
  return absl::StrJoin(parts, " | ");
}

// 2x2, 2x3, 4x2, 3x2 with hosts interleaved in rank order, 2x4.
std::vector<Hosts> Shapes() {
  return {{{0, 1}, {2, 3}},
          {{0, 1, 2}, {3, 4, 5}},
          {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
          {{0, 3}, {1, 4}, {2, 5}},
          {{0, 2, 4, 6}, {1, 3, 5, 7}}};
}

int HostOf(const Hosts& hosts, int rank) {
  for (size_t i = 0; i < hosts.size(); ++i) {
    for (int r : hosts[i]) {
      if (r == rank) return static_cast<int>(i);
    }
  }
  return -1;
}

TEST(TwoLevel, EveryShapeCountOpAndDtypeAgreesEverywhereAndWithTheReference) {
  for (const Hosts& hosts : Shapes()) {
    for (int fp_world : {16, 1}) {  // fingerprints all-to-all, around the ring
      HostRing ring(hosts, 40, fp_world);
      const int g = ring.g;
      for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBFloat16}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
          for (size_t count : {size_t{1}, size_t{5}, size_t{1001}}) {
            SCOPED_TRACE(absl::StrCat(Name(hosts), " fp_world ", fp_world, " ",
                                      DTypeName(dtype), " op ",
                                      static_cast<int>(op), " count ", count));
            std::vector<std::vector<uint8_t>> inputs =
                MakeRanksData(dtype, op, count, g, 11);
            std::vector<std::vector<uint8_t>> bufs = inputs;
            auto results =
                ring.AllReduce(bufs, count, dtype, op, Algorithm::kTwoLevel);
            for (int r = 0; r < g; ++r) {
              ASSERT_TRUE(results[r].ok()) << results[r].status();
              EXPECT_EQ(results[r]->algorithm, "two_level");
              ASSERT_EQ(bufs[r], bufs[0]) << "rank " << r;
            }
            const CheckResult check =
                CheckAllReduce(dtype, op, inputs, bufs[0].data(), count);
            EXPECT_EQ(check.wrong, 0u) << check.first;
          }
        }
      }
    }
  }
}

// Per rank: the bytes it sent to each peer, over the ring's life.
std::map<int, uint64_t> SentBy(const InProcRing& ring, int r) {
  std::map<int, uint64_t> sent;
  const Telemetry t = ring.comms[r]->GetTelemetry();
  for (const auto& [peer, edge] : t.edges_total) sent[peer] = edge.bytes_sent;
  return sent;
}

TEST(TwoLevel, OnlyTheCrossHostRingsCrossHostsAndWithTheirShareOnly) {
  for (const Hosts& hosts : Shapes()) {
    SCOPED_TRACE(Name(hosts));
    HostRing ring(hosts, 4096, 16);
    const int g = ring.g;
    const int h = static_cast<int>(hosts.size());
    const size_t count = 6000;
    std::vector<std::vector<uint8_t>> bufs =
        MakeRanksData(DType::kFloat32, ReduceOp::kSum, count, g, 5);
    std::vector<std::map<int, uint64_t>> before(static_cast<size_t>(g));
    for (int r = 0; r < g; ++r) before[r] = SentBy(ring, r);
    auto results = ring.AllReduce(bufs, count, DType::kFloat32,
                                  ReduceOp::kSum, Algorithm::kTwoLevel);
    uint64_t across = 0;
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      const int host = HostOf(hosts, r);
      const auto& mine = hosts[static_cast<size_t>(host)];
      const int local = static_cast<int>(
          std::find(mine.begin(), mine.end(), r) - mine.begin());
      const int cross_succ =
          hosts[static_cast<size_t>((host + 1) % h)][static_cast<size_t>(local)];
      for (auto [peer, bytes] : SentBy(ring, r)) {
        const uint64_t sent = bytes - before[r][peer];
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

}  // namespace
}  // namespace halka
