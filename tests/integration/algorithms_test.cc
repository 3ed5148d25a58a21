// Ring, naive and parameter server on the same jobs: correctness, the byte
// formulas of DESIGN.md, and the parameter server's failure contract.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "server/parameter_server.h"
#include "tests/testing/run_ranks.h"
#include "worker/core/reference.h"
#include "worker/core/ring_plan.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::RunRanks;

struct Harness {
  Harness(int g, int ps_shards, size_t chunk_bytes = 4096) {
    LocalCluster::Options o;
    o.workers = g;
    o.ps_shards = ps_shards;
    o.chunk_bytes = chunk_bytes;
    o.op_timeout = absl::Seconds(30);
    cluster = LocalCluster::Start(o).value();
    for (int r = 0; r < g; ++r) clients.push_back(cluster->Connect(r).value());
  }
  // Runs one all-reduce on every rank; returns each rank's result.
  std::vector<absl::StatusOr<OpInfo>> Run(DType dtype, ReduceOp op,
                                          size_t count, Algorithm algorithm,
                                          uint64_t seed, bool check = true) {
    const int g = static_cast<int>(clients.size());
    std::vector<std::vector<uint8_t>> inputs, bufs;
    for (int r = 0; r < g; ++r) inputs.push_back(MakeRankData(dtype, op, count, r, seed));
    bufs = inputs;
    for (auto& b : bufs) b.resize(std::max<size_t>(b.size(), 1));
    auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
      OpOptions oo;
      oo.algorithm = algorithm;
      return clients[r]->AllReduce(bufs[r].data(), count, dtype, op, oo);
    });
    if (!check) return results;
    const std::string what = absl::StrCat(
        "g=", g, " ", DTypeName(dtype), " ", ReduceOpName(op), " count=", count,
        " ", AlgorithmName(algorithm));
    for (int r = 0; r < g; ++r) {
      EXPECT_TRUE(results[r].ok()) << what << " rank " << r << ": " << results[r].status();
      if (!results[r].ok()) return results;
      EXPECT_EQ(results[r]->algorithm, AlgorithmName(algorithm)) << what;
      EXPECT_EQ(std::memcmp(bufs[r].data(), bufs[0].data(), count * DTypeSize(dtype)), 0)
          << what << ": rank " << r << " differs from rank 0";
    }
    const CheckResult c = CheckAllReduce(dtype, op, inputs, bufs[0].data(), count);
    EXPECT_EQ(c.wrong, 0u) << what << ": " << c.first;
    return results;
  }
  std::unique_ptr<LocalCluster> cluster;
  std::vector<std::unique_ptr<Client>> clients;
};

class EveryAlgorithm : public ::testing::TestWithParam<std::tuple<int, int>> {};

// PS with one and with two shards, and naive, for every dtype and op.
TEST_P(EveryAlgorithm, PsAndNaiveAgreeBitwiseAndMatchReference) {
  const auto [g, shards] = GetParam();
  Harness h(g, shards);
  uint64_t seed = 100;
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (size_t count : {size_t{1}, static_cast<size_t>(g + 1), size_t{3001}}) {
        h.Run(dtype, op, count, Algorithm::kParameterServer, ++seed);
        h.Run(dtype, op, count, Algorithm::kNaive, ++seed);
        if (HasFailure()) return;
      }
    }
  }
  h.Run(DType::kFloat32, ReduceOp::kSum, 0, Algorithm::kParameterServer, 1);
  h.Run(DType::kFloat32, ReduceOp::kAvg, 500009, Algorithm::kParameterServer, 2);
  h.Run(DType::kInt64, ReduceOp::kSum, 500009, Algorithm::kNaive, 3);
}

INSTANTIATE_TEST_SUITE_P(
    WorldsAndShards, EveryAlgorithm,
    ::testing::Combine(::testing::Values(1, 2, 3, 5, 8), ::testing::Values(1, 2)),
    [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
      return absl::StrCat("g", std::get<0>(info.param), "_shards",
                          std::get<1>(info.param));
    });

// DESIGN.md, "The problem, in numbers", in elements:
//   ring:  2(G-1)N over all links; each worker 2N - |seg r+1| - |seg r+2|,
//          i.e. 2(G-1)N/G within 2 elements (segments differ by one);
//   naive: G(G-1)N over all links, (G-1)N per worker;
//   PS (dedicated server): GN into and GN out of the server, N per worker.
TEST(ByteFormulas, MatchDesignExactly) {
  for (int g = 2; g <= 8; ++g) {
    Harness h(g, 1, 1 << 16);
    for (size_t n : {size_t{1}, static_cast<size_t>(g - 1), size_t{1000},
                     size_t{65537}, static_cast<size_t>(100003)}) {
      const uint64_t es = 4;
      const std::string what = absl::StrCat("G=", g, " N=", n);
      // Ring.
      auto ring = h.Run(DType::kFloat32, ReduceOp::kSum, n, Algorithm::kRing, n);
      uint64_t total = 0;
      const std::vector<Range> segs = PlanSegments(n, g);
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(ring[r].ok());
        const uint64_t sent = ring[r]->bytes_sent / es;
        const uint64_t expect = 2 * n - segs[Mod(r + 1, g)].count - segs[Mod(r + 2, g)].count;
        EXPECT_EQ(sent, expect) << what << " ring rank " << r;
        EXPECT_NEAR(static_cast<double>(sent), 2.0 * (g - 1) * n / g, 2.0) << what;
        // It receives what its predecessor sends.
        EXPECT_EQ(ring[r]->bytes_received / es,
                  2 * n - segs[r].count - segs[Mod(r + 1, g)].count)
            << what << " ring rank " << r;
        total += sent;
      }
      EXPECT_EQ(total, 2ull * (g - 1) * n) << what << " ring total";
      // Naive (one-shot for small buffers, chunked above; same bytes).
      auto naive = h.Run(DType::kFloat32, ReduceOp::kSum, n, Algorithm::kNaive, n);
      total = 0;
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(naive[r].ok());
        EXPECT_EQ(naive[r]->bytes_sent / es, (g - 1) * n) << what << " naive";
        EXPECT_EQ(naive[r]->bytes_received / es, (g - 1) * n) << what << " naive";
        total += naive[r]->bytes_sent / es;
      }
      EXPECT_EQ(total, static_cast<uint64_t>(g) * (g - 1) * n) << what << " naive total";
      // Parameter server.
      const PsStats before = h.cluster->ps(0)->stats();
      auto ps = h.Run(DType::kFloat32, ReduceOp::kSum, n, Algorithm::kParameterServer, n);
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(ps[r].ok());
        EXPECT_EQ(ps[r]->bytes_sent / es, n) << what << " ps worker";
        EXPECT_EQ(ps[r]->bytes_received / es, n) << what << " ps worker";
      }
      // The server's counters may trail the last reply by a moment.
      PsStats after;
      for (int i = 0; i < 100; ++i) {
        after = h.cluster->ps(0)->stats();
        if (after.bytes_out - before.bytes_out == g * n * es) break;
        absl::SleepFor(absl::Milliseconds(10));
      }
      EXPECT_EQ((after.bytes_in - before.bytes_in) / es, static_cast<uint64_t>(g) * n)
          << what << " into the server";
      EXPECT_EQ((after.bytes_out - before.bytes_out) / es, static_cast<uint64_t>(g) * n)
          << what << " out of the server";
    }
  }
}

TEST(ParameterServer, StartedAfterTheWorkersIsWaitedFor) {
  const int g = 3;
  Harness h(g, 0);
  std::vector<std::vector<float>> bufs(g, std::vector<float>(1000, 2.0f));
  std::vector<absl::StatusOr<OpInfo>> results(g);
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    threads.emplace_back([&, r] {
      OpOptions oo;
      oo.algorithm = Algorithm::kParameterServer;
      oo.timeout = absl::Seconds(20);
      results[r] = h.clients[r]->AllReduce(absl::MakeSpan(bufs[r]), ReduceOp::kSum, oo);
    });
  }
  absl::SleepFor(absl::Milliseconds(700));
  PsOptions po;
  po.job_id = "local";
  po.rendezvous = h.cluster->rendezvous_address();
  auto ps = ParameterServerNode::Start(po).value();
  for (auto& t : threads) t.join();
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(bufs[r][999], 6.0f);
  }
}

TEST(ParameterServer, NoServerGivesAClearErrorAtTheDeadline) {
  Harness h(2, 0);
  auto results = RunRanks<absl::StatusOr<OpInfo>>(2, [&](int r) {
    std::vector<float> buf(10, 1.0f);
    OpOptions oo;
    oo.algorithm = Algorithm::kParameterServer;
    oo.timeout = absl::Seconds(1);
    return h.clients[r]->AllReduce(absl::MakeSpan(buf), ReduceOp::kSum, oo);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("waiting for parameter server of job local"));
  }
}

TEST(ParameterServer, KilledMidOperationIsNamedByEveryWorker) {
  const int g = 3;
  Harness h(g, 1, 1 << 20);
  const std::string ps_address = h.cluster->ps(0)->address();
  const size_t count = 24 << 20;  // 96 MiB per rank: in flight at the kill
  std::vector<std::vector<float>> bufs(g, std::vector<float>(count, 1.0f));
  std::vector<absl::StatusOr<OpInfo>> results(g);
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    threads.emplace_back([&, r] {
      OpOptions oo;
      oo.algorithm = Algorithm::kParameterServer;
      oo.timeout = absl::Seconds(20);
      results[r] = h.clients[r]->AllReduce(absl::MakeSpan(bufs[r]), ReduceOp::kSum, oo);
    });
  }
  absl::SleepFor(absl::Milliseconds(60));
  const absl::Time killed = absl::Now();
  h.cluster->KillPs(0);
  for (auto& t : threads) t.join();
  const absl::Duration took = absl::Now() - killed;
  std::printf("workers returned %.0f ms after the parameter server died\n",
              absl::ToDoubleMilliseconds(took));
  EXPECT_LT(took, absl::Seconds(20));
  int failed = 0;
  for (int r = 0; r < g; ++r) {
    if (results[r].ok()) continue;  // finished before the kill: fine
    ++failed;
    std::printf("rank %d: %s\n", r, results[r].status().ToString().c_str());
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("parameter server shard 0 (ps-0, " + ps_address + ")"));
  }
  EXPECT_GT(failed, 0) << "the kill came after the operation finished; "
                          "make the buffer larger";
}

}  // namespace
}  // namespace halka
