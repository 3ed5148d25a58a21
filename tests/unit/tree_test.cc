// The tree all-reduce (Algorithm::kTree, core/algorithms/tree.cc) on
// in-process rings, with hosts (CommConfig::hosts, as the rendezvous
// publishes them) and without: every rank ends with the same bits, within
// the reference's bound (exact for integers, MIN and MAX), at any chunk
// count; a host's ranks talk only to their leader, and only the two
// trees' edges between leaders cross hosts, each carrying its tree's half
// of the buffer once up and once down; a mismatch touches no buffer; a rank that never calls is
// named, and nobody hangs.
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
#include "tests/testing/hosts.h"
#include "tests/testing/inproc_ring.h"

namespace halka {
namespace {

using halka::testing::Flat;
using halka::testing::HostOf;
using halka::testing::Hosts;
using halka::testing::InProcRing;
using halka::testing::MultiHostShapes;
using halka::testing::Name;
using halka::testing::OrderOf;
using halka::testing::WorldOf;
using halka::testing::RunRanks;

// A ring of `hosts` (one host per rank, in rank order, when it is a list
// of single ranks: the flat tree).
InProcRing TreeRing(const Hosts& hosts, size_t chunk_bytes, int fp_world) {
  return InProcRing(WorldOf(hosts), chunk_bytes, [&](CommConfig& c) {
    c.ring_order = OrderOf(hosts);
    c.hosts = hosts.size() >= 2 && hosts[0].size() == 1 &&
                      WorldOf(hosts) == static_cast<int>(hosts.size())
                  ? Hosts{}
                  : hosts;
    c.all_to_all_max_world = fp_world;
  });
}

// Flat trees of 2, 3, 5 and 8 ranks, and MultiHostShapes.
std::vector<Hosts> Shapes() {
  std::vector<Hosts> shapes = {Flat(2), Flat(3), Flat(5), Flat(8)};
  for (Hosts& h : MultiHostShapes()) shapes.push_back(std::move(h));
  return shapes;
}

TEST(Tree, EveryShapeCountOpAndDtypeAgreesEverywhereAndWithTheReference) {
  for (const Hosts& hosts : Shapes()) {
    for (int fp_world : {16, 1}) {  // fingerprints all-to-all, around the ring
      SCOPED_TRACE(absl::StrCat(Name(hosts), " fp_world ", fp_world));
      // 1001 elements in 40-byte chunks: more chunks than the leaders' lag,
      // so results come down while partial sums still go up.
      TreeRing(hosts, 40, fp_world)
          .ExpectAllReduceMatrixAgrees(Algorithm::kTree, "tree", 13);
    }
  }
}

TEST(Tree, TheShapesAreABinaryTreeOfLeadersInHostOrderAndItsMirror) {
  CommConfig c;
  c.world_size = 8;
  c.hosts = {{6, 7}, {0, 1}, {4, 5}, {2, 3}};
  const RingPath path(8, OrderOf(c.hosts));
  // Tree 0: hosts 0 (root), 1 and 2 its children, 3 under 1. Tree 1, the
  // mirror: host 3 the root, 2 and 1 its children, 0 under 2.
  c.rank = 6;  // host 0's leader
  TreeShape t = TreeShapeOf(c, path);
  EXPECT_EQ(t.parent[0], -1);
  EXPECT_EQ(t.children[0], (std::vector<int>{0, 4}));
  EXPECT_EQ(t.parent[1], 4);
  EXPECT_TRUE(t.children[1].empty());
  EXPECT_EQ(t.members, (std::vector<int>{7}));
  c.rank = 0;  // host 1's leader
  t = TreeShapeOf(c, path);
  EXPECT_EQ(t.parent[0], 6);
  EXPECT_EQ(t.children[0], (std::vector<int>{2}));
  EXPECT_EQ(t.parent[1], 2);
  EXPECT_TRUE(t.children[1].empty());
  c.rank = 2;  // host 3's leader: a leaf of tree 0, the root of tree 1
  t = TreeShapeOf(c, path);
  EXPECT_EQ(t.parent[0], 0);
  EXPECT_TRUE(t.children[0].empty());
  EXPECT_EQ(t.parent[1], -1);
  EXPECT_EQ(t.children[1], (std::vector<int>{4, 0}));
  c.rank = 3;  // a member of host 3
  t = TreeShapeOf(c, path);
  EXPECT_EQ(t.leader, 2);
  for (int tree = 0; tree < 2; ++tree) {
    EXPECT_EQ(t.parent[tree], -1);
    EXPECT_TRUE(t.children[tree].empty());
  }
  EXPECT_TRUE(t.members.empty());
  // No usable hosts: every rank its own host, in ring order.
  c.hosts = {{0, 1, 2, 3, 4, 5, 6, 7}};
  c.rank = 5;
  t = TreeShapeOf(c, RingPath(8, {3, 1, 5, 0, 2, 4, 6, 7}));
  EXPECT_FALSE(TreeHostsUsable(c));
  EXPECT_EQ(t.leader, 5);
  EXPECT_EQ(t.parent[0], 3);  // position 2's parent is position 0
  EXPECT_EQ(t.children[0], (std::vector<int>{4, 6}));  // positions 5 and 6
  // Mirrored: rank 5 takes heap place 7 - 2 = 5, whose parent place 2
  // holds ring position 7 - 2 = 5: rank 4.
  EXPECT_EQ(t.parent[1], 4);
  EXPECT_TRUE(t.children[1].empty());
}

// Every leader is inner (has children) in at most one of the two trees,
// so that its links carry at most twice the buffer each way.
TEST(Tree, NoLeaderIsInnerInBothTrees) {
  for (int n = 2; n <= 33; ++n) {
    CommConfig c;
    c.world_size = n;
    std::vector<int> order(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) order[static_cast<size_t>(r)] = r;
    for (int r = 0; r < n; ++r) {
      c.rank = r;
      const TreeShape t = TreeShapeOf(c, RingPath(n, order));
      EXPECT_FALSE(!t.children[0].empty() && !t.children[1].empty())
          << "rank " << r << " of " << n;
      const int degree = static_cast<int>(t.children[0].size() +
                                          t.children[1].size()) +
                         (t.parent[0] >= 0) + (t.parent[1] >= 0);
      EXPECT_LE(degree, 4) << "rank " << r << " of " << n;
    }
  }
}

TEST(Tree, HostRanksTalkToTheirLeaderAndOnlyTreeEdgesCrossHosts) {
  const std::vector<Hosts> shapes = {{{0, 1}, {2, 3}, {4, 5}, {6, 7}},
                                     {{0, 1, 2}, {3}, {4, 5}},
                                     {{0, 3}, {1, 4}, {2, 5}},
                                     Flat(6)};
  for (const Hosts& hosts : shapes) {
    SCOPED_TRACE(Name(hosts));
    InProcRing ring = TreeRing(hosts, 4096, 16);
    const int g = ring.g;
    const int h = static_cast<int>(hosts.size());
    // 6000 elements are 6 chunks of 4 KiB, over both trees; 2000 are
    // under two chunks, all on tree 0.
    for (const size_t count : {size_t{6000}, size_t{2000}}) {
      SCOPED_TRACE(absl::StrCat(count, " elements"));
      const std::vector<std::map<int, uint64_t>> sent_by =
          ring.SentDuringAllReduce(count, Algorithm::kTree);
      uint64_t across = 0;
      for (int r = 0; r < g; ++r) {
        const TreeShape t = TreeShapeOf(ring.comms[r]->config(),
                                        RingPath(g, OrderOf(hosts)));
        // What this rank owes each peer: a member its whole buffer to the
        // leader (and a leader the result to each member); a leader, per
        // tree, that tree's half to its parent (up) and to each child
        // (down). Tree 1 has the last count/2 elements, none under two
        // chunks.
        std::map<int, uint64_t> owed;
        const size_t second = count < 2 * 1024 ? 0 : count / 2;
        const uint64_t half[2] = {(count - second) * 4, second * 4};
        if (t.local != 0) {
          owed[t.leader] = count * 4;
        } else {
          for (int m : t.members) owed[m] = count * 4;
          for (int tree = 0; tree < 2; ++tree) {
            if (half[tree] == 0) continue;
            if (t.parent[tree] >= 0) owed[t.parent[tree]] += half[tree];
            for (int ch : t.children[tree]) owed[ch] += half[tree];
          }
        }
        const int host = HostOf(hosts, r);
        for (auto [peer, sent] : sent_by[r]) {
          EXPECT_EQ(sent, owed[peer]) << r << "->" << peer;
          if (HostOf(hosts, peer) != host) across += sent;
        }
        for (auto [peer, bytes] : owed) {
          EXPECT_EQ(sent_by[r].count(peer), 1u) << r << "->" << peer;
        }
      }
      // H-1 edges between leaders in each tree, each crossed by its half up
      // and down: the buffer up and down over H-1 edges.
      EXPECT_EQ(across, 2u * static_cast<uint64_t>(h - 1) * count * 4);
    }
  }
}

// auto: up to eager_bytes the tree above all_to_all_max_world ranks
// (recursive doubling at or below it), the ring above eager_bytes (with
// doubling_bytes 0; doubling_test covers recursive doubling up to it).
TEST(Tree, AutoTakesTheTreeForSmallBuffersOnLargerWorlds) {
  for (int fp_world : {3, 5}) {
    InProcRing ring(5, 4096, [&](CommConfig& c) {
      c.all_to_all_max_world = fp_world;
      c.eager_bytes = 4096;
      c.doubling_bytes = 0;
    });
    SCOPED_TRACE(absl::StrCat("all_to_all_max_world ", fp_world));
    ring.ExpectAllReduceAgrees(DType::kFloat32, ReduceOp::kSum, 1024,
                               Algorithm::kAuto,
                               fp_world < 5 ? "tree" : "recursive_doubling",
                               3);
    ring.ExpectAllReduceAgrees(DType::kFloat32, ReduceOp::kSum, 1025,
                               Algorithm::kAuto, "ring", 3);
  }
}

// A worker older than the tree says nothing of what it runs, and its auto
// runs the ring where a newer one's runs the tree: the newer ranks name it
// before any data moves, and no rank reports success.
TEST(Tree, AnOlderWorkerWhoseAutoRunsTheRingIsNamed) {
  for (int fp_world : {16, 3}) {
    SCOPED_TRACE(absl::StrCat("all_to_all_max_world ", fp_world));
    InProcRing ring(5, 4096, [&](CommConfig& c) {
      c.all_to_all_max_world = fp_world;
      c.eager_bytes = 4096;
    });
    // What an older worker's fingerprint looks like: no resolved_algorithm.
    ring.net.SetTamper(3, [](FrameMeta& m) {
      if (m.kind == FrameKind::kFingerprint) {
        m.fingerprint.resolved = Algorithm::kAuto;
      }
    });
    const int g = ring.g;
    // Its auto runs the ring where this one's runs the tree, naive where
    // this one's runs recursive doubling.
    const Algorithm runs = fp_world < g ? Algorithm::kTree : Algorithm::kRecursiveDoubling;
    const std::string theirs = fp_world < g ? "ring" : "naive";
    std::vector<std::vector<float>> bufs(g, std::vector<float>(100, 1.0f));
    auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      return ring.comms[r]->AllReduce(bufs[r].data(), 100, DType::kFloat32,
                                      ReduceOp::kSum, absl::Seconds(5),
                                      Algorithm::kAuto);
    });
    for (int r = 0; r < g; ++r) {
      (void)runs;
      // Rank 3 checks its own view, which looks new, and really runs this
      // version: under recursive doubling it may even finish, its partners
      // having sent before they checked. A real older worker runs naive and
      // waits for every rank's fingerprint; the others' verdict is the
      // point.
      if (r == 3) continue;
      ASSERT_FALSE(results[r].ok()) << "rank " << r << " of " << g;
      EXPECT_EQ(bufs[r], std::vector<float>(100, 1.0f)) << "rank " << r;
      EXPECT_EQ(results[r].status().code(),
                absl::StatusCode::kFailedPrecondition)
          << results[r].status();
      // Its partners say so; the others, the ABORT that carries it.
      EXPECT_NE(results[r].status().message().find(absl::StrCat(
                    "rank 3 (w3, inproc:3) runs ", theirs,
                    " (a worker older than the tree")),
                absl::string_view::npos)
          << results[r].status();
    }
  }
}

TEST(Tree, AMismatchTouchesNoBuffer) {
  const Hosts hosts = {{0, 1}, {2, 3}, {4, 5}};
  for (int fp_world : {16, 1}) {
    InProcRing ring = TreeRing(hosts, 64, fp_world);
    const int g = ring.g;
    std::vector<std::vector<float>> bufs(g, std::vector<float>(300, 1.0f));
    auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      return ring.comms[r]->AllReduce(bufs[r].data(), r == 4 ? 299 : 300,
                                      DType::kFloat32, ReduceOp::kSum,
                                      absl::ZeroDuration(), Algorithm::kTree);
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_EQ(results[r].status().code(),
                absl::StatusCode::kFailedPrecondition)
          << results[r].status();
      EXPECT_EQ(bufs[r], std::vector<float>(300, 1.0f)) << "rank " << r;
    }
    // The ring runs on: the next tree all-reduce is right everywhere.
    auto again = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      return ring.comms[r]->AllReduce(bufs[r].data(), 300, DType::kFloat32,
                                      ReduceOp::kSum, absl::ZeroDuration(),
                                      Algorithm::kTree);
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(again[r].ok()) << again[r].status();
      EXPECT_EQ(bufs[r], std::vector<float>(300, static_cast<float>(g)));
    }
  }
}

// A frame of a chunk a rank already took (here every data frame of rank 2,
// host 1's leader, says it is the first chunk) fails the operation at
// once with DATA_LOSS naming the sender, not at the deadline: the frames
// a rank sets aside are each (peer, chunk) once.
TEST(Tree, AFrameOfAChunkAlreadyTakenIsDataLoss) {
  const Hosts hosts = {{0, 1}, {2, 3}};
  InProcRing ring = TreeRing(hosts, 40, 16);
  const int g = ring.g;
  ring.net.SetTamper(2, [](FrameMeta& m) {
    if (m.kind == FrameKind::kData && m.offset > 0) m.offset = 0;
  });
  std::vector<std::vector<float>> bufs(g, std::vector<float>(1001, 1.0f));
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    return ring.comms[r]->AllReduce(bufs[r].data(), 1001, DType::kFloat32,
                                    ReduceOp::kSum, absl::Seconds(60),
                                    Algorithm::kTree);
  });
  int data_loss = 0;
  for (int r = 0; r < g; ++r) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_NE(results[r].status().code(), absl::StatusCode::kDeadlineExceeded)
        << "rank " << r << ": " << results[r].status();
    if (results[r].status().code() == absl::StatusCode::kDataLoss) {
      ++data_loss;
      EXPECT_NE(results[r].status().message().find("rank 2"),
                std::string::npos)
          << results[r].status();
    }
  }
  EXPECT_GE(data_loss, 1);
}

TEST(Tree, ARankThatNeverCallsIsNamedAndNobodyHangs) {
  const Hosts hosts = {{0, 1}, {2, 3}, {4, 5}};
  InProcRing ring = TreeRing(hosts, 64, 16);
  const int g = ring.g;
  const int missing = 3;  // a member of host 1, whose leader is a child
  std::vector<std::vector<float>> bufs(g, std::vector<float>(500, 1.0f));
  const absl::Time start = absl::Now();
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    if (r == missing) return absl::StatusOr<OpResult>(absl::CancelledError("not called"));
    return ring.comms[r]->AllReduce(bufs[r].data(), 500, DType::kFloat32,
                                    ReduceOp::kSum, absl::Milliseconds(400),
                                    Algorithm::kTree);
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (int r = 0; r < g; ++r) {
    if (r == missing) continue;
    // Its deadline, or the abort of a rank whose deadline came first.
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_NE(results[r].status().message().find("rank 3"),
              absl::string_view::npos)
        << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(bufs[r], std::vector<float>(500, 1.0f)) << "rank " << r;
  }
}

// A leader killed while the tree's data moves (every rank reduces slowly,
// so it is mid-way): every survivor fails within 4 s of the kill, well
// before its 10 s deadline, naming it, whether the ABORT goes to every rank
// (fingerprints all-to-all) or to the ring's neighbours and the ranks the
// tree watches (as on the large worlds auto runs the tree on).
TEST(Tree, AKilledLeaderIsNamedByEverySurvivor) {
  const Hosts hosts = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  const int dead = 2;  // host 1's leader: the root's child, host 3's parent
  for (int fp_world : {16, 1}) {
    SCOPED_TRACE(absl::StrCat("fp_world ", fp_world));
    InProcRing ring(WorldOf(hosts), 1024, [&](CommConfig& c) {
      c.ring_order = OrderOf(hosts);
      c.hosts = hosts;
      c.all_to_all_max_world = fp_world;
      c.test_reduce_delay = absl::Milliseconds(20);
    });
    const int g = ring.g;
    std::vector<std::vector<float>> bufs(g, std::vector<float>(64 << 10, 1.0f));
    const InProcRing::KilledRun run = ring.AllReduceKilling(
        bufs, Algorithm::kTree, absl::Seconds(10), dead,
        absl::Milliseconds(300));
    const InProcRing::Results& results = run.results;
    for (int r = 0; r < g; ++r) {
      if (r == dead) continue;
      EXPECT_LT(run.after_kill[r], absl::Seconds(4))
          << "rank " << r << " ended " << run.after_kill[r] << " after the kill";
      ASSERT_FALSE(results[r].ok()) << "rank " << r;
      EXPECT_NE(results[r].status().message().find("rank 2 (w2"),
                absl::string_view::npos)
          << "rank " << r << ": " << results[r].status();
    }
  }
}

}  // namespace
}  // namespace halka
