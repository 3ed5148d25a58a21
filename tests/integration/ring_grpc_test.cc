// Real gRPC on 127.0.0.1: an embedded rendezvous and G workers in this
// process, each rank driven by its own Client on its own thread.
#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "server/rendezvous_service.h"
#include "tests/testing/cluster_harness.h"
#include "tests/testing/link_counts.h"
#include "tests/testing/ring_health.h"
#include "tests/testing/run_ranks.h"
#include "tests/testing/wait_for.h"
#include "core/testing/reference.h"
#include "transport/shm/shm_link.h"
#include "transport/tcp/wire_link.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::ClusterHarness;
using halka::testing::ClusterOptions;
using halka::testing::CountsOf;
using halka::testing::LinkCounts;
using halka::testing::FetchRingHealth;
using halka::testing::RunRanks;
using halka::testing::StartRanks;
using halka::testing::WaitFor;

// World size, and which path peer links take: shared memory (the default
// for workers on one host), a wire connection of their own (the default
// between hosts), or the gRPC stream: every data path.
enum LinkPath { kShmPath = 0, kWirePath = 1, kGrpcPath = 2 };
const char* PathName(int path) {
  return path == kShmPath ? "_shm" : path == kWirePath ? "_wire" : "_grpc";
}
// A cluster of `workers` whose links take `path`.
ClusterOptions OnPath(int workers, int path, size_t chunk_bytes = 4096) {
  ClusterOptions o;
  o.workers = workers;
  o.shm_links = path == kShmPath;
  o.wire_links = path == kWirePath;
  o.chunk_bytes = chunk_bytes;
  return o;
}
class RingOverGrpc : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  int World() const { return std::get<0>(GetParam()); }
  ClusterOptions Options() const {
    return OnPath(World(), std::get<1>(GetParam()));
  }
};

TEST_P(RingOverGrpc, EveryDtypeOpAndCountAgreesAndMatchesReference) {
  const int g = World();
  ClusterHarness h(Options());
  ASSERT_TRUE(h.ok()) << h.status();
  uint64_t seed = 1;
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (size_t count : {size_t{0}, size_t{1}, static_cast<size_t>(g > 1 ? g - 1 : 2),
                           static_cast<size_t>(g + 1), size_t{1001}}) {
        h.AllReduceOnce(dtype, op, count, Algorithm::kRing, ++seed);
        if (HasFatalFailure()) return;
      }
      // The default (AUTO) picks the one-shot path for small buffers.
      h.AllReduceOnce(dtype, op, 513, Algorithm::kAuto, ++seed);
    }
  }
  // Large, with many chunks per segment, through both algorithms.
  h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, 1000003, Algorithm::kRing, 5);
  h.AllReduceOnce(DType::kInt64, ReduceOp::kMax, 1000003, Algorithm::kAuto, 6);
  h.AllReduceOnce(DType::kFloat16, ReduceOp::kAvg, 100003, Algorithm::kNaive, 7);
}

TEST_P(RingOverGrpc, BroadcastFromEveryRoot) {
  const int g = World();
  ClusterHarness h(Options());
  ASSERT_TRUE(h.ok()) << h.status();
  for (int root = 0; root < g; ++root) {
    const size_t count = 10007;
    std::vector<std::vector<uint8_t>> bufs =
        MakeRanksData(DType::kFloat64, ReduceOp::kSum, count, g, 11);
    const std::vector<uint8_t> expected = bufs[root];
    auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
      return h.client(r).Broadcast(bufs[r].data(), count, DType::kFloat64, root);
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << "root " << root << " rank " << r << ": "
                                   << results[r].status();
      EXPECT_EQ(bufs[r], expected) << "root " << root << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, RingOverGrpc,
    ::testing::Combine(::testing::Range(1, 9),
                       ::testing::Values(kShmPath, kWirePath, kGrpcPath)),
    [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
      return absl::StrCat("g", std::get<0>(info.param),
                          PathName(std::get<1>(info.param)));
    });

// A peer in another network namespace stands for another host (the
// shaped-link experiments): its offer is refused and the link stays on
// TCP, so its traffic crosses the links under test.
TEST(SharedMemoryLinks, OffersAreCheckedBeforeAnythingIsMapped) {
  auto ring = ShmRing::Create(LinkRingBytes(size_t{1} << 20));
  ASSERT_TRUE(ring.ok()) << ring.status();
  const std::string offer = FormatShmOffer(**ring);
  EXPECT_TRUE(AcceptShmOffer(offer).ok());
  std::optional<ShmOffer> parsed = ParseShmOffer(offer);
  ASSERT_TRUE(parsed.has_value());
  const std::string elsewhere =
      absl::StrCat(parsed->name, " ", parsed->token_hex, " net:[1]");
  absl::Status s = AcceptShmOffer(elsewhere).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("net:[1]"));
  EXPECT_EQ(AcceptShmOffer("garbage").status().code(),
            absl::StatusCode::kInvalidArgument);
  // Who gets an offer at all: loopback and names yes, a foreign IP no.
  EXPECT_TRUE(PeerMayShareHost("127.0.0.1:7000"));
  EXPECT_TRUE(PeerMayShareHost("worker-1:7000"));
  EXPECT_FALSE(PeerMayShareHost("198.18.255.254:7000"));
  EXPECT_FALSE(PeerMayShareHost("[2001:db8::1]:7000"));
}

// Which path the links took: every link of an embedded cluster (one
// process, one host) takes shared memory unless it is turned off, then a
// wire connection unless that is off too; a frame larger than a ring
// record (chunk_bytes 8 MiB: records of 2 MiB) arrives whole either way.
TEST(SharedMemoryLinks, TakenOnOneHostUnlessTurnedOffAndLargeFramesArriveWhole) {
  for (int path : {kShmPath, kWirePath, kGrpcPath}) {
    ClusterHarness h(OnPath(3, path, size_t{8} << 20));
    ASSERT_TRUE(h.ok()) << h.status();
    h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, 3 << 21, Algorithm::kRing, 21);
    h.AllReduceOnce(DType::kInt32, ReduceOp::kMax, 1000003, Algorithm::kNaive, 22);
    if (HasFatalFailure()) return;
    // This cluster's workers' own counters: from its start, nothing else's.
    const LinkCounts n = CountsOf(h.cluster());
    const uint64_t shm = n.shm_accepted;
    const uint64_t wire = n.wire_accepted;
    // Ring: one link per rank; naive: each rank to the two others.
    EXPECT_GE(path == kShmPath ? shm : wire, path == kGrpcPath ? 0u : 6u)
        << "path " << path;
    if (path != kShmPath) EXPECT_EQ(shm, 0u) << "path " << path;
    if (path != kWirePath) EXPECT_EQ(wire, 0u) << "path " << path;
    EXPECT_EQ(n.wire_fell_back, 0u);
  }
}

// Wire links put the ring's all-gather chunks and a broadcast's chunks
// (here 256 KiB) straight into the operations' buffers
// (core/landing.h); a chunk that arrives before its landing is
// offered is copied as before. Over shared memory and gRPC nothing lands.
// Every result checked.
TEST(WireLinks, AllGatherChunksLandInTheBufferAndTheBitsAgree) {
  for (int path : {kWirePath, kShmPath, kGrpcPath}) {
    ClusterHarness h(OnPath(4, path, size_t{256} << 10));
    ASSERT_TRUE(h.ok()) << h.status();
    const uint64_t before = CountsOf(h.cluster()).wire_landed;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, (size_t{1} << 20) + 7,
                      Algorithm::kRing, seed);
      h.AllReduceOnce(DType::kInt64, ReduceOp::kMax, (size_t{1} << 18) + 1,
                      Algorithm::kRing, seed + 10);
      if (HasFatalFailure()) return;
    }
    // Chain broadcasts: every chunk of a non-root rank only moves into
    // place too.
    for (int root : {0, 2}) {
      const size_t count = size_t{1} << 17;  // 1 MiB of float64
      std::vector<std::vector<uint8_t>> bufs =
          MakeRanksData(DType::kFloat64, ReduceOp::kSum, count, 4, 40);
      const std::vector<uint8_t> expected = bufs[static_cast<size_t>(root)];
      auto results = RunRanks<absl::StatusOr<OpInfo>>(4, [&](int r) {
        return h.client(r).Broadcast(bufs[static_cast<size_t>(r)].data(), count,
                                     DType::kFloat64, root);
      });
      for (int r = 0; r < 4; ++r) {
        ASSERT_TRUE(results[static_cast<size_t>(r)].ok())
            << results[static_cast<size_t>(r)].status();
        EXPECT_EQ(bufs[static_cast<size_t>(r)], expected)
            << "root " << root << " rank " << r;
      }
    }
    const uint64_t landed = CountsOf(h.cluster()).wire_landed - before;
    if (path == kWirePath) {
      EXPECT_GT(landed, 0u) << "no all-gather chunk landed in place";
      // At most: 3 all-gather steps on each of 4 ranks, of 4 full chunks
      // (float32) and 2 (int64) per segment, 3 times (the segments' last
      // few elements are below the smallest landing); and 4 chunks on each
      // of 3 non-root ranks for 2 broadcasts.
      EXPECT_LE(landed, 3u * 4 * (4 + 2) * 3 + 2u * 3 * 4);
    } else {
      EXPECT_EQ(landed, 0u) << "path " << path;
    }
  }
}

// Workers agree to batches on every gRPC link: there frames leave several
// to a message (an early first step with its fingerprints, frames queued
// behind a write; grpc_batch_test checks the rule itself). Where a link
// took shared memory or a wire, no frame rides the stream. Every result
// checked.
TEST(GrpcLinks, FingerprintsAndTheFirstStepShareAMessage) {
  for (int path : {kGrpcPath, kWirePath, kShmPath}) {
    ClusterHarness h(OnPath(4, path, size_t{64} << 10));
    ASSERT_TRUE(h.ok()) << h.status();
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, (size_t{1} << 18) + 3,
                      Algorithm::kRing, seed);
      h.AllReduceOnce(DType::kBFloat16, ReduceOp::kMax, 4099,
                      Algorithm::kHalvingDoubling, seed + 20);
      if (HasFatalFailure()) return;
    }
    const uint64_t batched = CountsOf(h.cluster()).grpc_frames_batched;
    if (path == kGrpcPath) {
      // Each of the 12 operations on each of 4 ranks could batch from its
      // first; the first operation on a link may go before the peer's
      // answer came.
      EXPECT_GE(batched, 4u * 10) << "fingerprints and data left apart";
    } else {
      EXPECT_EQ(batched, 0u) << "path " << path;
    }
  }
}

TEST(Transfers, InlineSharedAndZeroCopyGiveTheSameBits) {
  const int g = 3;
  for (Client::Transfer t : {Client::Transfer::kInline,
                             Client::Transfer::kSharedMemory}) {
    ClusterOptions o{g};
    o.transfer = t;
    ClusterHarness h(o);
    ASSERT_TRUE(h.ok()) << h.status();
    h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, 3000017, Algorithm::kRing, 21);
    h.AllReduceOnce(DType::kBFloat16, ReduceOp::kMax, 77, Algorithm::kAuto, 22);
  }
  // Zero copy: buffers from AllocateHostBuffer are reduced in place (by a
  // worker that is not the caller's process: in_process off).
  ClusterOptions zo{g};
  zo.in_process = false;
  ClusterHarness h(zo);
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<HostBuffer> bufs;
  for (int r = 0; r < g; ++r) {
    bufs.push_back(h.client(r).AllocateHostBuffer(4096 * sizeof(int32_t)).value());
    auto span = bufs.back().as<int32_t>();
    for (size_t i = 0; i < 4096; ++i) span[i] = static_cast<int32_t>(i) * (r + 1);
  }
  auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    return h.client(r).AllReduce(bufs[r].as<int32_t>().subspan(0, 4096),
                                   ReduceOp::kSum);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_TRUE(results[r]->zero_copy);
    EXPECT_EQ(results[r]->transfer, "shm");
    auto span = bufs[r].as<int32_t>();
    for (size_t i = 0; i < 4096; ++i) {
      ASSERT_EQ(span[i], static_cast<int32_t>(i) * 6) << "rank " << r;
    }
  }
}

TEST(Mismatch, FailsOnEveryRankWithinTwoSecondsNamingBoth) {
  const int g = 4;
  ClusterHarness h({g});
  ASSERT_TRUE(h.ok()) << h.status();
  struct Case {
    const char* name;
    size_t count[4];
    DType dtype[4];
    ReduceOp op[4];
    const char* expect;
  } cases[] = {
      {"count", {1000, 1000, 999, 1000},
       {DType::kFloat32, DType::kFloat32, DType::kFloat32, DType::kFloat32},
       {ReduceOp::kSum, ReduceOp::kSum, ReduceOp::kSum, ReduceOp::kSum},
       "float32x999"},
      {"dtype", {1000, 1000, 1000, 1000},
       {DType::kFloat32, DType::kFloat32, DType::kFloat32, DType::kFloat64},
       {ReduceOp::kSum, ReduceOp::kSum, ReduceOp::kSum, ReduceOp::kSum},
       "float64x1000"},
      {"op", {1000000, 1000000, 1000000, 1000000},
       {DType::kInt32, DType::kInt32, DType::kInt32, DType::kInt32},
       {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kSum, ReduceOp::kSum},
       "prod"},
  };
  for (const Case& c : cases) {
    std::vector<std::vector<uint8_t>> bufs(g, std::vector<uint8_t>(8000000, 7));
    const std::vector<uint8_t> before = bufs[0];
    const absl::Time t0 = absl::Now();
    auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
      return h.client(r).AllReduce(bufs[r].data(), c.count[r], c.dtype[r], c.op[r]);
    });
    EXPECT_LT(absl::Now() - t0, absl::Seconds(2)) << c.name;
    for (int r = 0; r < g; ++r) {
      ASSERT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
          << c.name << " rank " << r << ": " << results[r].status();
      const std::string msg(results[r].status().message());
      // Both calls, as the rank that compared them saw them (the small
      // cases run recursive doubling: the pair that meets the mismatch
      // names it, the others fail with its ABORT).
      EXPECT_THAT(msg, HasSubstr("ranks disagree on the operation")) << c.name;
      EXPECT_THAT(msg, HasSubstr(c.expect)) << c.name;
      EXPECT_EQ(bufs[r], before) << c.name << ": data moved on rank " << r;
    }
  }
  // The ring still works afterwards.
  h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, 1000, Algorithm::kRing, 3);
}

int CountThreads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

long RssKb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

TEST(Soak, ThousandBackToBackSmallAllReducesLeakNothing) {
  const int g = 4;
  ClusterHarness h({g});
  ASSERT_TRUE(h.ok()) << h.status();
  auto run = [&](int n) {
    auto results = RunRanks<absl::Status>(g, [&](int r) {
      std::vector<float> buf(256);
      for (int i = 0; i < n; ++i) {
        std::fill(buf.begin(), buf.end(), static_cast<float>(r + i));
        OpOptions oo;
        oo.algorithm = (i % 2) ? Algorithm::kRing : Algorithm::kAuto;
        auto res = h.client(r).AllReduce(absl::MakeSpan(buf), ReduceOp::kSum, oo);
        if (!res.ok()) return res.status();
        const float expect = static_cast<float>(6 + 4 * i);
        for (float v : buf) {
          if (v != expect) {
            return absl::InternalError(absl::StrCat("op ", i, ": ", v, " != ", expect));
          }
        }
      }
      return absl::OkStatus();
    });
    for (int r = 0; r < g; ++r) ASSERT_TRUE(results[r].ok()) << results[r];
  };
  run(100);  // warm up: links, thread pools, allocator
  const int threads0 = CountThreads();
  const long rss0 = RssKb();
  int streams0 = 0;
  for (int r = 0; r < g; ++r) streams0 += h.cluster().worker(r)->open_peer_streams();
  run(1000);
  const int threads1 = CountThreads();
  const long rss1 = RssKb();
  int streams1 = 0;
  for (int r = 0; r < g; ++r) streams1 += h.cluster().worker(r)->open_peer_streams();
  std::printf("threads %d -> %d, RSS %ld -> %ld kB, peer streams %d -> %d\n",
              threads0, threads1, rss0, rss1, streams0, streams1);
  // gRPC's pools may add a thread or two under load; a leak per operation
  // would add hundreds.
  EXPECT_LE(threads1, threads0 + 4);
  EXPECT_EQ(streams1, streams0);
  EXPECT_LT(rss1 - rss0, 20 * 1024) << "RSS grew by more than 20 MB";
}

TEST(Failure, KilledWorkerIsNamedByEverySurvivor) {
  const int g = 4;
  ClusterHarness h({g, /*ps_shards=*/0, /*chunk_bytes=*/1 << 20});
  ASSERT_TRUE(h.ok()) << h.status();
  const size_t count = 16 << 20;  // 64 MiB per rank: still running at the kill
  std::vector<std::vector<float>> bufs(g, std::vector<float>(count, 1.0f));
  const std::string dead = absl::StrCat("rank 2 (worker-2, ",
                                        h.cluster().worker_address(2), ")");
  const std::vector<int> survivors = {0, 1, 3};
  OpOptions oo;
  oo.timeout = absl::Seconds(20);
  oo.algorithm = Algorithm::kRing;
  auto running = h.StartSum(survivors, &bufs, oo);
  // Rank 2's trainer never calls; its worker dies while the others wait in
  // the operation (each survivor's ledger shows it waiting for rank 2).
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int r : survivors) {
          Communicator* comm = h.cluster().worker(r)->communicator();
          if (comm == nullptr) return false;
          const Progress p = comm->GetProgress();
          if (!p.busy || p.awaited_rank != 2) return false;
        }
        return true;
      },
      absl::Seconds(10)))
      << "ranks 0, 1 and 3 never all waited for rank 2 in the operation";
  const std::vector<absl::StatusOr<OpInfo>> results = ClusterHarness::KillAndJoin(
      running, [&] { h.cluster().KillWorker(2); }, oo.timeout);
  for (size_t i = 0; i < survivors.size(); ++i) {
    const int r = survivors[i];
    ASSERT_FALSE(results[i].ok()) << "rank " << r;
    std::printf("rank %d: %s\n", r, results[i].status().ToString().c_str());
    EXPECT_THAT(std::string(results[i].status().message()), HasSubstr(dead))
        << "rank " << r << ": " << results[i].status();
  }
}

}  // namespace
}  // namespace halka

namespace halka {
namespace {

TEST(Rendezvous, JoinTimeoutNamesWhoJoinedAndWhoIsMissing) {
  auto rv = RendezvousServer::Start("127.0.0.1:0").value();
  WorkerOptions o;
  o.job_id = "lonely";
  o.worker_id = "solo";
  o.world_size = 3;
  o.rendezvous = rv->address();
  o.join_timeout = absl::Milliseconds(500);
  auto node = WorkerNode::Create(o).value();
  const absl::Time t0 = absl::Now();
  absl::Status s = node->Join();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("1 of 3 joined (solo at "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 missing"));
}

TEST(Rendezvous, DuplicateRankIsRefusedClearly) {
  auto rv = RendezvousServer::Start("127.0.0.1:0").value();
  WorkerOptions o;
  o.job_id = "dup";
  o.world_size = 2;
  o.requested_rank = 1;
  o.rendezvous = rv->address();
  o.join_timeout = absl::Seconds(3);
  o.worker_id = "first";
  auto a = WorkerNode::Create(o).value();
  o.worker_id = "second";
  auto b = WorkerNode::Create(o).value();
  // "first" joins (and waits, in vain, for a second rank) ...
  auto first = StartRanks<absl::Status>({1}, [&](int) { return a->Join(); });
  // ... and holds rank 1 once the rendezvous lists it among the job's
  // members (pending while the job forms).
  absl::StatusOr<v1::RingHealth> health;
  ASSERT_TRUE(WaitFor(
      [&] {
        health = FetchRingHealth(rv->address(), "dup");
        if (!health.ok()) return false;  // NOT_FOUND until the first join
        for (const v1::Member& m : health->members()) {
          if (m.worker_id() == "first") return true;
        }
        return false;
      },
      absl::Seconds(2)))
      << "the rendezvous never listed worker first in job dup: "
      << (health.ok() ? health->ShortDebugString() : health.status().ToString());
  absl::Status sb = b->Join();
  EXPECT_EQ(sb.code(), absl::StatusCode::kFailedPrecondition) << sb;
  EXPECT_THAT(std::string(sb.message()),
              HasSubstr("rank 1 of job dup is already held by worker first"));
  const absl::Status sa = first.Join()[0];
  EXPECT_EQ(sa.code(), absl::StatusCode::kDeadlineExceeded) << sa;
}

}  // namespace
}  // namespace halka
