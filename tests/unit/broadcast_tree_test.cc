// The tree broadcast (Algorithm::kTree for OpKind::kBroadcast,
// core/algorithms/broadcast.cc) on in-process rings, with hosts
// (CommConfig::hosts, as the rendezvous publishes them) and without: every
// rank ends with the root's bytes from every root, at any chunk count; the
// tree is a binomial tree of the hosts' leaders, then one in each host, so
// exactly H-1 of its edges cross hosts and each carries the buffer once;
// auto runs it up to one chunk and the chain above; a collective that does
// not implement it is refused.
#include <algorithm>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/algorithms/algorithms.h"
#include "core/communicator.h"
#include "core/ring_plan.h"
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
using halka::testing::WorldOf;

// A ring in the hosts' order; one host of the whole ring stands for a ring
// without hosts (config.hosts empty).
InProcRing BroadcastRing(const Hosts& hosts, size_t chunk_bytes) {
  return InProcRing(WorldOf(hosts), chunk_bytes, [&](CommConfig& c) {
    c.ring_order = OrderOf(hosts);
    if (hosts.size() >= 2) c.hosts = hosts;
  });
}

int CeilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// One host of 1, 2, 3, 5, 8 and 9 ranks (no hosts: the flat tree over the
// ring, which the ring order scrambles in one), and MultiHostShapes.
std::vector<Hosts> Shapes() {
  std::vector<Hosts> shapes = {{{0}},
                               {{0, 1}},
                               {{0, 1, 2}},
                               {{0, 1, 2, 3, 4}},
                               {{3, 1, 5, 0, 2, 4, 6, 7}},
                               {{0, 1, 2, 3, 4, 5, 6, 7, 8}}};
  for (Hosts& h : halka::testing::MultiHostShapes()) {
    shapes.push_back(std::move(h));
  }
  return shapes;
}

// The tree from every root is a spanning tree (each rank but the root has
// one parent, which lists it among its children, and is one step deeper),
// H-1 of its edges cross hosts (a host's ranks hear from outside once),
// and it is no deeper than ceil(log2 H) + ceil(log2 of the widest host).
TEST(BroadcastTree, FromEveryRootASpanningTreeCrossingEachHostOnce) {
  for (const Hosts& hosts : Shapes()) {
    SCOPED_TRACE(Name(hosts));
    const int g = WorldOf(hosts);
    const int h = static_cast<int>(hosts.size());
    int widest = 0;
    for (const auto& host : hosts) {
      widest = std::max(widest, static_cast<int>(host.size()));
    }
    const RingPath path(g, OrderOf(hosts));
    for (int root = 0; root < g; ++root) {
      SCOPED_TRACE(absl::StrCat("root ", root));
      std::vector<BroadcastTree> trees;
      for (int r = 0; r < g; ++r) {
        CommConfig c;
        c.rank = r;
        c.world_size = g;
        if (h >= 2) c.hosts = hosts;
        trees.push_back(BroadcastTreeOf(c, path, root));
      }
      int crossing = 0;
      std::vector<int> heard(static_cast<size_t>(g), 0);
      for (int r = 0; r < g; ++r) {
        const BroadcastTree& t = trees[static_cast<size_t>(r)];
        if (r == root) {
          EXPECT_EQ(t.parent, -1);
          EXPECT_EQ(t.depth, 0);
        } else {
          ASSERT_GE(t.parent, 0) << "rank " << r;
          ASSERT_LT(t.parent, g);
          const BroadcastTree& p = trees[static_cast<size_t>(t.parent)];
          EXPECT_EQ(std::count(p.children.begin(), p.children.end(), r), 1)
              << r << "'s parent " << t.parent;
          EXPECT_EQ(t.depth, p.depth + 1) << "rank " << r;
          EXPECT_LE(t.depth, (h >= 2 ? CeilLog2(h) : 0) + CeilLog2(widest));
          if (h >= 2 && HostOf(hosts, t.parent) != HostOf(hosts, r)) {
            ++crossing;
          }
        }
        for (int child : t.children) ++heard[static_cast<size_t>(child)];
      }
      for (int r = 0; r < g; ++r) {
        EXPECT_EQ(heard[static_cast<size_t>(r)], r == root ? 0 : 1)
            << "rank " << r;
      }
      EXPECT_EQ(crossing, h >= 2 ? h - 1 : 0);
    }
  }
}

TEST(BroadcastTree, EveryShapeRootAndChunkCountEndsWithTheRootsBytes) {
  for (const Hosts& hosts : Shapes()) {
    // 40-byte chunks: 1001 int64 elements are 201 chunks, 3 elements one.
    InProcRing ring = BroadcastRing(hosts, 40);
    for (int root = 0; root < ring.g; ++root) {
      for (const DType dtype : {DType::kInt64, DType::kBFloat16}) {
        for (const size_t count : {size_t{3}, size_t{1001}}) {
          SCOPED_TRACE(absl::StrCat(Name(hosts), " root ", root, " ",
                                    DTypeName(dtype), " x ", count));
          std::vector<std::vector<uint8_t>> bufs =
              MakeRanksData(dtype, ReduceOp::kSum, count, ring.g, 7);
          const std::vector<uint8_t> expected = bufs[root];
          const InProcRing::Results results =
              ring.Broadcast(bufs, count, dtype, root, Algorithm::kTree);
          for (int r = 0; r < ring.g; ++r) {
            ASSERT_TRUE(results[r].ok()) << results[r].status();
            if (ring.g >= 2) EXPECT_EQ(results[r]->algorithm, "tree");
            ASSERT_EQ(bufs[r], expected) << "rank " << r;
          }
        }
      }
    }
  }
}

// What each rank sent: the buffer once to each of its tree's children,
// nothing else; across hosts H-1 buffers in all.
TEST(BroadcastTree, EachRankSendsTheBufferOncePerChildAndHMinusOneCrossHosts) {
  const std::vector<Hosts> shapes = {{{0, 1}, {2, 3}, {4, 5}, {6, 7}},
                                     {{0, 1, 2}, {3}, {4, 5}},
                                     {{0, 3}, {1, 4}, {2, 5}},
                                     {{0, 1, 2, 3, 4, 5}}};
  for (const Hosts& hosts : shapes) {
    InProcRing ring = BroadcastRing(hosts, 4096);
    const int g = ring.g;
    const int h = static_cast<int>(hosts.size());
    const RingPath path(g, OrderOf(hosts));
    for (int root : {0, g - 1, g / 2}) {
      SCOPED_TRACE(absl::StrCat(Name(hosts), " root ", root));
      const size_t count = 6000;  // 6 chunks of 4 KiB
      std::vector<std::map<int, uint64_t>> before;
      for (int r = 0; r < g; ++r) before.push_back(ring.SentBy(r));
      std::vector<std::vector<float>> bufs(
          static_cast<size_t>(g), std::vector<float>(count, 1.5f));
      const InProcRing::Results results =
          ring.Broadcast(bufs, count, DType::kFloat32, root, Algorithm::kTree);
      uint64_t across = 0;
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(results[r].ok()) << results[r].status();
        std::map<int, uint64_t> sent = ring.SentBy(r);
        for (auto& [peer, bytes] : sent) bytes -= before[r][peer];
        CommConfig c = ring.comms[r]->config();
        const BroadcastTree t = BroadcastTreeOf(c, path, root);
        std::map<int, uint64_t> owed;
        for (int child : t.children) owed[child] = count * 4;
        for (const auto& [peer, bytes] : sent) {
          EXPECT_EQ(bytes, owed[peer]) << r << "->" << peer;
          if (h >= 2 && HostOf(hosts, peer) != HostOf(hosts, r)) {
            across += bytes;
          }
        }
      }
      EXPECT_EQ(across, h >= 2 ? uint64_t(h - 1) * count * 4 : 0u);
    }
  }
}

TEST(BroadcastTree, AutoRunsTheTreeUpToOneChunkAndTheChainAbove) {
  InProcRing ring = BroadcastRing({{0, 1}, {2, 3}}, 4096);
  for (const auto& [count, ran] :
       std::vector<std::pair<size_t, std::string>>{{1024, "tree"},
                                                   {1025, "ring"}}) {
    std::vector<std::vector<float>> bufs(4, std::vector<float>(count, 2.0f));
    for (float& v : bufs[1]) v = 7.0f;
    const InProcRing::Results results =
        ring.Broadcast(bufs, count, DType::kFloat32, 1);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(results[r]->algorithm, ran) << count << " elements";
      EXPECT_EQ(bufs[r], bufs[1]);
    }
  }
  // Two ranks: the chain is one hop.
  InProcRing two = BroadcastRing({{0, 1}}, 4096);
  std::vector<std::vector<float>> bufs(2, std::vector<float>(8, 3.0f));
  const InProcRing::Results results = two.Broadcast(bufs, 8, DType::kFloat32, 0);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_EQ(results[0]->algorithm, "ring");
}

TEST(BroadcastTree, AnAlgorithmThatDoesNotBroadcastIsRefusedAndTheNextCallRuns) {
  InProcRing ring = BroadcastRing({{0, 1, 2}}, 4096);
  std::vector<std::vector<float>> bufs(3, std::vector<float>(16, 1.0f));
  for (float& v : bufs[0]) v = 4.0f;
  const InProcRing::Results refused =
      ring.Broadcast(bufs, 16, DType::kFloat32, 0, Algorithm::kNaive);
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(refused[r].ok());
    EXPECT_EQ(refused[r].status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(refused[r].status().message().find("use auto, ring"),
              std::string::npos)
        << refused[r].status();
    EXPECT_EQ(bufs[r][0], r == 0 ? 4.0f : 1.0f);  // untouched
  }
  const InProcRing::Results ran =
      ring.Broadcast(bufs, 16, DType::kFloat32, 0, Algorithm::kTree);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(ran[r].ok()) << ran[r].status();
    EXPECT_EQ(bufs[r], bufs[0]);
  }
}

// Ranks that ask for different broadcasts disagree on the fingerprint:
// every rank fails, naming the disagreement, before any byte moves.
TEST(BroadcastTree, RanksAskingForTreeAndChainFailBeforeAnyByteMoves) {
  InProcRing ring = BroadcastRing({{0, 1}, {2, 3}}, 4096);
  std::vector<std::vector<float>> bufs(4, std::vector<float>(64, 1.0f));
  for (float& v : bufs[0]) v = 9.0f;
  const InProcRing::Results results =
      halka::testing::RunRanks<absl::StatusOr<OpResult>>(4, [&](int r) {
        return ring.comms[r]->Broadcast(
            bufs[r].data(), 64, DType::kFloat32, 0, absl::Seconds(10),
            r == 2 ? Algorithm::kRing : Algorithm::kTree);
      });
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_EQ(results[r].status().code(),
              absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    EXPECT_EQ(bufs[r][0], r == 0 ? 9.0f : 1.0f) << "rank " << r;
  }
}

// Beyond 16 ranks only ring neighbours are watched by default, and an
// ABORT goes to the ranks watched. On a flat ring of 20 from root 0, rank
// 16 is the root's child and the parent of 17 and 18 (18 of 19); killed
// while the data moves, every survivor still in the operation fails within
// 5 s of the kill, well before its 10 s deadline, naming it. (A binomial
// subtree is contiguous in ring order, so the dead rank's successor, which
// watches it, starts the ABORT along the subtree; the tree also watches its
// parent and children, as the tree all-reduce does.)
TEST(BroadcastTree, AParentKilledMidwayIsNamedPromptlyBeyondSixteenRanks) {
  InProcRing ring(20, 4096);
  const int g = ring.g;
  const int dead = 16;
  const size_t count = size_t{8} << 20;  // 32 MiB: 8,192 chunks
  std::vector<std::vector<float>> bufs(static_cast<size_t>(g),
                                       std::vector<float>(count, 1.0f));
  std::vector<absl::StatusOr<OpResult>> results(static_cast<size_t>(g));
  std::vector<absl::Time> ended(static_cast<size_t>(g));
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    threads.emplace_back([&, r] {
      results[r] = ring.comms[r]->Broadcast(bufs[r].data(), count,
                                            DType::kFloat32, 0,
                                            absl::Seconds(10), Algorithm::kTree);
      ended[r] = absl::Now();
    });
  }
  absl::SleepFor(absl::Milliseconds(150));
  ring.net.Kill(dead);
  const absl::Time killed = absl::Now();
  for (auto& t : threads) t.join();
  int failed = 0;
  for (int r = 0; r < g; ++r) {
    if (r == dead || results[r].ok()) continue;  // done before the kill
    ++failed;
    EXPECT_LT(ended[r] - killed, absl::Seconds(5))
        << "rank " << r << ": " << results[r].status();
    EXPECT_NE(results[r].status().message().find("rank 16"),
              absl::string_view::npos)
        << "rank " << r << ": " << results[r].status();
  }
  // The dead rank's subtree cannot have finished: it was cut mid-way.
  for (int r : {17, 18, 19}) {
    EXPECT_FALSE(results[r].ok()) << "rank " << r << " finished";
  }
  EXPECT_GE(failed, 3);
}

}  // namespace
}  // namespace halka
