// Real gRPC on 127.0.0.1: an embedded rendezvous and G workers in this
// process, each rank driven by its own Client on its own thread.
#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "tests/testing/run_ranks.h"
#include "worker/core/reference.h"
#include "server/rendezvous_service.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::RunRanks;

struct Harness {
  explicit Harness(int g, Client::Transfer transfer = Client::Transfer::kAuto,
                   size_t chunk_bytes = 4096) {
    LocalCluster::Options o;
    o.workers = g;
    o.chunk_bytes = chunk_bytes;  // small: many chunks per segment
    o.op_timeout = absl::Seconds(30);
    auto c = LocalCluster::Start(o);
    EXPECT_TRUE(c.ok()) << c.status();
    cluster = std::move(*c);
    Client::Options co;
    co.transfer = transfer;
    for (int r = 0; r < g; ++r) clients.push_back(cluster->Connect(r, co).value());
  }
  std::unique_ptr<LocalCluster> cluster;
  std::vector<std::unique_ptr<Client>> clients;
};

// Runs one all-reduce on every rank and checks agreement and the reference.
void CheckAllReduceOnce(Harness& h, DType dtype, ReduceOp op, size_t count,
                        Algorithm algorithm, uint64_t seed) {
  const int g = static_cast<int>(h.clients.size());
  std::vector<std::vector<uint8_t>> inputs, bufs;
  for (int r = 0; r < g; ++r) inputs.push_back(MakeRankData(dtype, op, count, r, seed));
  bufs = inputs;
  for (auto& b : bufs) b.resize(std::max<size_t>(b.size(), 1));
  auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    OpOptions oo;
    oo.algorithm = algorithm;
    return h.clients[r]->AllReduce(bufs[r].data(), count, dtype, op, oo);
  });
  const std::string what = absl::StrCat("g=", g, " ", DTypeName(dtype), " ",
                                        ReduceOpName(op), " count=", count, " ",
                                        AlgorithmName(algorithm));
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(results[r].ok()) << what << ": rank " << r << ": "
                                 << results[r].status();
    EXPECT_EQ(results[r]->rank, r);
    EXPECT_EQ(results[r]->world_size, g);
    ASSERT_EQ(std::memcmp(bufs[r].data(), bufs[0].data(),
                          count * DTypeSize(dtype)), 0)
        << what << ": rank " << r << " differs from rank 0";
  }
  const CheckResult check = CheckAllReduce(dtype, op, inputs, bufs[0].data(), count);
  EXPECT_EQ(check.wrong, 0u) << what << ": " << check.first;
}

class RingOverGrpc : public ::testing::TestWithParam<int> {};

TEST_P(RingOverGrpc, EveryDtypeOpAndCountAgreesAndMatchesReference) {
  const int g = GetParam();
  Harness h(g);
  uint64_t seed = 1;
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (size_t count : {size_t{0}, size_t{1}, static_cast<size_t>(g > 1 ? g - 1 : 2),
                           static_cast<size_t>(g + 1), size_t{1001}}) {
        CheckAllReduceOnce(h, dtype, op, count, Algorithm::kRing, ++seed);
        if (::testing::Test::HasFatalFailure()) return;
      }
      // The default (AUTO) picks the one-shot path for small buffers.
      CheckAllReduceOnce(h, dtype, op, 513, Algorithm::kAuto, ++seed);
    }
  }
  // Large, with many chunks per segment, through both algorithms.
  CheckAllReduceOnce(h, DType::kFloat32, ReduceOp::kSum, 1000003, Algorithm::kRing, 5);
  CheckAllReduceOnce(h, DType::kInt64, ReduceOp::kMax, 1000003, Algorithm::kAuto, 6);
  CheckAllReduceOnce(h, DType::kFloat16, ReduceOp::kAvg, 100003, Algorithm::kNaive, 7);
}

TEST_P(RingOverGrpc, BroadcastFromEveryRoot) {
  const int g = GetParam();
  Harness h(g);
  for (int root = 0; root < g; ++root) {
    const size_t count = 10007;
    std::vector<std::vector<uint8_t>> bufs;
    for (int r = 0; r < g; ++r) {
      bufs.push_back(MakeRankData(DType::kFloat64, ReduceOp::kSum, count, r, 11));
    }
    const std::vector<uint8_t> expected = bufs[root];
    auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
      return h.clients[r]->Broadcast(bufs[r].data(), count, DType::kFloat64, root);
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << "root " << root << " rank " << r << ": "
                                   << results[r].status();
      EXPECT_EQ(bufs[r], expected) << "root " << root << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RingOverGrpc, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("g", info.param);
                         });

TEST(Transfers, InlineSharedAndZeroCopyGiveTheSameBits) {
  const int g = 3;
  for (Client::Transfer t : {Client::Transfer::kInline,
                             Client::Transfer::kSharedMemory}) {
    Harness h(g, t);
    CheckAllReduceOnce(h, DType::kFloat32, ReduceOp::kSum, 3000017,
                       Algorithm::kRing, 21);
    CheckAllReduceOnce(h, DType::kBFloat16, ReduceOp::kMax, 77, Algorithm::kAuto, 22);
  }
  // Zero copy: buffers from AllocateHostBuffer are reduced in place.
  Harness h(g);
  std::vector<HostBuffer> bufs;
  for (int r = 0; r < g; ++r) {
    bufs.push_back(h.clients[r]->AllocateHostBuffer(4096 * sizeof(int32_t)).value());
    auto span = bufs.back().as<int32_t>();
    for (size_t i = 0; i < 4096; ++i) span[i] = static_cast<int32_t>(i) * (r + 1);
  }
  auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    return h.clients[r]->AllReduce(bufs[r].as<int32_t>().subspan(0, 4096),
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
  Harness h(g);
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
      return h.clients[r]->AllReduce(bufs[r].data(), c.count[r], c.dtype[r], c.op[r]);
    });
    EXPECT_LT(absl::Now() - t0, absl::Seconds(2)) << c.name;
    for (int r = 0; r < g; ++r) {
      ASSERT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
          << c.name << " rank " << r << ": " << results[r].status();
      const std::string msg(results[r].status().message());
      EXPECT_THAT(msg, HasSubstr("rank 0 (worker-0, ")) << c.name;
      EXPECT_THAT(msg, HasSubstr(c.expect)) << c.name;
      EXPECT_EQ(bufs[r], before) << c.name << ": data moved on rank " << r;
    }
  }
  // The ring still works afterwards.
  CheckAllReduceOnce(h, DType::kFloat32, ReduceOp::kSum, 1000, Algorithm::kRing, 3);
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
  Harness h(g);
  auto run = [&](int n) {
    auto results = RunRanks<absl::Status>(g, [&](int r) {
      std::vector<float> buf(256);
      for (int i = 0; i < n; ++i) {
        std::fill(buf.begin(), buf.end(), static_cast<float>(r + i));
        OpOptions oo;
        oo.algorithm = (i % 2) ? Algorithm::kRing : Algorithm::kAuto;
        auto res = h.clients[r]->AllReduce(absl::MakeSpan(buf), ReduceOp::kSum, oo);
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
  for (int r = 0; r < g; ++r) streams0 += h.cluster->worker(r)->open_peer_streams();
  run(1000);
  const int threads1 = CountThreads();
  const long rss1 = RssKb();
  int streams1 = 0;
  for (int r = 0; r < g; ++r) streams1 += h.cluster->worker(r)->open_peer_streams();
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
  Harness h(g, Client::Transfer::kAuto, 1 << 20);
  const size_t count = 16 << 20;  // 64 MiB per rank: still running at the kill
  std::vector<std::vector<float>> bufs(g, std::vector<float>(count, 1.0f));
  std::vector<absl::StatusOr<OpInfo>> results(g);
  std::vector<std::thread> threads;
  const std::string dead = absl::StrCat("rank 2 (worker-2, ",
                                        h.cluster->worker_address(2), ")");
  for (int r = 0; r < g; ++r) {
    if (r == 2) continue;
    threads.emplace_back([&, r] {
      OpOptions oo;
      oo.timeout = absl::Seconds(20);
      oo.algorithm = Algorithm::kRing;
      results[r] = h.clients[r]->AllReduce(absl::MakeSpan(bufs[r]), ReduceOp::kSum, oo);
    });
  }
  // Rank 2's trainer never calls; its worker dies while the others wait in
  // the operation.
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time killed = absl::Now();
  h.cluster->KillWorker(2);
  for (auto& t : threads) t.join();
  const absl::Duration took = absl::Now() - killed;
  std::printf("survivors returned %.0f ms after the kill\n",
              absl::ToDoubleMilliseconds(took));
  EXPECT_LT(took, absl::Seconds(20));
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    std::printf("rank %d: %s\n", r, results[r].status().ToString().c_str());
    EXPECT_THAT(std::string(results[r].status().message()), HasSubstr(dead))
        << "rank " << r << ": " << results[r].status();
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
  absl::Status sa;
  std::thread ta([&] { sa = a->Join(); });
  absl::SleepFor(absl::Milliseconds(200));
  absl::Status sb = b->Join();
  EXPECT_EQ(sb.code(), absl::StatusCode::kFailedPrecondition) << sb;
  EXPECT_THAT(std::string(sb.message()),
              HasSubstr("rank 1 of job dup is already held by worker first"));
  ta.join();
  EXPECT_EQ(sa.code(), absl::StatusCode::kDeadlineExceeded) << sa;
}

}  // namespace
}  // namespace halka
