// A Client of the worker's own process (common/in_process.h): its calls
// run on the caller's thread over the caller's buffer ("in-process"), give
// the same bits as the paths a worker in another process takes, stage
// what must be staged, are refused as a worker refuses, and fail at once,
// never wait, once the worker stops.
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "tests/testing/run_ranks.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::RunRanks;

std::unique_ptr<LocalCluster> StartCluster(int workers) {
  LocalCluster::Options o;
  o.workers = workers;
  o.op_timeout = absl::Seconds(10);
  return LocalCluster::Start(o).value();
}

std::vector<std::unique_ptr<Client>> ConnectAll(LocalCluster& c,
                                                bool in_process) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < c.size(); ++r) {
    Client::Options co;
    co.in_process = in_process;
    clients.push_back(c.Connect(r, co).value());
  }
  return clients;
}

// rank r's element i: exact in float32 and distinct per rank.
float In(int r, size_t i) {
  return static_cast<float>(r * 1000 + static_cast<int>(i % 97));
}

TEST(InProcess, CallsRunInProcessAndGiveTheOtherPathsBits) {
  auto cluster = StartCluster(3);
  const int g = cluster->size();
  for (bool in_process : {true, false}) {
    auto clients = ConnectAll(*cluster, in_process);
    for (size_t count : {size_t{1}, size_t{1000}, size_t{300000}}) {
      auto out = RunRanks<absl::StatusOr<std::pair<OpInfo, std::vector<float>>>>(
          g, [&](int r) -> absl::StatusOr<std::pair<OpInfo, std::vector<float>>> {
            std::vector<float> v(count);
            for (size_t i = 0; i < count; ++i) v[i] = In(r, i);
            auto info = clients[static_cast<size_t>(r)]->AllReduce(
                v.data(), count, DType::kFloat32, ReduceOp::kSum);
            if (!info.ok()) return info.status();
            return std::make_pair(*info, v);
          });
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(out[r].ok()) << out[r].status();
        const OpInfo& info = out[r]->first;
        if (in_process) {
          EXPECT_EQ(info.transfer, "in-process");
          EXPECT_TRUE(info.zero_copy);
          EXPECT_FALSE(info.session);
        } else {
          EXPECT_NE(info.transfer, "in-process");
        }
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[r]->second[i], In(0, i) + In(1, i) + In(2, i))
              << "rank " << r << " element " << i;
        }
      }
    }
  }
}

TEST(InProcess, StagedCollectivesCopyOnlyTheirResult) {
  auto cluster = StartCluster(3);
  const int g = cluster->size();
  auto clients = ConnectAll(*cluster, true);
  const size_t slice = 777;
  auto out = RunRanks<std::string>(g, [&](int r) -> std::string {
    Client& cl = *clients[static_cast<size_t>(r)];
    // Reduce-scatter: the input stays as it was, the slice is this rank's.
    std::vector<float> send(slice * g);
    for (size_t i = 0; i < send.size(); ++i) send[i] = In(r, i);
    const std::vector<float> before = send;
    std::vector<float> recv(slice, -1);
    auto rs = cl.ReduceScatter(send.data(), send.size(), recv.data(), slice,
                               DType::kFloat32, ReduceOp::kSum);
    if (!rs.ok()) return rs.status().ToString();
    if (rs->transfer != "in-process" || rs->zero_copy) {
      return absl::StrCat("reduce-scatter went ", rs->transfer);
    }
    if (send != before) return "reduce-scatter changed its input";
    for (size_t i = 0; i < slice; ++i) {
      const size_t at = static_cast<size_t>(r) * slice + i;
      if (recv[i] != In(0, at) + In(1, at) + In(2, at)) {
        return absl::StrCat("reduce-scatter element ", i, ": ", recv[i]);
      }
    }
    // All-gather out of place: the contribution is placed, in the result.
    std::vector<float> mine(slice);
    for (size_t i = 0; i < slice; ++i) mine[i] = In(r, i);
    std::vector<float> all(slice * g, -1);
    auto ag = cl.AllGather(mine.data(), slice, all.data(), all.size(),
                           DType::kFloat32);
    if (!ag.ok()) return ag.status().ToString();
    for (int k = 0; k < g; ++k) {
      for (size_t i = 0; i < slice; ++i) {
        if (all[static_cast<size_t>(k) * slice + i] != In(k, i)) {
          return absl::StrCat("all-gather slice ", k, " element ", i);
        }
      }
    }
    // A reduce: only the root's result is written.
    std::vector<float> v(slice), got(slice, -1);
    for (size_t i = 0; i < slice; ++i) v[i] = In(r, i);
    auto red = cl.Reduce(v.data(), got.data(), slice, DType::kFloat32,
                         ReduceOp::kMax, /*root=*/1);
    if (!red.ok()) return red.status().ToString();
    for (size_t i = 0; i < slice; ++i) {
      const float want = r == 1 ? In(2, i) : -1.0f;
      if (got[i] != want) return absl::StrCat("reduce element ", i);
    }
    return "";
  });
  for (int r = 0; r < g; ++r) EXPECT_EQ(out[r], "") << "rank " << r;
}

TEST(InProcess, ABadCallIsRefusedAsTheWorkerRefusesIt) {
  auto cluster = StartCluster(2);
  auto clients = ConnectAll(*cluster, true);
  // A reduce-scatter whose buffer does not split into the ring's world.
  std::vector<float> send(5), recv(2);
  auto rs = clients[0]->ReduceScatter(send.data(), send.size(), recv.data(),
                                      recv.size(), DType::kFloat32,
                                      ReduceOp::kSum);
  ASSERT_FALSE(rs.ok());
  EXPECT_EQ(rs.status().code(), absl::StatusCode::kInvalidArgument)
      << rs.status();
  EXPECT_THAT(rs.status().ToString(), HasSubstr("world (2)"));
  // As on every path, the refusal took rank 0's call number: rank 1's
  // call of that number fails naming rank 0's refusal, and the next
  // calls pair again.
  std::vector<float> one(8, 1.0f);
  auto alone = clients[1]->AllReduce(one.data(), one.size(), DType::kFloat32,
                                     ReduceOp::kSum);
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kFailedPrecondition)
      << alone.status();
  EXPECT_THAT(alone.status().ToString(), HasSubstr("rank 0"));
  auto out = RunRanks<absl::StatusOr<OpInfo>>(2, [&](int r) {
    std::vector<float> v(8, static_cast<float>(r + 1));
    return clients[static_cast<size_t>(r)]->AllReduce(
        v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(out[r].ok()) << out[r].status();
    EXPECT_EQ(out[r]->transfer, "in-process");
  }
}

TEST(InProcess, AStoppedWorkerFailsTheCallAtOnce) {
  auto cluster = StartCluster(2);
  auto clients = ConnectAll(*cluster, true);
  // A call waiting for a peer that never calls ends when its worker stops.
  std::vector<float> v(16, 1.0f);
  absl::StatusOr<OpInfo> waiting;
  std::thread t([&] {
    waiting = clients[0]->AllReduce(v.data(), v.size(), DType::kFloat32,
                                    ReduceOp::kSum);
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time stop = absl::Now();
  cluster->KillWorker(0);
  t.join();
  ASSERT_FALSE(waiting.ok());
  EXPECT_LT(absl::Now() - stop, absl::Seconds(5));
  EXPECT_THAT(waiting.status().ToString(), HasSubstr("shutting down"));
  // A later call: UNAVAILABLE from the in-process path, at once.
  const absl::Time t0 = absl::Now();
  auto after = clients[0]->AllReduce(v.data(), v.size(), DType::kFloat32,
                                     ReduceOp::kSum);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable)
      << after.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

}  // namespace
}  // namespace halka
