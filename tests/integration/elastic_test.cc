// Elastic membership on real gRPC (127.0.0.1, one process): an embedded
// rendezvous with short heartbeats and workers that die (Shutdown without
// Leave, as a crashed process), come back under the same worker id, and a
// hung operation explained by GetRingHealth while it waits.
#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/rendezvous_service.h"
#include "tests/testing/ring_health.h"
#include "tests/testing/run_ranks.h"
#include "tests/testing/wait_for.h"
#include "codec/membership_codec.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using halka::testing::FetchRingHealth;
using halka::testing::RunRanks;
using halka::testing::StartRanks;
using halka::testing::WaitFor;

constexpr size_t kCount = 100003;  // int64 elements: several chunks

// An int64 sum of kCount elements with this deadline.
v1::OpSpec SumSpec(uint32_t timeout_ms) {
  v1::OpSpec spec;
  spec.set_kind(v1::ALL_REDUCE);
  spec.set_dtype(v1::INT64);
  spec.set_op(v1::SUM);
  spec.set_count(kCount);
  spec.set_timeout_ms(timeout_ms);
  return spec;
}

class ElasticTest : public ::testing::Test {
 protected:
  void StartRendezvous() {
    RendezvousOptions o;
    o.heartbeat_interval = absl::Milliseconds(100);
    o.heartbeat_timeout = absl::Milliseconds(800);
    o.elastic_settle = absl::Milliseconds(200);
    auto r = RendezvousServer::Start("127.0.0.1:0", o);
    ASSERT_TRUE(r.ok()) << r.status();
    rdv_ = std::move(*r);
  }

  WorkerOptions Options(int i, int min, int max) {
    WorkerOptions o;
    o.job_id = "elastic";
    o.worker_id = absl::StrCat("w", i);
    o.rendezvous = rdv_->address();
    o.min_world_size = min;
    o.max_world_size = max;
    o.world_size = max;
    o.chunk_bytes = 64 << 10;
    o.op_timeout = absl::Seconds(5);
    o.join_timeout = absl::Seconds(20);
    return o;
  }

  // Creates the workers and joins them all at once.
  void StartWorkers(int n, int min, int max) {
    std::vector<std::unique_ptr<WorkerNode>> nodes;
    for (int i = 0; i < n; ++i) {
      auto node = WorkerNode::Create(Options(i, min, max));
      ASSERT_TRUE(node.ok()) << node.status();
      nodes.push_back(std::move(*node));
    }
    auto joined = RunRanks<absl::Status>(
        n, [&](int i) { return nodes[static_cast<size_t>(i)]->Join(); });
    for (const absl::Status& s : joined) ASSERT_TRUE(s.ok()) << s;
    workers_ = std::move(nodes);
  }

  // One int64 sum on the given workers: worker i contributes 1 << i in
  // element 0 and (seq + 1) * (k % 5 + 1) elsewhere.
  std::vector<absl::StatusOr<OpResult>> AllReduce(
      const std::vector<WorkerNode*>& on, int seq,
      std::vector<std::vector<int64_t>>* out = nullptr) {
    std::vector<std::vector<int64_t>> data(on.size(),
                                           std::vector<int64_t>(kCount));
    v1::OpSpec spec = SumSpec(5000);
    spec.set_algorithm(v1::RING);
    auto results = RunRanks<absl::StatusOr<OpResult>>(
        static_cast<int>(on.size()), [&](int j) {
          std::vector<int64_t>& d = data[static_cast<size_t>(j)];
          const std::string& id = on[static_cast<size_t>(j)]->options().worker_id;
          d[0] = int64_t{1} << (id.back() - '0');
          for (size_t k = 1; k < kCount; ++k) {
            d[k] = (seq + 1) * static_cast<int64_t>(k % 5 + 1);
          }
          spec.set_issued_unix_ms(
              static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
          return on[static_cast<size_t>(j)]->Execute(spec, d.data());
        });
    if (out != nullptr) *out = std::move(data);
    return results;
  }

  // Repeats the operation until every call succeeds on a ring of
  // `world` (bounded); checks the sums.
  void EventuallyCorrect(const std::vector<WorkerNode*>& on, int world,
                         int* seq) {
    std::vector<std::vector<int64_t>> data;
    std::string last;
    const bool done = WaitFor(
        [&] {
          auto results = AllReduce(on, ++*seq, &data);
          bool all = true;
          for (const auto& r : results) all &= r.ok() && r->world_size == world;
          last.clear();
          for (const auto& r : results) {
            // Only clear errors while the ring changes (and the numbering
            // heals: FAILED_PRECONDITION of a newcomer's call that paired
            // with a refused operation, or of a peer's copy of the number a
            // newcomer gave up; both name the newcomer's reason).
            if (!r.ok() &&
                !(r.status().code() == absl::StatusCode::kFailedPrecondition &&
                  absl::StrContains(r.status().message(),
                                    "this rank is new in the ring"))) {
              EXPECT_THAT(r.status().code(),
                          AnyOf(absl::StatusCode::kAborted,
                                absl::StatusCode::kUnavailable,
                                absl::StatusCode::kDeadlineExceeded))
                  << r.status();
            }
            absl::StrAppend(&last, "\n  ",
                            r.ok() ? absl::StrCat("ok, world ", r->world_size)
                                   : r.status().ToString());
          }
          return all;
        },
        absl::Seconds(20), /*poll=*/absl::Milliseconds(50));
    ASSERT_TRUE(done) << "no correct operation on " << world
                      << " ranks within 20 s; last:" << last;
    int64_t mask = 0;
    for (WorkerNode* w : on) {
      mask |= int64_t{1} << (w->options().worker_id.back() - '0');
    }
    for (const auto& d : data) {
      ASSERT_EQ(d[0], mask);
      for (size_t k = 1; k < kCount; k += 997) {
        ASSERT_EQ(d[k], world * (*seq + 1) * static_cast<int64_t>(k % 5 + 1))
            << "element " << k;
      }
    }
  }

  // One round on the live workers in which `refused` calls with a bad
  // dtype and the others call correctly: every call fails, and the others'
  // errors name `refused` with FAILED_PRECONDITION (at once, not at their
  // deadline).
  void RoundWithARefusal(const std::string& refused) {
    std::vector<WorkerNode*> on = Live();
    std::vector<std::vector<int64_t>> data(on.size(),
                                           std::vector<int64_t>(kCount, 1));
    const absl::Time t0 = absl::Now();
    auto round = RunRanks<absl::StatusOr<OpResult>>(
        static_cast<int>(on.size()), [&](int j) {
          v1::OpSpec spec = SumSpec(5000);
          spec.set_algorithm(v1::RING);
          if (on[static_cast<size_t>(j)]->options().worker_id == refused) {
            spec.set_dtype(static_cast<v1::DType>(99));
          }
          return on[static_cast<size_t>(j)]->Execute(
              spec, data[static_cast<size_t>(j)].data());
        });
    std::cout << "a round with " << refused << "'s call refused ended after "
              << absl::FormatDuration(absl::Now() - t0) << "\n";
    for (size_t j = 0; j < on.size(); ++j) {
      ASSERT_FALSE(round[j].ok()) << on[j]->options().worker_id;
      if (on[j]->options().worker_id == refused) continue;
      EXPECT_EQ(round[j].status().code(), absl::StatusCode::kFailedPrecondition)
          << round[j].status();
      EXPECT_THAT(round[j].status().message(), HasSubstr(refused))
          << round[j].status();
    }
  }

  // The next round: every rank, one number, a correct sum on `world`.
  void ExpectOneNumbering(int world, int* seq) {
    auto results = AllReduce(Live(), ++*seq);
    for (const auto& r : results) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->world_size, world);
      EXPECT_EQ(r->op_seq, results[0]->op_seq);
    }
  }

  // An elastic job of 4 (2..4) runs `rounds_before` correct rounds, loses
  // w3, runs one on 3, and starts w3 again: returns once every member
  // knows of its admission, with a time just before that restart.
  absl::Time LoseAndRestartW3(int rounds_before, int* seq) {
    StartRendezvous();
    StartWorkers(4, 2, 4);
    for (int i = 0; i < rounds_before; ++i) EventuallyCorrect(Live(), 4, seq);
    workers_[3]->Shutdown(/*leave=*/false);
    workers_[3].reset();
    EventuallyCorrect(Live(), 3, seq);
    const absl::Time before = absl::Now() - absl::Milliseconds(5);
    auto back = WorkerNode::Start(Options(3, 2, 4));
    EXPECT_TRUE(back.ok()) << back.status();
    if (!back.ok()) return before;
    workers_[3] = std::move(*back);
    AwaitEveryMemberHeardOf(3);
    return before;
  }

  // Waits (10 s at most) until every live worker knows the generation
  // worker `i` was last admitted in.
  void AwaitEveryMemberHeardOf(int i) {
    const uint64_t admitted =
        workers_[static_cast<size_t>(i)]->Describe()->membership_generation();
    ASSERT_TRUE(WaitFor(
        [&] {
          for (WorkerNode* w : Live()) {
            absl::StatusOr<v1::InfoReply> info = w->Describe();
            if (!info.ok() || info->membership_generation() < admitted) {
              return false;
            }
          }
          return true;
        },
        absl::Seconds(10), absl::Milliseconds(5)))
        << "the members did not hear of w" << i << "'s admission";
  }

  std::vector<WorkerNode*> Live() {
    std::vector<WorkerNode*> v;
    for (auto& w : workers_) {
      if (w) v.push_back(w.get());
    }
    return v;
  }

  std::unique_ptr<RendezvousServer> rdv_;
  std::vector<std::unique_ptr<WorkerNode>> workers_;
};

TEST_F(ElasticTest, LossShrinksTheRingAndARestartGrowsItBack) {
  StartRendezvous();
  StartWorkers(4, 2, 4);
  int seq = 0;
  EventuallyCorrect(Live(), 4, &seq);

  // w2 dies (no Leave): the survivors learn it from their broken links and
  // the rendezvous's probe, long before the heartbeat timeout.
  const absl::Time t0 = absl::Now();
  workers_[2]->Shutdown(/*leave=*/false);
  workers_[2].reset();
  EventuallyCorrect(Live(), 3, &seq);
  const absl::Duration shrink = absl::Now() - t0;
  // Ranks stay dense: the three survivors hold 0, 1, 2.
  std::vector<int> ranks;
  for (WorkerNode* w : Live()) ranks.push_back(w->rank());
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2}));

  // w2 restarts (a new process, same id): admitted between operations.
  auto back = WorkerNode::Start(Options(2, 2, 4));
  ASSERT_TRUE(back.ok()) << back.status();
  workers_[2] = std::move(*back);
  EventuallyCorrect(Live(), 4, &seq);
  std::cout << "shrink to 3 ranks took " << absl::FormatDuration(shrink)
            << std::endl;
}

// Two members lost one after the other while the survivors' call waits
// for their fingerprints (a host lost with its workers: a generation per
// loss). Each loss fails the call before it touched the buffer, so it runs
// again on the new ring; the re-run on the middle ring, which still holds
// the second victim, fails the same way and runs again on the last one,
// where it is correct on the two survivors. Before, a re-run that failed
// was returned as it was, while a peer's could land on the last ring and
// wait there for this rank to its deadline (system_faults'
// hostloss_hosts).
TEST_F(ElasticTest, ACallRunsAgainAcrossTwoLossesInARow) {
  StartRendezvous();
  StartWorkers(4, 2, 4);
  int seq = 0;
  EventuallyCorrect(Live(), 4, &seq);
  const std::vector<WorkerNode*> survivors = {workers_[0].get(),
                                              workers_[1].get()};
  std::vector<std::vector<int64_t>> data;
  std::vector<absl::StatusOr<OpResult>> results;
  const int op = ++seq;
  std::thread calls([&] { results = AllReduce(survivors, op, &data); });
  absl::SleepFor(absl::Milliseconds(300));  // the calls wait for w2 and w3
  workers_[2]->Shutdown(/*leave=*/false);
  workers_[2].reset();
  // The middle ring (w0, w1, w3) forms; the survivors' re-run waits there
  // for w3, which never calls.
  // (world_size() is the ring w0's own call built: its re-run is there.)
  const bool middle = WaitFor([&] { return workers_[0]->world_size() == 3; },
                              absl::Seconds(3), absl::Milliseconds(10));
  absl::SleepFor(absl::Milliseconds(300));
  workers_[3]->Shutdown(/*leave=*/false);
  workers_[3].reset();
  calls.join();
  ASSERT_TRUE(middle) << "the survivors' call never re-ran on the middle "
                         "ring: the test did not test the second re-run";
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->world_size, 2);
    EXPECT_EQ(r->op_seq, results[0]->op_seq);
  }
  for (const auto& d : data) {
    EXPECT_EQ(d[0], 3);  // w0's bit and w1's
    for (size_t k = 1; k < kCount; k += 997) {
      ASSERT_EQ(d[k], 2 * (op + 1) * static_cast<int64_t>(k % 5 + 1))
          << "element " << k;
    }
  }
}

// All-gather after a loss: the world is part of its contract. A call sized
// for the old world is refused on every survivor, naming the new world (no
// hang, no partial result); one sized for the new world is right.
TEST_F(ElasticTest, AllGatherAfterALossFollowsTheNewWorld) {
  StartRendezvous();
  StartWorkers(4, 2, 4);
  int seq = 0;
  EventuallyCorrect(Live(), 4, &seq);
  workers_[1]->Shutdown(/*leave=*/false);
  workers_[1].reset();
  EventuallyCorrect(Live(), 3, &seq);
  const std::vector<WorkerNode*> on = Live();
  const size_t n = 1001;  // int64 elements per rank
  auto gather = [&](int world) {
    v1::OpSpec spec;
    spec.set_kind(v1::ALL_GATHER);
    spec.set_dtype(v1::INT64);
    spec.set_count(n);
    spec.set_recv_count(world * n);
    spec.set_timeout_ms(5000);
    std::vector<std::vector<int64_t>> bufs(on.size(),
                                           std::vector<int64_t>(4 * n, -1));
    auto results = RunRanks<absl::StatusOr<OpResult>>(
        static_cast<int>(on.size()), [&](int j) {
          // Every survivor contributes its rank's number, in slice 0.
          std::fill(bufs[j].begin(), bufs[j].begin() + n, on[j]->rank() + 10);
          spec.set_issued_unix_ms(
              static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
          return on[static_cast<size_t>(j)]->Execute(spec, bufs[j].data());
        });
    return std::make_pair(results, bufs);
  };
  auto [old_world, unused] = gather(4);
  for (const auto& r : old_world) {
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("must be the ring's world (3) x send_count 1001"));
  }
  auto [new_world, bufs] = gather(3);
  for (size_t j = 0; j < on.size(); ++j) {
    ASSERT_TRUE(new_world[j].ok()) << new_world[j].status();
    EXPECT_EQ(new_world[j]->world_size, 3);
    for (int slice = 0; slice < 3; ++slice) {
      EXPECT_EQ(bufs[j][slice * n], slice + 10) << "worker " << j;
      EXPECT_EQ(bufs[j][slice * n + n - 1], slice + 10) << "worker " << j;
    }
  }
}

// Two restarts admitted in two generations, before the first of them ran
// any operation: that one joined the ring's numbering as late as the
// second. (Found by the chaos test: it numbered its calls from #1 while the
// ring was at #200, and no operation on all ranks succeeded again.)
TEST_F(ElasticTest, TwoAdmissionsBeforeAnyOperationBothTakeTheNumbering) {
  StartRendezvous();
  StartWorkers(4, 2, 4);
  int seq = 0;
  for (int i = 0; i < 3; ++i) EventuallyCorrect(Live(), 4, &seq);
  for (int i : {2, 3}) {
    workers_[static_cast<size_t>(i)]->Shutdown(/*leave=*/false);
    workers_[static_cast<size_t>(i)].reset();
  }
  for (int i = 0; i < 3; ++i) EventuallyCorrect(Live(), 2, &seq);
  // Start returns once the worker is admitted: w2 in one generation, w3
  // (which completes the ring) in the next, with no call in between.
  for (int i : {2, 3}) {
    auto back = WorkerNode::Start(Options(i, 2, 4));
    ASSERT_TRUE(back.ok()) << back.status();
    workers_[static_cast<size_t>(i)] = std::move(*back);
  }
  EventuallyCorrect(Live(), 4, &seq);
  // And the ranks keep numbering their calls alike.
  auto results = AllReduce(Live(), ++seq);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->op_seq, results[0]->op_seq);
  }
}

// A restarted worker has no number yet (it adopts the ring's). If its
// first call is refused (a bad dtype), the call still takes the number of
// the operation its peers run, their copies fail naming it, and the next
// round runs on every rank with one numbering (the chaos run found the
// refused call inventing #2 while the ring was at #200).
TEST_F(ElasticTest, NewcomersRefusedFirstCallTakesTheRingsNumber) {
  int seq = 0;
  // Every member hears of w3's admission first: a round that the others
  // began on the ring before it (they had not heard yet) runs there, without
  // w3, and succeeds (seen in a loaded CI-like run).
  LoseAndRestartW3(/*rounds_before=*/5, &seq);
  if (HasFailure()) return;
  // One round: w3's call is refused, the others call correctly.
  ASSERT_EQ(Live().size(), 4u);
  RoundWithARefusal("w3");
  if (HasFatalFailure()) return;
  ExpectOneNumbering(4, &seq);
}

// A call its caller made before the worker (re)joined the ring belongs to
// no operation of that ring. Refused there, it must take no number: giving
// up the peers' running number on its behalf failed the round its peers
// and this worker's next call made, and left the worker one number ahead
// for good (system_faults' sigstop: an upload the SIGSTOP cut short,
// refused once the worker had re-joined). Three such refusals, each while
// a round of 4 starts: a bad dtype (the call's own validation), an upload
// cut short (Refuse with the call's spec, issued before the rejoin), and
// one refused before its spec was read that arrived before the rejoin.
TEST_F(ElasticTest, AStaleCallRefusedAfterARejoinTakesNoNumber) {
  int seq = 0;
  const absl::Time before_rejoin = LoseAndRestartW3(/*rounds_before=*/3, &seq);
  if (HasFailure()) return;
  WorkerNode* w3 = workers_[3].get();
  v1::OpSpec stale = SumSpec(5000);
  stale.set_algorithm(v1::RING);
  stale.set_issued_unix_ms(
      static_cast<uint64_t>(absl::ToUnixMillis(before_rejoin)));
  v1::OpSpec bad_dtype = stale;
  bad_dtype.set_dtype(static_cast<v1::DType>(99));
  std::vector<int64_t> stale_data(kCount, 1);
  struct Case {
    std::string name;
    absl::StatusCode code;
    std::function<absl::Status()> call;
  };
  const std::vector<Case> cases = {
      {"a bad dtype", absl::StatusCode::kInvalidArgument,
       [&] { return w3->Execute(bad_dtype, stale_data.data()).status(); }},
      {"an upload cut short", absl::StatusCode::kCancelled,
       [&] {
         return w3->Refuse(w3->Arrive(),
                           absl::CancelledError("the upload was cut short"),
                           &stale);
       }},
      {"no spec, arrived before the rejoin", absl::StatusCode::kCancelled,
       [&] {
         WorkerNode::Arrival early = w3->Arrive();
         early.at = before_rejoin;
         return w3->Refuse(early, absl::CancelledError("no request"));
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    // The stale call first; while it would wait for the peers' next
    // number, the round of 4 (w3's call fresh) starts.
    absl::Status refused = absl::UnknownError("not run");
    std::thread stale_call([&] { refused = c.call(); });
    absl::SleepFor(absl::Milliseconds(300));
    ExpectOneNumbering(4, &seq);
    stale_call.join();
    EXPECT_EQ(refused.code(), c.code) << refused;
    if (HasFailure()) return;
  }
  ExpectOneNumbering(4, &seq);
}

// A survivor refuses a call after it learnt of a loss but before it ran
// anything on the smaller ring: the refusal must reach the peers on the
// ring they run that call on (the new one), so that they fail at once
// naming it, not at their deadline, and the next round is one number on
// every rank.
TEST_F(ElasticTest, CallRefusedBeforeTheNewRingIsBuiltFailsThePeersThere) {
  StartRendezvous();
  StartWorkers(4, 2, 4);
  int seq = 0;
  for (int i = 0; i < 3; ++i) EventuallyCorrect(Live(), 4, &seq);
  const uint64_t before = workers_[0]->Describe()->membership_generation();
  workers_[3]->Shutdown(/*leave=*/false);
  workers_[3].reset();
  // Every survivor hears of the loss (no operation runs meanwhile, so none
  // has built the smaller ring yet).
  ASSERT_TRUE(WaitFor(
      [&] {
        for (WorkerNode* w : Live()) {
          absl::StatusOr<v1::InfoReply> info = w->Describe();
          if (!info.ok() || info->membership_generation() <= before ||
              info->job_state() != v1::JOB_STATE_DEGRADED) {
            return false;
          }
        }
        return true;
      },
      absl::Seconds(10), absl::Milliseconds(20)))
      << "the survivors did not hear of w3's loss";
  ASSERT_EQ(Live().size(), 3u);
  RoundWithARefusal("w0");
  if (HasFatalFailure()) return;
  ExpectOneNumbering(3, &seq);
}

TEST_F(ElasticTest, BelowMinimumFailsClearlyThenRecovers) {
  StartRendezvous();
  StartWorkers(3, 3, 3);  // a fixed job of 3
  int seq = 0;
  EventuallyCorrect(Live(), 3, &seq);
  workers_[1]->Shutdown(/*leave=*/false);
  workers_[1].reset();
  // Within the heartbeat timeout plus a margin, operations fail at once
  // saying the job is below its minimum.
  absl::Status last;
  ASSERT_TRUE(WaitFor(
      [&] {
        last = AllReduce(Live(), ++seq)[0].status();
        return !last.ok() && absl::StrContains(last.message(), "below its minimum");
      },
      absl::Seconds(10), /*poll=*/absl::Milliseconds(50)))
      << "no operation failed saying the job is below its minimum; last: " << last;
  EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable) << last;
  EXPECT_THAT(last.message(), HasSubstr("w1"));  // the change names the lost
  const absl::Time t = absl::Now();
  auto results = AllReduce(Live(), ++seq);
  EXPECT_LT(absl::Now() - t, absl::Seconds(1));  // fails fast, no deadline
  for (const auto& r : results) EXPECT_FALSE(r.ok());

  auto back = WorkerNode::Start(Options(1, 3, 3));
  ASSERT_TRUE(back.ok()) << back.status();
  workers_[1] = std::move(*back);
  EventuallyCorrect(Live(), 3, &seq);
}

// A member that leaves (Leave, as destroy_process_group does) aborts no
// running operation of its peers: it left once its calls returned, so an
// operation it took part in finishes on what it sent. One it never joined
// fails when the leaver's links close, naming it, long before the deadline.
TEST_F(ElasticTest, ALeaverThatNeverCalledFailsThePeersCallNamingIt) {
  StartRendezvous();
  StartWorkers(3, 3, 3);  // a fixed job of 3
  int seq = 0;
  EventuallyCorrect(Live(), 3, &seq);
  std::vector<WorkerNode*> callers = {workers_[0].get(), workers_[1].get()};
  std::vector<std::vector<int64_t>> data(2, std::vector<int64_t>(kCount, 1));
  v1::OpSpec spec = SumSpec(/*timeout_ms=*/30000);
  spec.set_issued_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
  const absl::Time t0 = absl::Now();
  std::thread leaver([&] {
    absl::SleepFor(absl::Milliseconds(300));  // the callers wait by then
    workers_[2]->Shutdown(/*leave=*/true);
  });
  auto results = RunRanks<absl::StatusOr<OpResult>>(2, [&](int j) {
    return callers[static_cast<size_t>(j)]->Execute(spec,
                                                  data[static_cast<size_t>(j)].data());
  });
  leaver.join();
  const absl::Duration took = absl::Now() - t0;
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok()) << "an all-reduce of 3 finished with 2";
    EXPECT_THAT(r.status().message(), AnyOf(HasSubstr("w2"), HasSubstr("rank 2")))
        << r.status();
  }
  // Not the 30 s deadline: the leaver's links (or the change) end it.
  EXPECT_LT(took, absl::Seconds(10)) << results[0].status();
}

TEST_F(ElasticTest, HealthExplainsAWaitLiveAndTheDeadlineNamesThePeer) {
  StartRendezvous();
  StartWorkers(2, 2, 2);
  // Only w0 calls: it waits for w1's fingerprint.
  auto running = StartRanks<absl::StatusOr<OpResult>>({0}, [&](int i) {
    std::vector<int64_t> d(kCount, 1);
    return workers_[static_cast<size_t>(i)]->Execute(SumSpec(3000), d.data());
  });
  const int waiter = workers_[0]->rank();
  const int awaited = workers_[1]->rank();
  v1::RingHealth h;
  absl::Status rpc;
  const bool seen = WaitFor(
      [&] {
        absl::StatusOr<v1::RingHealth> got =
            FetchRingHealth(rdv_->address(), "elastic");
        rpc = got.status();
        if (!got.ok()) return true;  // stop: asserted below
        h = std::move(*got);
        for (int i = 0; i < h.members_size(); ++i) {
          const v1::WorkerTelemetry& tel = h.telemetry(i);
          if (h.members(i).rank() == waiter && tel.awaited_rank() == awaited &&
              tel.waiting_for_s() > 0.3) {
            EXPECT_EQ(tel.phase(), "fingerprint");
            EXPECT_GE(tel.chunk(), 1);
            EXPECT_GE(tel.chunks(), 1);
            EXPECT_THAT(tel.current_op(), HasSubstr("all_reduce"));
            return true;
          }
        }
        return false;
      },
      absl::Seconds(2.5), /*poll=*/absl::Milliseconds(100));
  const absl::StatusOr<OpResult> r = std::move(running.Join()[0]);
  ASSERT_TRUE(rpc.ok()) << "GetRingHealth: " << rpc;
  EXPECT_TRUE(seen) << "GetRingHealth never showed rank " << waiter
                    << " waiting for rank " << awaited << ": "
                    << h.ShortDebugString();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat("waiting for rank ", awaited, " (w1, ")));
  EXPECT_THAT(r.status().message(), HasSubstr("fingerprint"));
}

// The rendezvous wire of issue 18 over real gRPC: a compact Join reply
// holds the same ring as a plain one; a Watch that takes deltas gets the
// change as a delta that rebuilds the whole membership a plain watcher
// gets; a watcher whose generation the rendezvous no longer keeps gets a
// whole membership.
TEST(RendezvousWireTest, CompactJoinRepliesAndWatchDeltasWithAWholeFallback) {
  RendezvousOptions o;
  o.heartbeat_timeout = absl::Seconds(30);  // no beats in this test
  auto rdv = RendezvousServer::Start("127.0.0.1:0", o);
  ASSERT_TRUE(rdv.ok()) << rdv.status();
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(
      (*rdv)->address(), grpc::InsecureChannelCredentials()));
  constexpr int kN = 5;
  auto replies = RunRanks<v1::JoinReply>(kN, [&](int i) {
    v1::JoinRequest req;
    req.set_job_id("wire");
    req.set_worker_id(absl::StrCat("m", i));
    req.set_address(absl::StrCat("127.0.0.1:", 30000 + i));
    req.set_world_size(kN);
    req.set_compact_membership(i != 0);  // m0 asks for the plain reply
    v1::JoinReply reply;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    EXPECT_TRUE(stub->Join(&ctx, req, &reply).ok());
    return reply;
  });
  const v1::Membership& plain = replies[0].membership();
  ASSERT_EQ(plain.members_size(), kN);
  EXPECT_TRUE(replies[0].membership_deflate().empty());
  for (int i = 1; i < kN; ++i) {
    EXPECT_FALSE(replies[i].has_membership());
    auto ring = InflateMembership(replies[i].membership_deflate());
    ASSERT_TRUE(ring.ok()) << ring.status();
    EXPECT_EQ(ring->SerializeAsString(), plain.SerializeAsString());
    EXPECT_EQ(replies[i].generation(), replies[0].generation());
  }
  const uint64_t g1 = replies[0].generation();

  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::Membership>> reader;
  };
  auto watch = [&](const std::string& id, uint64_t known, bool deltas) {
    auto st = std::make_unique<Stream>();
    st->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::WatchRequest req;
    req.set_job_id("wire");
    req.set_worker_id(id);
    req.set_known_generation(known);
    req.set_deltas(deltas);
    st->reader = stub->Watch(&st->ctx, req);
    return st;
  };
  auto delta_watch = watch("m1", g1, true);
  auto plain_watch = watch("m2", g1, false);
  // (A stream that opens after the change gets the same: a Join reply's
  // generation is kept while the job lives.)
  absl::SleepFor(absl::Milliseconds(300));

  {
    v1::LeaveRequest req;
    req.set_job_id("wire");
    req.set_worker_id("m3");  // a member in the middle of the ring
    v1::LeaveReply reply;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Leave(&ctx, req, &reply).ok());
  }
  v1::Membership whole, delta;
  ASSERT_TRUE(plain_watch->reader->Read(&whole));
  ASSERT_TRUE(delta_watch->reader->Read(&delta));
  EXPECT_EQ(whole.delta_base(), 0u);
  EXPECT_GT(whole.generation(), g1);
  EXPECT_EQ(delta.generation(), whole.generation());
  EXPECT_EQ(delta.delta_base(), g1);
  EXPECT_LT(delta.members_size(), whole.members_size());
  EXPECT_FALSE(delta.delta_runs().empty());
  auto rebuilt = ApplyMembershipDelta(plain, delta);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  v1::Membership want = whole;
  for (v1::Member& m : *want.mutable_members()) m.clear_last_heartbeat_age_s();
  for (v1::Member& m : *rebuilt->mutable_members()) m.clear_last_heartbeat_age_s();
  EXPECT_EQ(rebuilt->SerializeAsString(), want.SerializeAsString());
  EXPECT_EQ(rebuilt->members_size(), whole.members_size());

  // A watcher that names a generation the rendezvous never had: whole.
  auto behind = watch("m4", g1 + 100, true);
  v1::Membership first;
  ASSERT_TRUE(behind->reader->Read(&first));
  EXPECT_EQ(first.delta_base(), 0u);
  EXPECT_EQ(first.generation(), whole.generation());
  EXPECT_EQ(first.members_size(), whole.members_size());
  for (auto* st : {delta_watch.get(), plain_watch.get(), behind.get()}) {
    st->ctx.TryCancel();
    st->reader->Finish().IgnoreError();
  }
  (*rdv)->Shutdown();
}

// A forming ring's Join answers go out in waves of join_answer_window
// members that have not yet heartbeated (issue 18: N answers, N first beats
// and N Watch opens in one burst held every beat of that second behind it).
class AnswerWavesTest : public ::testing::Test {
 protected:
  // Starts kN Joins of job "waves", each on its own thread; answered_
  // counts those that returned OK, and records who.
  void StartJoins(int window, absl::Duration ack_wait) {
    RendezvousOptions o;
    o.heartbeat_timeout = absl::Seconds(60);  // the test beats by hand
    o.join_answer_window = window;
    o.join_answer_ack_wait = ack_wait;
    auto rdv = RendezvousServer::Start("127.0.0.1:0", o);
    ASSERT_TRUE(rdv.ok()) << rdv.status();
    rdv_ = std::move(*rdv);
    stub_ = v1::Rendezvous::NewStub(grpc::CreateChannel(
        rdv_->address(), grpc::InsecureChannelCredentials()));
    joins_ = std::make_unique<halka::testing::RanksInFlight<grpc::Status>>(
        StartRanks<grpc::Status>(halka::testing::AllRanks(kN), [this](int i) {
          v1::JoinRequest req;
          req.set_job_id("waves");
          req.set_worker_id(absl::StrCat("m", i));
          req.set_address(absl::StrCat("127.0.0.1:", 31000 + i));
          req.set_world_size(kN);
          v1::JoinReply reply;
          grpc::ClientContext ctx;
          ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
          grpc::Status s = stub_->Join(&ctx, req, &reply);
          absl::MutexLock lock(&mu_);
          if (s.ok()) {
            answered_.push_back(i);
            generation_ = reply.generation();
          }
          return s;
        }));
  }
  // Also when a test stops early: the shutdown answers the Joins still
  // waiting, so their threads end before what they use goes.
  void TearDown() override {
    if (rdv_ != nullptr) rdv_->Shutdown();
    joins_.reset();
  }
  void ExpectEveryJoinOk() {
    for (const grpc::Status& s : joins_->Join()) {
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
  }
  int Answered() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(answered_.size());
  }
  // Heartbeats every member answered so far that has not beaten yet.
  int BeatAnswered() {
    std::vector<int> who;
    uint64_t generation;
    {
      absl::MutexLock lock(&mu_);
      for (int i : answered_) {
        if (beaten_.insert(i).second) who.push_back(i);
      }
      generation = generation_;
    }
    for (int i : who) {
      v1::HeartbeatRequest req;
      req.set_job_id("waves");
      req.set_worker_id(absl::StrCat("m", i));
      req.set_generation(generation);
      v1::HeartbeatReply reply;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      EXPECT_TRUE(stub_->Heartbeat(&ctx, req, &reply).ok()) << "m" << i;
    }
    return static_cast<int>(who.size());
  }

  static constexpr int kN = 6;
  std::unique_ptr<RendezvousServer> rdv_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::unique_ptr<halka::testing::RanksInFlight<grpc::Status>> joins_;
  absl::Mutex mu_;
  std::vector<int> answered_ ABSL_GUARDED_BY(mu_);
  std::set<int> beaten_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(AnswerWavesTest, EachFirstBeatLetsTheNextAnswerGo) {
  StartJoins(2, absl::Seconds(60));  // only beats release
  // The Join that completes the ring is answered in its own call, and the
  // window's 2 of the others.
  ASSERT_TRUE(WaitFor([&] { return Answered() == 3; }, absl::Seconds(10)))
      << "the first wave (3 of " << kN << ") to be answered; got " << Answered();
  // Nobody has beaten: no further answer goes, however long we wait here.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(Answered(), 3);
  for (int round = 0; round < kN && Answered() < kN; ++round) {
    const int before = Answered();
    ASSERT_GT(BeatAnswered(), 0);
    ASSERT_TRUE(WaitFor([&] { return Answered() > before; }, absl::Seconds(10)))
        << "beats freed the window but no further Join was answered ("
        << before << " of " << kN << ")";
    EXPECT_LE(Answered(), before + 2);  // never more than the window
  }
  EXPECT_EQ(Answered(), kN);
  ExpectEveryJoinOk();
}

TEST_F(AnswerWavesTest, MembersThatNeverBeatDoNotStallTheRing) {
  StartJoins(2, absl::Milliseconds(100));
  ASSERT_TRUE(WaitFor([&] { return Answered() == kN; }, absl::Seconds(20)))
      << "every Join answered, a wave per ack wait; got " << Answered();
  ExpectEveryJoinOk();
}

TEST_F(AnswerWavesTest, ShutdownAnswersTheJoinsStillWaitingForRoom) {
  StartJoins(1, absl::Seconds(60));
  // The ring's last Join (answered in its own call) and the window's one.
  ASSERT_TRUE(WaitFor([&] { return Answered() == 2; }, absl::Seconds(10)))
      << Answered();
  rdv_->Shutdown();  // must not wait on the four paced answers
  ExpectEveryJoinOk();  // their rings are theirs: answered, not refused
  EXPECT_EQ(Answered(), kN);
}

}  // namespace
}  // namespace halka
