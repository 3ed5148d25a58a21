// One embedded cluster for the integration tests: a LocalCluster (a
// rendezvous, G workers and optionally parameter-server shards on
// 127.0.0.1, in this process) and one Client per rank, with the all-reduce
// check every test of correctness uses.
//
//   ClusterHarness h({/*workers=*/4, /*ps_shards=*/1});
//   ASSERT_TRUE(h.ok()) << h.status();
//   h.AllReduceOnce(DType::kFloat32, ReduceOp::kSum, 1001, Algorithm::kRing,
//                   /*seed=*/1);
//   if (HasFatalFailure()) return;
//
// Thread-safety: the clients may be used from one thread per rank at once
// (RunRanks); the harness itself is set up and torn down on one thread.
#ifndef HALKA_TESTS_TESTING_CLUSTER_HARNESS_H_
#define HALKA_TESTS_TESTING_CLUSTER_HARNESS_H_

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "core/frame.h"
#include "tests/testing/refused_reduction.h"
#include "tests/testing/run_ranks.h"
#include "core/testing/reference.h"

namespace halka::testing {

struct ClusterOptions {
  int workers = 1;
  int ps_shards = 0;
  // Small by default: many chunks per segment.
  size_t chunk_bytes = 4096;
  Client::Transfer transfer = Client::Transfer::kAuto;
  // Calls run on the caller's thread in the workers' (this) process; off:
  // they take the transfer a worker in another process would.
  bool in_process = true;
  absl::Duration op_timeout = absl::Seconds(30);
  // Peer links through shared memory (the default) or gRPC over TCP.
  bool shm_links = true;
  bool wire_links = true;
};

class ClusterHarness {
 public:
  // Starts the cluster (it has formed its ring when this returns) and
  // connects one client per rank. See ok().
  explicit ClusterHarness(const ClusterOptions& options) {
    LocalCluster::Options o;
    o.workers = options.workers;
    o.ps_shards = options.ps_shards;
    o.chunk_bytes = options.chunk_bytes;
    o.op_timeout = options.op_timeout;
    o.shm_links = options.shm_links;
    o.wire_links = options.wire_links;
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
    if (!cluster.ok()) {
      status_ = cluster.status();
      return;
    }
    cluster_ = std::move(*cluster);
    Client::Options co;
    co.transfer = options.transfer;
    co.in_process = options.in_process;
    for (int r = 0; r < options.workers; ++r) {
      absl::StatusOr<std::unique_ptr<Client>> client = cluster_->Connect(r, co);
      if (!client.ok()) {
        status_ = absl::Status(client.status().code(),
                               absl::StrCat("connecting rank ", r, ": ",
                                            client.status().message()));
        return;
      }
      clients_.push_back(std::move(*client));
    }
  }

  // Whether the cluster started and every rank's client connected; a test
  // asserts it before anything else.
  bool ok() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }

  int size() const { return static_cast<int>(clients_.size()); }
  LocalCluster& cluster() const { return *cluster_; }
  Client& client(int rank) const { return *clients_[static_cast<size_t>(rank)]; }

  // Runs one all-reduce of MakeRankData(dtype, op, count, r, seed) on every
  // rank at once and checks that every rank succeeded and reports its rank,
  // the world size and (unless `algorithm` is kAuto) that algorithm; that
  // every rank holds bitwise what rank 0 holds; and that rank 0's result
  // matches the float64 reference. Failures are gtest failures; a fatal one
  // (a rank failed or differs) ends the checks: callers that go on test
  // HasFatalFailure(). Returns each rank's result.
  std::vector<absl::StatusOr<OpInfo>> AllReduceOnce(DType dtype, ReduceOp op,
                                                    size_t count,
                                                    Algorithm algorithm,
                                                    uint64_t seed) {
    const int g = size();
    std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(dtype, op, count, g, seed);
    std::vector<std::vector<uint8_t>> bufs = inputs;
    for (auto& b : bufs) b.resize(std::max<size_t>(b.size(), 1));  // count 0
    auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
      OpOptions oo;
      oo.algorithm = algorithm;
      return client(r).AllReduce(bufs[static_cast<size_t>(r)].data(), count,
                                 dtype, op, oo);
    });
    if (RefusedEverywhere(dtype, op, results)) return results;
    CheckAllReduce(dtype, op, count, algorithm, inputs, bufs, results);
    return results;
  }

  // Starts a sum of (*bufs)[r] on every rank r of `ranks` with `options`
  // and returns at once (for tests that kill or start something while the
  // operation runs). `bufs` must outlive the returned handle's Join().
  RanksInFlight<absl::StatusOr<OpInfo>> StartSum(
      const std::vector<int>& ranks, std::vector<std::vector<float>>* bufs,
      OpOptions options) {
    return StartRanks<absl::StatusOr<OpInfo>>(ranks, [this, bufs, options](int r) {
      return client(r).AllReduce(absl::MakeSpan((*bufs)[static_cast<size_t>(r)]),
                                 ReduceOp::kSum, options);
    });
  }

  // Runs `kill` (stops a worker or a server under `running`), then joins
  // `running`; prints how long the ranks took to return after the kill and
  // expects them back within `bound` (their deadline: a broken link, not
  // the deadline, must end the operation). Returns the ranks' results.
  static std::vector<absl::StatusOr<OpInfo>> KillAndJoin(
      RanksInFlight<absl::StatusOr<OpInfo>>& running,
      const std::function<void()>& kill, absl::Duration bound) {
    const absl::Time killed = absl::Now();
    kill();
    std::vector<absl::StatusOr<OpInfo>> results = running.Join();
    const absl::Duration took = absl::Now() - killed;
    std::printf("the ranks returned %.0f ms after the kill\n",
                absl::ToDoubleMilliseconds(took));
    EXPECT_LT(took, bound);
    return results;
  }

 private:
  void CheckAllReduce(DType dtype, ReduceOp op, size_t count,
                      Algorithm algorithm,
                      const std::vector<std::vector<uint8_t>>& inputs,
                      const std::vector<std::vector<uint8_t>>& bufs,
                      const std::vector<absl::StatusOr<OpInfo>>& results) {
    const int g = size();
    const std::string what = absl::StrCat("g=", g, " ", DTypeName(dtype), " ",
                                          ReduceOpName(op), " count=", count,
                                          " ", AlgorithmName(algorithm));
    for (int r = 0; r < g; ++r) {
      const absl::StatusOr<OpInfo>& res = results[static_cast<size_t>(r)];
      ASSERT_TRUE(res.ok()) << what << ": rank " << r << ": " << res.status();
      EXPECT_EQ(res->rank, r) << what;
      EXPECT_EQ(res->world_size, g) << what;
      if (algorithm != Algorithm::kAuto) {
        EXPECT_EQ(res->algorithm, AlgorithmName(algorithm)) << what << ": rank " << r;
      }
      ASSERT_EQ(std::memcmp(bufs[static_cast<size_t>(r)].data(), bufs[0].data(),
                            count * DTypeSize(dtype)),
                0)
          << what << ": rank " << r << " differs from rank 0";
    }
    const CheckResult check = ::halka::CheckAllReduce(dtype, op, inputs,
                                                      bufs[0].data(), count);
    EXPECT_EQ(check.wrong, 0u) << what << ": " << check.first;
  }

  absl::Status status_;
  std::unique_ptr<LocalCluster> cluster_;
  std::vector<std::unique_ptr<Client>> clients_;
};

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_CLUSTER_HARNESS_H_
