// The collectives on a ring whose path is not rank order
// (CommConfig::ring_order, as the rendezvous publishes it to keep each
// host's ranks adjacent): every result is the rank-order result (slice r is
// still rank r's, the broadcast root is a rank), every rank agrees bit for
// bit, and the data goes from each rank to its successor in the order only.
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/testing/run_ranks.h"
#include "core/communicator.h"
#include "core/testing/inproc_transport.h"
#include "tests/testing/inproc_ring.h"
#include "core/testing/reference.h"
#include "core/ring_plan.h"
#include "core/telemetry.h"

namespace halka {
namespace {

using halka::testing::InProcRing;
using halka::testing::RunRanks;

// A ring whose path is `order`.
struct OrderedRing : InProcRing {
  OrderedRing(const std::vector<int>& order, size_t chunk_bytes,
              int all_to_all_max_world)
      : InProcRing(static_cast<int>(order.size()), chunk_bytes,
                   [&](CommConfig& c) {
                     c.all_to_all_max_world = all_to_all_max_world;
                     c.ring_order = order;
                   }) {}
};

// Host-interleaved ranks (A, B, A, B, ...) as the rendezvous orders them,
// a three-host one, and a scrambled one.
std::vector<std::vector<int>> Orders() {
  return {{0, 1},          {1, 0},
          {0, 2, 1},       {0, 2, 1, 3},
          {0, 2, 4, 1, 3}, {0, 2, 4, 6, 1, 3, 5, 7},
          {0, 5, 8, 1, 4, 6, 2, 3, 7},
          {3, 0, 6, 2, 5, 1, 4}};
}

std::string Name(const std::vector<int>& order) {
  return absl::StrJoin(order, "_");
}

TEST(RingPath, PositionsAndNeighbours) {
  const RingPath p(4, {0, 2, 1, 3});
  EXPECT_EQ(p.position(2), 1);
  EXPECT_EQ(p.rank_at(5), 2);
  EXPECT_EQ(p.rank_at(-1), 3);
  EXPECT_EQ(p.succ(0), 2);
  EXPECT_EQ(p.succ(3), 0);
  EXPECT_EQ(p.pred(1), 2);
  // Empty or not a permutation: rank order.
  for (const std::vector<int>& bad :
       {std::vector<int>{}, {0, 1, 1, 3}, {0, 1, 2}, {0, 1, 2, 4}}) {
    const RingPath q(4, bad);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(q.succ(r), (r + 1) % 4);
      EXPECT_EQ(q.position(r), r);
    }
  }
}

TEST(RingOrder, AllReduceFollowsTheOrderAndMatchesTheReference) {
  for (const std::vector<int>& order : Orders()) {
    for (int fp_world : {16, 1}) {  // fingerprints all-to-all, around the ring
      SCOPED_TRACE(absl::StrCat("order ", Name(order), " fp_world ", fp_world));
      OrderedRing ring(order, 24, fp_world);
      const int g = ring.g;
      const RingPath path(g, order);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        const size_t count = 1001;
        std::vector<std::vector<uint8_t>> inputs =
            MakeRanksData(DType::kFloat32, op, count, g, 9);
        std::vector<std::vector<uint8_t>> bufs = inputs;
        auto results =
            ring.AllReduce(bufs, count, DType::kFloat32, op, Algorithm::kRing);
        for (int r = 0; r < g; ++r) {
          ASSERT_TRUE(results[r].ok()) << results[r].status();
          EXPECT_EQ(bufs[r], bufs[0]) << "rank " << r;
          EXPECT_EQ(results[r]->rank, r);
        }
        const CheckResult check =
            CheckAllReduce(DType::kFloat32, op, inputs, bufs[0].data(), count);
        EXPECT_EQ(check.wrong, 0u) << check.first;
      }
      // Data went to each rank's successor in the order, nowhere else.
      for (int r = 0; r < g; ++r) {
        const Telemetry t = ring.comms[r]->GetTelemetry();
        for (int peer = 0; peer < g; ++peer) {
          if (peer == r) continue;
          const uint64_t sent = t.edges_total.count(peer) != 0
                                    ? t.edges_total.at(peer).bytes_sent
                                    : 0;
          if (peer == path.succ(r)) {
            EXPECT_GT(sent, 0u) << r << "->" << peer;
          } else {
            EXPECT_EQ(sent, 0u) << r << "->" << peer;
          }
        }
      }
    }
  }
}

TEST(RingOrder, NaiveAllReduceAgrees) {
  for (const std::vector<int>& order : Orders()) {
    SCOPED_TRACE(Name(order));
    OrderedRing ring(order, 24, 16);
    const int g = ring.g;
    const size_t count = 77;
    std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(DType::kFloat64, ReduceOp::kSum, count, g, 4);
    std::vector<std::vector<uint8_t>> bufs = inputs;
    auto results =
        ring.AllReduce(bufs, count, DType::kFloat64, ReduceOp::kSum,
                       Algorithm::kNaive);
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(bufs[r], bufs[0]);
    }
    EXPECT_EQ(CheckAllReduce(DType::kFloat64, ReduceOp::kSum, inputs,
                             bufs[0].data(), count).wrong, 0u);
  }
}

TEST(RingOrder, SliceRIsStillRankRs) {
  for (const std::vector<int>& order : Orders()) {
    SCOPED_TRACE(Name(order));
    OrderedRing ring(order, 24, 16);
    const int g = ring.g;
    const size_t slice = 37;
    const size_t es = sizeof(float);
    // Reduce-scatter: rank r holds the reduction of slice r.
    std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(DType::kFloat32, ReduceOp::kSum, g * slice, g, 2);
    std::vector<std::vector<uint8_t>> bufs = inputs;
    auto rs = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      HostOpBuffer b(bufs[r].data());
      return ring.comms[r]->ReduceScatter(b, g * slice, slice, DType::kFloat32,
                                          ReduceOp::kSum, absl::ZeroDuration());
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(rs[r].ok()) << rs[r].status();
      EXPECT_EQ(CheckReduceScatter(DType::kFloat32, ReduceOp::kSum, inputs,
                                   bufs[r].data() + r * slice * es, r, slice)
                    .wrong,
                0u)
          << "rank " << r;
    }
    // All-gather from slice 0: slice i holds rank i's contribution.
    std::vector<std::vector<uint8_t>> mine;
    std::vector<std::vector<uint8_t>> out(
        g, std::vector<uint8_t>(g * slice * es, 0xEE));
    for (int r = 0; r < g; ++r) {
      mine.push_back(MakeRankData(DType::kFloat32, ReduceOp::kSum, slice, r, 6));
      std::copy(mine[r].begin(), mine[r].end(), out[r].begin());
    }
    auto ag = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      HostOpBuffer b(out[r].data());
      return ring.comms[r]->AllGather(b, slice, g * slice, 0, DType::kFloat32,
                                      absl::ZeroDuration());
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(ag[r].ok()) << ag[r].status();
      EXPECT_EQ(CheckAllGather(DType::kFloat32, mine, out[r].data(), slice).wrong,
                0u)
          << "rank " << r;
    }
  }
}

TEST(RingOrder, BroadcastFromEveryRootAndBarrier) {
  for (const std::vector<int>& order : Orders()) {
    SCOPED_TRACE(Name(order));
    OrderedRing ring(order, 40, 16);
    const int g = ring.g;
    ring.ExpectBroadcastFromEveryRoot();
    if (::testing::Test::HasFatalFailure()) return;
    auto barrier = RunRanks<absl::StatusOr<OpResult>>(
        g, [&](int r) { return ring.comms[r]->Barrier(absl::ZeroDuration()); });
    for (auto& b : barrier) EXPECT_TRUE(b.ok()) << b.status();
  }
}

TEST(RingOrder, MismatchStillNamesBothRanks) {
  OrderedRing ring({0, 2, 4, 6, 1, 3, 5, 7}, 24, 1);  // fingerprints in order
  const int g = ring.g;
  std::vector<std::vector<float>> bufs(g, std::vector<float>(100, 1.0f));
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    return ring.comms[r]->AllReduce(bufs[r].data(), r == 5 ? 99 : 100,
                                    DType::kFloat32, ReduceOp::kSum,
                                    absl::Seconds(20), Algorithm::kRing);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << r << ": " << results[r].status();
    EXPECT_NE(results[r].status().message().find("rank 5 (w5"),
              absl::string_view::npos)
        << results[r].status();
  }
}

}  // namespace
}  // namespace halka
