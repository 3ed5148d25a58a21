// Collectives of groups of a job's ranks (OpOptions::group, torch's
// new_group / new_subgroups) through the SDK and real workers on loopback,
// over each link kind: every collective on the group's ranks alone, with
// the group's roots and slices; groups that share a worker and run at
// once; a group's call that runs while the job's collective waits (it does
// not wait for it, nor the job's for it); the numbering of the job and of
// each group intact around one another; a refused call that fails its
// group's copies at once; a killed member named before the deadline; and
// the clear errors of a bad group.
#include <algorithm>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "tests/testing/cluster_harness.h"
#include "tests/testing/run_ranks.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::ClusterHarness;

enum class Path { kShm, kWire, kGrpc };

constexpr int kWorld = 4;

// The value job rank `r` contributes at element i of a call tagged `n`.
float Value(int r, size_t i, int n) {
  return static_cast<float>((r + 1) * 1000 + static_cast<int>(i % 97) + n);
}

OpOptions In(std::vector<int> group) {
  OpOptions o;
  o.group = std::move(group);
  o.timeout = absl::Seconds(20);
  return o;
}

class Groups : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    halka::testing::ClusterOptions o;
    o.workers = kWorld;
    o.chunk_bytes = 4096;
    o.op_timeout = absl::Seconds(20);
    o.shm_links = GetParam() == Path::kShm;
    o.wire_links = GetParam() == Path::kWire;
    h_ = std::make_unique<ClusterHarness>(o);
    ASSERT_TRUE(h_->ok()) << h_->status();
  }
  Client& client(int r) { return h_->client(r); }

  // An all-reduce (sum) of `group` over n elements tagged `tag`, run by
  // the group's members from their threads; checked on every member.
  void GroupSum(const std::vector<int>& group, size_t n, int tag) {
    std::vector<std::vector<float>> bufs(kWorld);
    auto results = halka::testing::StartRanks<absl::StatusOr<OpInfo>>(
        group, [&](int r) {
          bufs[r].resize(n);
          for (size_t i = 0; i < n; ++i) bufs[r][i] = Value(r, i, tag);
          return client(r).AllReduce(absl::MakeSpan(bufs[r]), ReduceOp::kSum,
                                     In(group));
        }).Join();
    for (size_t k = 0; k < group.size(); ++k) {
      const int r = group[k];
      ASSERT_TRUE(results[k].ok()) << "rank " << r << ": " << results[k].status();
      EXPECT_EQ(results[k]->rank, static_cast<int>(k));
      EXPECT_EQ(results[k]->world_size, static_cast<int>(group.size()));
      for (size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int m : group) want += Value(m, i, tag);
        ASSERT_EQ(bufs[r][i], want) << "rank " << r << " element " << i;
      }
    }
  }

  // The job's all-reduce on every rank, checked.
  void JobSum(size_t n, int tag) {
    std::vector<std::vector<float>> bufs(kWorld);
    auto results = halka::testing::RunRanks<absl::StatusOr<OpInfo>>(
        kWorld, [&](int r) {
          bufs[r].resize(n);
          for (size_t i = 0; i < n; ++i) bufs[r][i] = Value(r, i, tag);
          return client(r).AllReduce(absl::MakeSpan(bufs[r]), ReduceOp::kSum);
        });
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
      EXPECT_EQ(results[r]->world_size, kWorld);
      for (size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int m = 0; m < kWorld; ++m) want += Value(m, i, tag);
        ASSERT_EQ(bufs[r][i], want) << "rank " << r << " element " << i;
      }
    }
  }

  std::unique_ptr<ClusterHarness> h_;
};

// new_subgroups: [0,1] and [2,3] at once, then [0,2] and [1,3] (every
// worker in two groups), small (eager) and chunked, interleaved with the
// job's own all-reduces: every result is its group's sum, and the job's
// numbering is untouched by the groups'.
TEST_P(Groups, SubgroupsAndTheJobEachSumTheirOwnRanks) {
  for (int round = 0; round < 3; ++round) {
    for (size_t n : {size_t{7}, size_t{40000}}) {
      SCOPED_TRACE(absl::StrCat("round ", round, ", ", n, " elements"));
      std::future<void> other = std::async(std::launch::async, [&] {
        GroupSum({2, 3}, n, round);
      });
      GroupSum({0, 1}, n, round);
      other.get();
      if (HasFatalFailure()) return;
      other = std::async(std::launch::async, [&] { GroupSum({1, 3}, n, round); });
      GroupSum({0, 2}, n, round);
      other.get();
      if (HasFatalFailure()) return;
      JobSum(n, round);
      if (HasFatalFailure()) return;
    }
  }
}

// A group's order is its own: in group [3,1,2], group rank 0 is job rank
// 3. Broadcast, reduce, gather, scatter, all-gather, reduce-scatter and
// all-to-all, with the group's roots and slices; job rank 0 takes no part.
TEST_P(Groups, EveryCollectiveTakesTheGroupsRanksRootsAndSlices) {
  const std::vector<int> group = {3, 1, 2};
  const int g = 3;
  const size_t n = 5000;  // elements per slice
  auto pos = [&](int r) {
    return static_cast<int>(std::find(group.begin(), group.end(), r) -
                            group.begin());
  };
  auto run = [&](auto body) {
    return halka::testing::StartRanks<absl::StatusOr<OpInfo>>(group, body)
        .Join();
  };
  auto ok = [&](const std::vector<absl::StatusOr<OpInfo>>& res,
                const char* what) {
    for (size_t k = 0; k < res.size(); ++k) {
      ASSERT_TRUE(res[k].ok()) << what << " rank " << group[k] << ": "
                               << res[k].status();
    }
  };
  std::vector<std::vector<float>> a(kWorld), b(kWorld);
  // Broadcast from group rank 1 (job rank 1).
  auto res = run([&](int r) {
    a[r].assign(n, static_cast<float>(r));
    return client(r).Broadcast(absl::MakeSpan(a[r]), 1, In(group));
  });
  ok(res, "broadcast");
  if (HasFatalFailure()) return;
  for (int r : group) ASSERT_EQ(a[r], std::vector<float>(n, 1.0f)) << r;
  // Reduce (max) to group rank 2 (job rank 2).
  res = run([&](int r) {
    a[r].assign(n, static_cast<float>(r * 10));
    b[r].assign(n, -1.0f);
    return client(r).Reduce(absl::MakeConstSpan(a[r]), absl::MakeSpan(b[r]),
                            ReduceOp::kMax, 2, In(group));
  });
  ok(res, "reduce");
  if (HasFatalFailure()) return;
  EXPECT_EQ(b[2], std::vector<float>(n, 30.0f));
  // Gather to group rank 0 (job rank 3): slice k is group rank k's.
  res = run([&](int r) {
    a[r].assign(n, static_cast<float>(r));
    b[r].assign(g * n, -1.0f);
    return client(r).Gather(absl::MakeConstSpan(a[r]), absl::MakeSpan(b[r]), 0,
                            In(group));
  });
  ok(res, "gather");
  if (HasFatalFailure()) return;
  for (int k = 0; k < g; ++k) {
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(b[3][k * n + i], static_cast<float>(group[k])) << k;
    }
  }
  // Scatter from group rank 0 (job rank 3): group rank k gets slice k.
  res = run([&](int r) {
    a[r].resize(g * n);
    for (size_t i = 0; i < g * n; ++i) a[r][i] = static_cast<float>(i / n + 100);
    b[r].assign(n, -1.0f);
    return client(r).Scatter(absl::MakeConstSpan(a[r]), absl::MakeSpan(b[r]), 0,
                             In(group));
  });
  ok(res, "scatter");
  if (HasFatalFailure()) return;
  for (int r : group) {
    ASSERT_EQ(b[r], std::vector<float>(n, static_cast<float>(100 + pos(r)))) << r;
  }
  // All-gather: slice k is group rank k's, on every member.
  res = run([&](int r) {
    a[r].assign(n, static_cast<float>(r + 0.5));
    b[r].assign(g * n, -1.0f);
    return client(r).AllGather(absl::MakeConstSpan(a[r]), absl::MakeSpan(b[r]),
                               In(group));
  });
  ok(res, "all_gather");
  if (HasFatalFailure()) return;
  for (int r : group) {
    for (int k = 0; k < g; ++k) {
      ASSERT_EQ(b[r][k * n + n / 2], static_cast<float>(group[k] + 0.5)) << r;
    }
  }
  // Reduce-scatter: group rank k holds the sum of every member's slice k.
  res = run([&](int r) {
    a[r].resize(g * n);
    for (size_t i = 0; i < g * n; ++i) a[r][i] = static_cast<float>(r * (i / n + 1));
    b[r].assign(n, -1.0f);
    return client(r).ReduceScatter(absl::MakeConstSpan(a[r]),
                                   absl::MakeSpan(b[r]), ReduceOp::kSum,
                                   In(group));
  });
  ok(res, "reduce_scatter");
  if (HasFatalFailure()) return;
  for (int r : group) {
    ASSERT_EQ(b[r], std::vector<float>(n, static_cast<float>(6 * (pos(r) + 1))))
        << r;
  }
  // All-to-all: slice k of group rank j ends as slice j of group rank k.
  res = run([&](int r) {
    a[r].resize(g * n);
    for (size_t i = 0; i < g * n; ++i) {
      a[r][i] = static_cast<float>(pos(r) * 10 + static_cast<int>(i / n));
    }
    b[r].assign(g * n, -1.0f);
    return client(r).AllToAll(absl::MakeConstSpan(a[r]), absl::MakeSpan(b[r]),
                              In(group));
  });
  ok(res, "all_to_all");
  if (HasFatalFailure()) return;
  for (int r : group) {
    for (int k = 0; k < g; ++k) {
      ASSERT_EQ(b[r][k * n], static_cast<float>(k * 10 + pos(r))) << r << " " << k;
    }
  }
  // And a barrier of the group.
  res = run([&](int r) { return client(r).Barrier(In(group)); });
  ok(res, "barrier");
}

// Ranks 0, 1 and 2 wait in the job's all-reduce for rank 3; meanwhile
// ranks 0 and 1 run their group's all-reduce (it does not wait for the
// job's), then rank 3 comes and the job's completes.
TEST_P(Groups, AGroupRunsWhileTheJobsCollectiveWaits) {
  const size_t n = 3000;
  std::vector<std::vector<float>> job(kWorld, std::vector<float>(n));
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < n; ++i) job[r][i] = Value(r, i, 9);
  }
  auto waiting = halka::testing::StartRanks<absl::StatusOr<OpInfo>>(
      {0, 1, 2}, [&](int r) {
        return client(r).AllReduce(absl::MakeSpan(job[r]), ReduceOp::kSum);
      });
  absl::SleepFor(absl::Milliseconds(200));  // the job's call is under way
  const absl::Time start = absl::Now();
  GroupSum({0, 1}, n, 5);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10))
      << "the group's call waited for the job's";
  if (HasFatalFailure()) return;
  absl::StatusOr<OpInfo> last =
      client(3).AllReduce(absl::MakeSpan(job[3]), ReduceOp::kSum);
  ASSERT_TRUE(last.ok()) << last.status();
  std::vector<absl::StatusOr<OpInfo>> rest = waiting.Join();
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(rest[r].ok()) << r << rest[r].status();
  for (int r = 0; r < kWorld; ++r) {
    float want = 0;
    for (int m = 0; m < kWorld; ++m) want += Value(m, 17, 9);
    EXPECT_EQ(job[r][17], want) << r;
  }
  JobSum(100, 11);  // the numbering is still paired
}

// Two groups of the same ranks (torch's new_group([0, 1]) called twice),
// told apart by their tags: each numbers its calls on its own, so calls
// issued to both at once from two threads per rank never pair across
// them (equal sizes would pass the fingerprints and mix the data).
TEST_P(Groups, GroupsOfTheSameRanksWithOtherTagsStayApart) {
  const std::vector<int> ranks = {0, 1};
  const size_t n = 2000;
  for (int round = 0; round < 5; ++round) {
    std::vector<std::vector<float>> a(kWorld, std::vector<float>(n)),
        b(kWorld, std::vector<float>(n));
    std::vector<std::future<absl::StatusOr<OpInfo>>> calls;
    for (int r : ranks) {
      for (uint64_t tag : {uint64_t{11}, uint64_t{22}}) {
        auto& buf = tag == 11 ? a[r] : b[r];
        std::fill(buf.begin(), buf.end(),
                  static_cast<float>(tag * 100 + r + round));
        calls.push_back(std::async(std::launch::async, [&, r, tag] {
          OpOptions o = In(ranks);
          o.group_tag = tag;
          return client(r).AllReduce(absl::MakeSpan(tag == 11 ? a[r] : b[r]),
                                     ReduceOp::kSum, o);
        }));
      }
    }
    for (auto& c : calls) {
      absl::StatusOr<OpInfo> got = c.get();
      ASSERT_TRUE(got.ok()) << got.status();
    }
    for (int r : ranks) {
      ASSERT_EQ(a[r][n - 1], static_cast<float>(2 * (1100 + round) + 1)) << r;
      ASSERT_EQ(b[r][0], static_cast<float>(2 * (2200 + round) + 1)) << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Links, Groups, ::testing::Values(Path::kShm, Path::kWire, Path::kGrpc),
    [](const ::testing::TestParamInfo<Path>& p) {
      return p.param == Path::kShm ? "shm"
                                   : p.param == Path::kWire ? "wire" : "grpc";
    });

// A member whose call is refused (its counts do not fit the group's world)
// gives its number in the group up: the others fail at once naming it,
// and the group's next call pairs again.
TEST(GroupErrors, ARefusedCallFailsItsGroupAtOnceAndTheNextPairs) {
  ClusterHarness h({kWorld, 0});
  ASSERT_TRUE(h.ok()) << h.status();
  const std::vector<int> group = {0, 2, 3};
  std::vector<std::vector<float>> a(kWorld, std::vector<float>(30, 1.0f)),
      b(kWorld, std::vector<float>(90, 0.0f));
  const absl::Time start = absl::Now();
  auto res = halka::testing::StartRanks<absl::StatusOr<OpInfo>>(
      group, [&](int r) {
        // Rank 2 asks for a gather of 2 x 30: not the group's 3.
        const size_t recv = r == 2 ? 60 : 90;
        return h.client(r).AllGather(a[r].data(), 30, b[r].data(), recv,
                                     DType::kFloat32, In(group));
      }).Join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (size_t k = 0; k < group.size(); ++k) {
    ASSERT_FALSE(res[k].ok()) << group[k];
    EXPECT_THAT(std::string(res[k].status().message()), HasSubstr("group [0,2,3]"))
        << res[k].status();
    if (group[k] == 2) {
      EXPECT_EQ(res[k].status().code(), absl::StatusCode::kInvalidArgument);
    } else {
      EXPECT_THAT(std::string(res[k].status().message()),
                  HasSubstr("job rank 2"))
          << res[k].status();
    }
  }
  auto again = halka::testing::StartRanks<absl::StatusOr<OpInfo>>(
      group, [&](int r) {
        return h.client(r).AllGather(a[r].data(), 30, b[r].data(), 90,
                                     DType::kFloat32, In(group));
      }).Join();
  for (size_t k = 0; k < group.size(); ++k) {
    ASSERT_TRUE(again[k].ok()) << group[k] << ": " << again[k].status();
  }
}

// A member dies while the others wait in the group's call: each names it
// (its job rank and worker) before the deadline.
TEST(GroupErrors, AKilledMemberIsNamedBeforeTheDeadline) {
  ClusterHarness h({kWorld, 0, /*chunk_bytes=*/1 << 20});
  ASSERT_TRUE(h.ok()) << h.status();
  const std::vector<int> group = {0, 2, 3};
  const std::vector<int> survivors = {0, 3};
  std::vector<std::vector<float>> a(kWorld, std::vector<float>(1 << 20, 1.0f));
  OpOptions oo = In(group);
  auto running = halka::testing::StartRanks<absl::StatusOr<OpInfo>>(
      survivors, [&](int r) {
        return h.client(r).AllReduce(absl::MakeSpan(a[r]), ReduceOp::kSum, oo);
      });
  absl::SleepFor(absl::Milliseconds(500));  // both wait for rank 2
  // Well before the 20 s deadline: the broken links name it, not a timeout.
  const std::vector<absl::StatusOr<OpInfo>> results = ClusterHarness::KillAndJoin(
      running, [&] { h.cluster().KillWorker(2); }, absl::Seconds(8));
  for (size_t i = 0; i < survivors.size(); ++i) {
    ASSERT_FALSE(results[i].ok()) << survivors[i];
    EXPECT_NE(results[i].status().code(), absl::StatusCode::kDeadlineExceeded)
        << results[i].status();
    // The group's own naming (its broken link), or the job's membership
    // change when the rendezvous's word arrives first: either names the
    // worker and its job rank.
    EXPECT_THAT(std::string(results[i].status().message()),
                ::testing::AnyOf(HasSubstr("worker-2, job rank 2"),
                                 HasSubstr("rank 2 (worker-2, ")))
        << survivors[i] << ": " << results[i].status();
  }
}

// Groups that cannot be: a clear INVALID_ARGUMENT, nothing waits.
TEST(GroupErrors, BadGroupsAreRefusedClearly) {
  ClusterHarness h({kWorld, 0});
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<float> x(10, 1.0f);
  struct Case {
    std::vector<int> group;
    const char* says;
  };
  for (const Case& c : {Case{{1, 2}, "does not hold this worker's rank 0"},
                        Case{{0, 7}, "not a rank of the job"},
                        Case{{0, 1, 0}, "repeated"},
                        Case{{0, -1}, "not a rank of the job"}}) {
    OpOptions o = In(c.group);
    o.timeout = absl::Seconds(5);
    absl::StatusOr<OpInfo> r =
        h.client(0).AllReduce(absl::MakeSpan(x), ReduceOp::kSum, o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.says))
        << r.status();
  }
  OpOptions o = In({0, 1});
  absl::StatusOr<OpInfo> s = h.client(0).Send(absl::MakeConstSpan(x), 1, 0, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("takes no group"));
  // The job is unharmed.
  auto results = halka::testing::RunRanks<absl::StatusOr<OpInfo>>(
      kWorld, [&](int r) {
        std::vector<float> y(10, 1.0f);
        return h.client(r).AllReduce(absl::MakeSpan(y), ReduceOp::kSum);
      });
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
}

}  // namespace
}  // namespace halka
