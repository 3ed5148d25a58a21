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
#include "tests/testing/cluster_harness.h"
#include "tests/testing/run_ranks.h"
#include "tests/testing/stderr_tap.h"
#include "tests/testing/wait_for.h"
#include "core/testing/reference.h"
#include "core/ring_plan.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::ClusterHarness;
using halka::testing::RunRanks;
using halka::testing::StderrTap;
using halka::testing::WaitFor;

class EveryAlgorithm : public ::testing::TestWithParam<std::tuple<int, int>> {};

// PS with one and with two shards, and naive, for every dtype and op.
TEST_P(EveryAlgorithm, PsAndNaiveAgreeBitwiseAndMatchReference) {
  const auto [g, shards] = GetParam();
  ClusterHarness h({g, shards});
  ASSERT_TRUE(h.ok()) << h.status();
  uint64_t seed = 100;
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (size_t count : {size_t{1}, static_cast<size_t>(g + 1), size_t{3001}}) {
        h.AllReduceOnce(dtype, op, count, Algorithm::kParameterServer, ++seed);
        h.AllReduceOnce(dtype, op, count, Algorithm::kNaive, ++seed);
        if (HasFailure()) return;
      }
    }
  }
  h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, 0,
                  Algorithm::kParameterServer, 1);
  h.AllReduceOnce(DType::kFloat32, ReduceOp::kAvg, 500009,
                  Algorithm::kParameterServer, 2);
  h.AllReduceOnce(DType::kInt64, ReduceOp::kSum, 500009, Algorithm::kNaive, 3);
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
    ClusterHarness h({g, /*ps_shards=*/1, /*chunk_bytes=*/1 << 16});
    ASSERT_TRUE(h.ok()) << h.status();
    for (size_t n : {size_t{1}, static_cast<size_t>(g - 1), size_t{1000},
                     size_t{65537}, static_cast<size_t>(100003)}) {
      const uint64_t es = 4;
      const std::string what = absl::StrCat("G=", g, " N=", n);
      // Ring.
      auto ring =
          h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, n, Algorithm::kRing, n);
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
      auto naive =
          h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, n, Algorithm::kNaive, n);
      total = 0;
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(naive[r].ok());
        EXPECT_EQ(naive[r]->bytes_sent / es, (g - 1) * n) << what << " naive";
        EXPECT_EQ(naive[r]->bytes_received / es, (g - 1) * n) << what << " naive";
        total += naive[r]->bytes_sent / es;
      }
      EXPECT_EQ(total, static_cast<uint64_t>(g) * (g - 1) * n) << what << " naive total";
      // Parameter server.
      const PsStats before = h.cluster().ps(0)->stats();
      auto ps = h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, n,
                                Algorithm::kParameterServer, n);
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(ps[r].ok());
        EXPECT_EQ(ps[r]->bytes_sent / es, n) << what << " ps worker";
        EXPECT_EQ(ps[r]->bytes_received / es, n) << what << " ps worker";
      }
      // The server's counters may trail the last reply by a moment.
      const uint64_t through = static_cast<uint64_t>(g) * n * es;
      PsStats after;
      EXPECT_TRUE(WaitFor(
          [&] {
            after = h.cluster().ps(0)->stats();
            return after.bytes_in - before.bytes_in == through &&
                   after.bytes_out - before.bytes_out == through;
          },
          absl::Seconds(5)))
          << what << ": the server's byte counters to reach " << through
          << " in and out";
      EXPECT_EQ((after.bytes_in - before.bytes_in) / es, static_cast<uint64_t>(g) * n)
          << what << " into the server";
      EXPECT_EQ((after.bytes_out - before.bytes_out) / es, static_cast<uint64_t>(g) * n)
          << what << " out of the server";
    }
  }
}

TEST(ParameterServer, StartedAfterTheWorkersIsWaitedFor) {
  const int g = 3;
  ClusterHarness h({g, /*ps_shards=*/0});
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<std::vector<float>> bufs(g, std::vector<float>(1000, 2.0f));
  OpOptions oo;
  oo.algorithm = Algorithm::kParameterServer;
  oo.timeout = absl::Seconds(20);
  {
    // Every worker looked for a server, found none and said so (its log is
    // the only sign: the lookup comes before the communicator's ledger).
    StderrTap tap;
    ASSERT_TRUE(tap.ok()) << "cannot capture stderr";
    auto running = h.StartSum(halka::testing::AllRanks(g), &bufs, oo);
    const std::string waiting = "waiting for parameter server of job local";
    EXPECT_TRUE(WaitFor([&] { return tap.Count(waiting) == g; },
                        absl::Seconds(10)))
        << "not every worker logged \"" << waiting << "\"; the log:\n"
        << tap.Text();
    PsOptions po;
    po.job_id = "local";
    po.rendezvous = h.cluster().rendezvous_address();
    auto ps = ParameterServerNode::Start(po).value();
    const std::vector<absl::StatusOr<OpInfo>> results = running.Join();
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(bufs[r][999], 6.0f);
    }
  }
}

TEST(ParameterServer, NoServerGivesAClearErrorAtTheDeadline) {
  ClusterHarness h({2, /*ps_shards=*/0});
  ASSERT_TRUE(h.ok()) << h.status();
  auto results = RunRanks<absl::StatusOr<OpInfo>>(2, [&](int r) {
    std::vector<float> buf(10, 1.0f);
    OpOptions oo;
    oo.algorithm = Algorithm::kParameterServer;
    oo.timeout = absl::Seconds(1);
    return h.client(r).AllReduce(absl::MakeSpan(buf), ReduceOp::kSum, oo);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("waiting for parameter server of job local"));
  }
}

TEST(ParameterServer, KilledMidOperationIsNamedByEveryWorker) {
  const int g = 3;
  ClusterHarness h({g, /*ps_shards=*/1, /*chunk_bytes=*/1 << 20});
  ASSERT_TRUE(h.ok()) << h.status();
  const std::string ps_address = h.cluster().ps(0)->address();
  const size_t count = 24 << 20;  // 96 MiB per rank: in flight at the kill
  std::vector<std::vector<float>> bufs(g, std::vector<float>(count, 1.0f));
  OpOptions oo;
  oo.algorithm = Algorithm::kParameterServer;
  oo.timeout = absl::Seconds(20);
  auto running = h.StartSum(halka::testing::AllRanks(g), &bufs, oo);
  // The kill comes once the operation's data reaches the server.
  ASSERT_TRUE(WaitFor([&] { return h.cluster().ps(0)->stats().bytes_in > 0; },
                      absl::Seconds(10)))
      << "no data reached the parameter server";
  const std::vector<absl::StatusOr<OpInfo>> results = ClusterHarness::KillAndJoin(
      running, [&] { h.cluster().KillPs(0); }, oo.timeout);
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
