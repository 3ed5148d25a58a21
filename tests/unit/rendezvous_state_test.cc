#include "server/rendezvous_state.h"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/rendezvous_fixture.h"

namespace halka {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

// A member view matcher on (rank, worker id, address).
auto IsMember(int rank, const std::string& worker, const std::string& address) {
  return AllOf(Field("rank", &MemberView::rank, rank),
               Field("worker_id", &MemberView::worker_id, worker),
               Field("address", &MemberView::address, address));
}

// A membership view matcher on (state, generation, world size, number of
// members).
auto IsView(JobState state, uint64_t generation, int world_size,
            size_t members) {
  return AllOf(Field("state", &MembershipView::state, state),
               Field("generation", &MembershipView::generation, generation),
               Field("world_size", &MembershipView::world_size, world_size),
               Field("members", &MembershipView::members, SizeIs(members)));
}

class RendezvousStateTest : public testing::RendezvousFixture {
 protected:
  // The members, ranked 0, 1, ... in the order of `workers`, each at its
  // Addr.
  static auto RankedMembers(std::initializer_list<std::string> workers) {
    std::vector<::testing::Matcher<MemberView>> members;
    for (const std::string& w : workers) {
      const int rank = static_cast<int>(members.size());
      members.push_back(IsMember(rank, w, Addr(w)));
    }
    return ElementsAreArray(members);
  }

  void Advance(absl::Duration d) { now_ += d; }

  // One heartbeat of job "j" from each of `ids` at now_, each accepted.
  void Beat(std::initializer_list<const char*> ids) {
    for (const char* id : ids) {
      ASSERT_TRUE(state_.Heartbeat("j", id, "", now_).ok()) << id;
    }
  }
};

TEST_F(RendezvousStateTest, FormsExactlyWhenWorldSizeJoined) {
  ASSERT_TRUE(Join("j", "w0", 3).ok());
  EXPECT_FALSE(state_.GetAssignment("j", "w0").has_value());
  ASSERT_TRUE(Join("j", "w1", 3).ok());
  EXPECT_FALSE(state_.GetAssignment("j", "w0").has_value());
  EXPECT_FALSE(state_.GetAssignment("j", "w1").has_value());
  ASSERT_TRUE(Join("j", "w2", 3).ok());

  for (int i = 0; i < 3; ++i) {
    std::optional<Assignment> a =
        state_.GetAssignment("j", absl::StrCat("w", i));
    ASSERT_TRUE(a.has_value()) << i;
    EXPECT_EQ(a->rank, i);
    EXPECT_EQ(a->view.world_size, 3);
    EXPECT_EQ(a->view.generation, 1u);
    EXPECT_THAT(a->view.members, RankedMembers({"w0", "w1", "w2"}));
    for (const MemberView& m : a->view.members) {
      EXPECT_TRUE(m.alive);
      EXPECT_EQ(m.device, "cpu");
    }
  }
  // Not a member, unknown job.
  EXPECT_FALSE(state_.GetAssignment("j", "stranger").has_value());
  EXPECT_FALSE(state_.GetAssignment("other", "w0").has_value());
}

TEST_F(RendezvousStateTest, WorldOfOneFormsImmediately) {
  ASSERT_TRUE(Join("solo", "w0", 1).ok());
  std::optional<Assignment> a = state_.GetAssignment("solo", "w0");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->rank, 0);
  EXPECT_EQ(a->view.generation, 1u);
  EXPECT_THAT(a->view.members, RankedMembers({"w0"}));
}

TEST_F(RendezvousStateTest, EmptyDeviceDefaultsToCpu) {
  JoinArgs a = Args("j", "w0", 1);
  a.device = "";
  ASSERT_TRUE(state_.Join(a, now_).ok());
  std::optional<Assignment> as = state_.GetAssignment("j", "w0");
  ASSERT_TRUE(as.has_value());
  EXPECT_EQ(as->view.members[0].device, "cpu");
}

TEST_F(RendezvousStateTest, RequestedRanksHonouredOthersInJoinOrder) {
  // Join order: a(any), b(rank 0), c(any), d(rank 2), e(any).
  ASSERT_TRUE(Join("j", "a", 5).ok());
  ASSERT_TRUE(Join("j", "b", 5, 0).ok());
  ASSERT_TRUE(Join("j", "c", 5).ok());
  ASSERT_TRUE(Join("j", "d", 5, 2).ok());
  EXPECT_FALSE(state_.GetAssignment("j", "a").has_value());
  ASSERT_TRUE(Join("j", "e", 5).ok());

  std::optional<Assignment> a = state_.GetAssignment("j", "c");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->rank, 3);
  EXPECT_THAT(a->view.members, RankedMembers({"b", "a", "d", "c", "e"}));
  EXPECT_EQ(state_.GetAssignment("j", "a")->rank, 1);
  EXPECT_EQ(state_.GetAssignment("j", "b")->rank, 0);
  EXPECT_EQ(state_.GetAssignment("j", "d")->rank, 2);
  EXPECT_EQ(state_.GetAssignment("j", "e")->rank, 4);
}

TEST_F(RendezvousStateTest, AllRanksRequestedInReverse) {
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(Join("j", absl::StrCat("w", i), 4, 3 - i).ok());
  }
  std::optional<Assignment> a = state_.GetAssignment("j", "w0");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->rank, 3);
  EXPECT_THAT(a->view.members, RankedMembers({"w3", "w2", "w1", "w0"}));
}

TEST_F(RendezvousStateTest, DuplicateRequestedRankNamesBothWorkers) {
  ASSERT_TRUE(Join("j", "alpha", 3, 1).ok());
  absl::Status s = Join("j", "beta", 3, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("alpha"));
  EXPECT_THAT(s.message(), HasSubstr("beta"));
  EXPECT_THAT(s.message(), HasSubstr(Addr("alpha")));
  EXPECT_THAT(s.message(), HasSubstr(Addr("beta")));
  EXPECT_THAT(s.message(), HasSubstr("rank 1"));
  // beta was not admitted: the job still misses two.
  EXPECT_THAT(state_.DescribeForming("j"), HasSubstr("1 of 3 joined"));
  EXPECT_THAT(state_.DescribeForming("j"), Not(HasSubstr("beta")));
}

TEST_F(RendezvousStateTest, WorldSizeMismatch) {
  ASSERT_TRUE(Join("j", "w0", 3).ok());
  absl::Status s = Join("j", "w1", 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("w1"));
  EXPECT_THAT(s.message(), HasSubstr("4"));
  EXPECT_THAT(s.message(), HasSubstr("3"));
  EXPECT_THAT(state_.DescribeForming("j"), HasSubstr("1 of 3 joined"));
}

TEST_F(RendezvousStateTest, InvalidArguments) {
  JoinArgs a = Args("j", "w0", 2);
  a.job_id = "";
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kInvalidArgument);
  a = Args("j", "w0", 2);
  a.worker_id = "";
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kInvalidArgument);
  a = Args("j", "w0", 2);
  a.address = "";
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kInvalidArgument);
  a = Args("j", "w0", 0);
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kInvalidArgument);
  a = Args("j", "w0", -3);
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kInvalidArgument);
  a = Args("j", "w0", Opts().max_world_size + 1);  // a limit, not a typo
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kResourceExhausted);
  a = Args("j", "w0", 2, 2);  // rank == world
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kInvalidArgument);
  a = Args("j", "w0", 2, 7);
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kInvalidArgument);
  a = Args("j", "w0", 2, -2);
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kInvalidArgument);
  // None of these created a job.
  EXPECT_EQ(state_.Health("j", now_).status().code(),
            absl::StatusCode::kNotFound);
  // Boundary values that are valid.
  EXPECT_TRUE(state_.Join(Args("j", "w0", 2, 1), now_).ok());
  EXPECT_TRUE(
      state_.Join(Args("big", "w0", Opts().max_world_size), now_).ok());
}

TEST_F(RendezvousStateTest, SameWorkerIdFromAnotherAddress) {
  ASSERT_TRUE(Join("j", "w0", 2).ok());
  JoinArgs a = Args("j", "w0", 2);
  a.address = "10.9.9.9:1";
  absl::Status s = state_.Join(a, now_);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_THAT(s.message(), HasSubstr(Addr("w0")));
  EXPECT_THAT(s.message(), HasSubstr("10.9.9.9:1"));
  EXPECT_THAT(state_.DescribeForming("j"), HasSubstr("1 of 2 joined"));

  // Also after the job formed.
  ASSERT_TRUE(Join("j", "w1", 2).ok());
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(RendezvousStateTest, RejoinSameIdAndAddressIsIdempotent) {
  ASSERT_TRUE(Join("j", "w0", 3).ok());
  ASSERT_TRUE(Join("j", "w0", 3).ok());
  ASSERT_TRUE(Join("j", "w0", 3).ok());
  EXPECT_THAT(state_.DescribeForming("j"), HasSubstr("1 of 3 joined"));
  ASSERT_TRUE(Join("j", "w1", 3).ok());
  EXPECT_FALSE(state_.GetAssignment("j", "w0").has_value());
  ASSERT_TRUE(Join("j", "w2", 3).ok());
  ASSERT_TRUE(state_.GetAssignment("j", "w0").has_value());
  // A retried join after forming changes nothing.
  ASSERT_TRUE(Join("j", "w1", 3).ok());
  std::optional<Assignment> a = state_.GetAssignment("j", "w1");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->rank, 1);
  EXPECT_EQ(a->view.generation, 1u);
  EXPECT_THAT(a->view.members, SizeIs(3));
}

TEST_F(RendezvousStateTest, RejoinRefreshesHeartbeat) {
  Form(2);
  Advance(absl::Seconds(4));
  ASSERT_TRUE(Join("j", "w0", 2).ok());  // a retried join counts as alive
  ASSERT_TRUE(state_.Heartbeat("j", "w1", "", now_).ok());
  Advance(absl::Seconds(4));
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());
}

TEST_F(RendezvousStateTest, JoiningCompleteJobListsMembers) {
  Form(2);
  absl::Status s = Join("j", "late", 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("late"));
  EXPECT_THAT(s.message(), HasSubstr("w0"));
  EXPECT_THAT(s.message(), HasSubstr("w1"));
  EXPECT_THAT(s.message(), HasSubstr("complete"));
}

TEST_F(RendezvousStateTest, DescribeForming) {
  EXPECT_THAT(state_.DescribeForming("j"), HasSubstr("nobody joined"));
  ASSERT_TRUE(Join("j", "w0", 4).ok());
  ASSERT_TRUE(Join("j", "w1", 4).ok());
  EXPECT_EQ(state_.DescribeForming("j"),
            absl::StrCat("job j: 2 of 4 joined (w0 at ", Addr("w0"), ", w1 at ",
                         Addr("w1"), "); 2 missing"));
}

TEST_F(RendezvousStateTest, WithdrawPending) {
  ASSERT_TRUE(Join("j", "w0", 3).ok());
  ASSERT_TRUE(Join("j", "w1", 3).ok());
  state_.WithdrawPending("j", "w0");
  EXPECT_EQ(state_.DescribeForming("j"),
            absl::StrCat("job j: 1 of 3 joined (w1 at ", Addr("w1"),
                         "); 2 missing"));
  // Withdrawing an unknown worker or job is harmless.
  state_.WithdrawPending("j", "nobody");
  state_.WithdrawPending("nojob", "w1");
  EXPECT_THAT(state_.DescribeForming("j"), HasSubstr("1 of 3 joined"));
  // The withdrawn worker no longer counts: three more joins are needed.
  ASSERT_TRUE(Join("j", "w2", 3).ok());
  EXPECT_FALSE(state_.GetAssignment("j", "w1").has_value());
  // The last pending member withdrawing drops the job.
  state_.WithdrawPending("j", "w1");
  state_.WithdrawPending("j", "w2");
  EXPECT_EQ(state_.Health("j", now_).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(state_.DescribeForming("j"), HasSubstr("nobody joined"));
  // The job id is free again, with another world size.
  ASSERT_TRUE(Join("j", "x", 1).ok());
  EXPECT_TRUE(state_.GetAssignment("j", "x").has_value());
}

TEST_F(RendezvousStateTest, WithdrawnRequestedRankIsFreed) {
  ASSERT_TRUE(Join("j", "w0", 2, 0).ok());
  state_.WithdrawPending("j", "w0");
  ASSERT_TRUE(Join("j", "w1", 2, 1).ok());
  ASSERT_TRUE(Join("j", "w2", 2, 0).ok());
  std::optional<Assignment> a = state_.GetAssignment("j", "w2");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->rank, 0);
}

TEST_F(RendezvousStateTest, WithdrawPendingIsNoOpOnceFormed) {
  Form(2);
  state_.WithdrawPending("j", "w0");
  std::optional<Assignment> a = state_.GetAssignment("j", "w0");
  ASSERT_TRUE(a.has_value());
  EXPECT_THAT(a->view.members, SizeIs(2));
  EXPECT_EQ(a->view.generation, 1u);
}

TEST_F(RendezvousStateTest, HeartbeatKeepsMemberAlive) {
  Form(2);
  // w0 beats every second for 20 seconds; w1 too. Nobody dies.
  for (int i = 0; i < 20; ++i) {
    Advance(absl::Seconds(1));
    ASSERT_TRUE(state_.Heartbeat("j", "w0", "t0", now_).ok());
    ASSERT_TRUE(state_.Heartbeat("j", "w1", "t1", now_).ok());
    EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  }
  absl::StatusOr<MembershipView> h = state_.Health("j", now_);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->state, JobState::kHealthy);
  EXPECT_EQ(h->generation, 1u);
  ASSERT_THAT(h->members, SizeIs(2));
  EXPECT_EQ(h->members[0].telemetry, "t0");
  EXPECT_EQ(h->members[1].telemetry, "t1");
  EXPECT_EQ(h->members[0].heartbeat_age, absl::ZeroDuration());
  Advance(absl::Milliseconds(1500));
  h = state_.Health("j", now_);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->members[1].heartbeat_age, absl::Milliseconds(1500));
}

TEST_F(RendezvousStateTest, SweepMarksExactlyTheSilentMemberDead) {
  Form(3);
  // w0 and w2 keep beating; w1 goes silent.
  for (int i = 0; i < 5; ++i) {
    Advance(absl::Seconds(1));
    Beat({"w0", "w2"});
    // Exactly at the timeout (5 s) w1 is not yet older than it.
    EXPECT_THAT(state_.Sweep(now_), IsEmpty()) << i;
  }
  Advance(absl::Milliseconds(1));
  std::vector<std::string> lines = state_.Sweep(now_);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("job j"));
  EXPECT_THAT(lines[0], HasSubstr("rank 1"));
  EXPECT_THAT(lines[0], HasSubstr("w1"));
  EXPECT_THAT(lines[0], HasSubstr(Addr("w1")));

  absl::StatusOr<MembershipView> h = state_.Health("j", now_);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->generation, 2u);
  // A fixed job below its size waits; the lost member stays a placeholder.
  EXPECT_EQ(h->state, JobState::kWaiting);
  EXPECT_THAT(h->change, HasSubstr("generation 1->2: rank 1 (w1, "));
  EXPECT_THAT(h->change, HasSubstr("lost: no heartbeat for 5"));
  ASSERT_THAT(h->members, SizeIs(3));
  EXPECT_TRUE(h->members[0].alive);
  EXPECT_FALSE(h->members[1].alive);
  EXPECT_TRUE(h->members[2].alive);

  // A second sweep reports nothing new and does not bump again.
  Beat({"w0", "w2"});
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  EXPECT_EQ(state_.Health("j", now_)->generation, 2u);
  // Below its size the job runs no ring: nobody has an assignment.
  EXPECT_FALSE(state_.GetAssignment("j", "w0").has_value());
}

TEST_F(RendezvousStateTest, TwoDeathsInOneSweepBumpGenerationOnce) {
  Form(4);
  Advance(absl::Seconds(3));
  Beat({"w2", "w3"});
  Advance(absl::Milliseconds(2100));  // the survivors were heard recently
  std::vector<std::string> lines = state_.Sweep(now_);
  ASSERT_THAT(lines, SizeIs(1));  // one line per generation change
  EXPECT_THAT(lines[0], HasSubstr("rank 0 (w0"));
  EXPECT_THAT(lines[0], HasSubstr("rank 1 (w1"));
  EXPECT_THAT(lines[0], HasSubstr("2 missing"));
  EXPECT_EQ(state_.Health("j", now_)->generation, 2u);
}

TEST_F(RendezvousStateTest, SweepIgnoresFormingJobs) {
  ASSERT_TRUE(Join("j", "w0", 2).ok());
  Advance(absl::Hours(1));
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  absl::StatusOr<MembershipView> h = state_.Health("j", now_);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->state, JobState::kForming);
}

TEST_F(RendezvousStateTest, LostMemberMustJoinAgainAndIsReadmitted) {
  Form(2);
  Advance(absl::Seconds(3));
  ASSERT_TRUE(state_.Heartbeat("j", "w0", "", now_).ok());
  Advance(absl::Milliseconds(2100));  // the survivors were heard recently
  ASSERT_THAT(state_.Sweep(now_), SizeIs(1));
  absl::StatusOr<HeartbeatResult> r = state_.Heartbeat("j", "w1", "", now_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
      << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("w1"));
  EXPECT_THAT(r.status().message(), HasSubstr("join again"));
  // Joining again re-forms the ring in a new generation, same rank.
  ASSERT_TRUE(Join("j", "w1", 2).ok());
  EXPECT_EQ(state_.Health("j", now_)->generation, 3u);
  EXPECT_EQ(state_.Health("j", now_)->state, JobState::kHealthy);
  ASSERT_TRUE(state_.GetAssignment("j", "w1").has_value());
  EXPECT_EQ(state_.GetAssignment("j", "w1")->rank, 1);
  EXPECT_EQ(state_.GetAssignment("j", "w1")->view.members[1].since_generation,
            3u);
  EXPECT_EQ(state_.GetAssignment("j", "w0")->view.members[0].since_generation,
            1u);
}

TEST_F(RendezvousStateTest, HeartbeatReplyListsDeadRanks) {
  Form(4);
  absl::StatusOr<HeartbeatResult> r = state_.Heartbeat("j", "w0", "", now_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generation, 1u);
  EXPECT_THAT(r->dead_ranks, IsEmpty());

  ASSERT_TRUE(state_.Leave("j", "w3", now_).ok());
  // The survivors beat (a whole-job silence over half the timeout would be
  // a blackout, after which everyone gets a full timeout).
  Advance(absl::Milliseconds(1500));
  ASSERT_TRUE(state_.Heartbeat("j", "w0", "", now_).ok());
  Advance(absl::Milliseconds(1500));
  Beat({"w0", "w2"});
  Advance(absl::Milliseconds(2100));  // the survivors were heard recently
  ASSERT_THAT(state_.Sweep(now_), SizeIs(1));  // w1
  r = state_.Heartbeat("j", "w0", "", now_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generation, 3u);
  EXPECT_THAT(r->dead_ranks, ElementsAre(1, 3));
}

TEST_F(RendezvousStateTest, LeaveBumpsGenerationAndDegrades) {
  Form(3);
  ASSERT_TRUE(state_.Leave("j", "w1", now_).ok());
  absl::StatusOr<MembershipView> h = state_.Health("j", now_);
  ASSERT_TRUE(h.ok());
  ASSERT_THAT(*h, IsView(JobState::kWaiting, 2u, 3, 3));
  EXPECT_TRUE(h->members[0].alive);
  EXPECT_FALSE(h->members[1].alive);
  EXPECT_TRUE(h->members[2].alive);
  EXPECT_EQ(h->members[1].worker_id, "w1");

  // Leaving twice is harmless and bumps nothing.
  ASSERT_TRUE(state_.Leave("j", "w1", now_).ok());
  EXPECT_EQ(state_.Health("j", now_)->generation, 2u);
  // The one who left is not swept again later.
  Advance(absl::Seconds(3));
  Beat({"w0", "w2"});
  Advance(absl::Milliseconds(2100));  // the survivors were heard recently
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  EXPECT_EQ(state_.Health("j", now_)->generation, 2u);
  // And it may not heartbeat.
  EXPECT_EQ(state_.Heartbeat("j", "w1", "", now_).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RendezvousStateTest, LeaveWhileFormingWithdraws) {
  ASSERT_TRUE(Join("j", "w0", 3).ok());
  ASSERT_TRUE(Join("j", "w1", 3).ok());
  ASSERT_TRUE(state_.Leave("j", "w0", now_).ok());
  EXPECT_THAT(state_.DescribeForming("j"), HasSubstr("1 of 3 joined"));
  absl::StatusOr<MembershipView> h = state_.Health("j", now_);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->state, JobState::kForming);
  EXPECT_EQ(h->generation, 0u);
}

TEST_F(RendezvousStateTest, HealthStates) {
  ASSERT_TRUE(Join("j", "w0", 2).ok());
  absl::StatusOr<MembershipView> h = state_.Health("j", now_);
  ASSERT_TRUE(h.ok());
  ASSERT_THAT(*h, IsView(JobState::kForming, 0u, 2, 1));
  EXPECT_EQ(h->members[0].rank, -1);
  EXPECT_EQ(h->members[0].worker_id, "w0");

  ASSERT_TRUE(Join("j", "w1", 2).ok());
  h = state_.Health("j", now_);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->state, JobState::kHealthy);
  EXPECT_EQ(h->generation, 1u);
  EXPECT_THAT(h->members, RankedMembers({"w0", "w1"}));

  ASSERT_TRUE(state_.Leave("j", "w0", now_).ok());
  h = state_.Health("j", now_);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->state, JobState::kWaiting);
}

TEST_F(RendezvousStateTest, UnknownJobOrWorkerIsNotFound) {
  EXPECT_EQ(state_.Health("nope", now_).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Heartbeat("nope", "w0", "", now_).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Leave("nope", "w0", now_).code(),
            absl::StatusCode::kNotFound);
  Form(2);
  EXPECT_EQ(state_.Heartbeat("j", "stranger", "", now_).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Leave("j", "stranger", now_).code(),
            absl::StatusCode::kNotFound);
  // Neither disturbed the job.
  EXPECT_EQ(state_.Health("j", now_)->state, JobState::kHealthy);
  EXPECT_EQ(state_.Health("j", now_)->generation, 1u);
}

TEST_F(RendezvousStateTest, MaxJobsLimit) {
  RendezvousOptions o = Opts();
  o.max_jobs = 2;
  RendezvousState state(o);
  ASSERT_TRUE(state.Join(Args("a", "w0", 2), now_).ok());
  ASSERT_TRUE(state.Join(Args("b", "w0", 2), now_).ok());
  absl::Status s = state.Join(Args("c", "w0", 2), now_);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(state.Health("c", now_).status().code(),
            absl::StatusCode::kNotFound);
  // Existing jobs still accept joiners.
  ASSERT_TRUE(state.Join(Args("a", "w1", 2), now_).ok());
  EXPECT_TRUE(state.GetAssignment("a", "w1").has_value());
  // Freeing a slot lets a new job in.
  state.WithdrawPending("b", "w0");
  EXPECT_TRUE(state.Join(Args("c", "w0", 2), now_).ok());
}

TEST_F(RendezvousStateTest, AllSilentAtOnceIsNotALossButExpires) {
  Form(2);
  // Everyone silent past the timeout: a partition of the rendezvous (or a
  // job that ended) changes nothing...
  Advance(absl::Seconds(6));
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  EXPECT_EQ(state_.Health("j", now_)->generation, 1u);
  EXPECT_EQ(state_.Health("j", now_)->state, JobState::kHealthy);
  // ...and when the partition heals the ring carries on.
  Beat({"w0", "w1"});
  // Silence for 10 timeouts forgets the job.
  Advance(absl::Seconds(51));
  std::vector<std::string> lines = state_.Sweep(now_);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("forgotten"));
  EXPECT_EQ(state_.Health("j", now_).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(state_.GetAssignment("j", "w0").has_value());
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  // The id can be used again by a fresh job.
  ASSERT_TRUE(Join("j", "w0", 1).ok());
  std::optional<Assignment> a = state_.GetAssignment("j", "w0");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->view.generation, 1u);
  EXPECT_EQ(a->view.world_size, 1);
}

TEST_F(RendezvousStateTest, JobDroppedWhenAllMembersLeave) {
  Form(3);
  ASSERT_TRUE(state_.Leave("j", "w0", now_).ok());
  ASSERT_TRUE(state_.Leave("j", "w1", now_).ok());
  EXPECT_EQ(state_.Health("j", now_)->generation, 3u);
  ASSERT_TRUE(state_.Leave("j", "w2", now_).ok());
  EXPECT_EQ(state_.Health("j", now_).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Heartbeat("j", "w2", "", now_).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RendezvousStateTest, JobDroppedWhenLastLiveMemberSwept) {
  Form(2);
  ASSERT_TRUE(state_.Leave("j", "w0", now_).ok());
  Advance(absl::Seconds(10));
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());  // the last one: not a loss
  Advance(absl::Seconds(41));
  std::vector<std::string> lines = state_.Sweep(now_);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("job j"));
  EXPECT_THAT(lines[0], HasSubstr("forgotten"));
  EXPECT_EQ(state_.Health("j", now_).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RendezvousStateTest, JobsAreIndependent) {
  Form(2, "a");
  Form(2, "b");
  Advance(absl::Seconds(3));
  ASSERT_TRUE(state_.Heartbeat("a", "w0", "", now_).ok());
  ASSERT_TRUE(state_.Heartbeat("a", "w1", "", now_).ok());
  ASSERT_TRUE(state_.Heartbeat("b", "w0", "", now_).ok());
  Advance(absl::Milliseconds(2100));  // the survivors were heard recently
  std::vector<std::string> lines = state_.Sweep(now_);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("job b"));
  EXPECT_EQ(state_.Health("a", now_)->generation, 1u);
  EXPECT_EQ(state_.Health("a", now_)->state, JobState::kHealthy);
  EXPECT_EQ(state_.Health("b", now_)->generation, 2u);
  EXPECT_EQ(state_.Health("b", now_)->state, JobState::kWaiting);
}


// ---- elastic jobs, re-admission, restore ---------------------------------

JoinArgs Elastic(const std::string& worker, int min, int max,
                 uint64_t incarnation = 0, int rank = -1) {
  JoinArgs a;
  a.job_id = "e";
  a.worker_id = worker;
  a.address = absl::StrCat("host-", worker, ":7000");
  a.min_world_size = min;
  a.max_world_size = max;
  a.incarnation = incarnation;
  a.requested_rank = rank;
  return a;
}

std::vector<std::string> Ids(const MembershipView& v) {
  std::vector<std::string> ids;
  for (const MemberView& m : v.members) {
    ids.push_back(absl::StrCat(m.rank, ":", m.worker_id, m.alive ? "" : "!"));
  }
  return ids;
}

TEST_F(RendezvousStateTest, ElasticFormsAtMaxAtOnce) {
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(state_.Join(Elastic(absl::StrCat("w", i), 2, 4), now_).ok());
  }
  auto h = state_.Health("e", now_);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->generation, 1u);
  EXPECT_EQ(h->state, JobState::kHealthy);
  EXPECT_EQ(h->min_world_size, 2);
  EXPECT_EQ(h->max_world_size, 4);
}

TEST_F(RendezvousStateTest, ElasticFormsAboveMinOnceJoinsSettle) {
  ASSERT_TRUE(state_.Join(Elastic("w0", 2, 4), now_).ok());
  ASSERT_TRUE(state_.Join(Elastic("w1", 2, 4), now_).ok());
  ASSERT_TRUE(state_.Join(Elastic("w2", 2, 4), now_).ok());
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  EXPECT_FALSE(state_.GetAssignment("e", "w0").has_value());
  EXPECT_THAT(state_.DescribeForming("e"), HasSubstr("at least 2"));
  Advance(state_.options().elastic_settle);
  std::vector<std::string> lines = state_.Sweep(now_);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("ring formed with 3 members"));
  auto h = state_.Health("e", now_);
  EXPECT_EQ(h->state, JobState::kDegraded);  // running, below max
  EXPECT_THAT(Ids(*h), ElementsAre("0:w0", "1:w1", "2:w2"));
}

TEST_F(RendezvousStateTest, ElasticLossReformsSurvivorsWithDenseRanks) {
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(state_.Join(Elastic(absl::StrCat("w", i), 2, 4), now_).ok());
  }
  Advance(absl::Seconds(3));
  for (const char* w : {"w0", "w2", "w3"}) {
    ASSERT_TRUE(state_.Heartbeat("e", w, "", now_).ok());
  }
  Advance(absl::Milliseconds(2100));
  std::vector<std::string> lines = state_.Sweep(now_);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("generation 1->2: rank 1 (w1, host-w1:7000) "
                                  "lost: no heartbeat for 5.1s"));
  EXPECT_THAT(lines[0], HasSubstr("ring re-formed with 3 members"));
  auto h = state_.Health("e", now_);
  EXPECT_EQ(h->generation, 2u);
  EXPECT_EQ(h->state, JobState::kDegraded);
  // Survivors keep their rank where it still fits; w3 fills the hole.
  EXPECT_THAT(Ids(*h), ElementsAre("0:w0", "1:w3", "2:w2"));
  ASSERT_THAT(h->lost, SizeIs(1));
  EXPECT_EQ(h->lost[0].worker_id, "w1");
  EXPECT_EQ(state_.GetAssignment("e", "w3")->rank, 1);
  EXPECT_EQ(state_.GetAssignment("e", "w3")->view.world_size, 3);
}

TEST_F(RendezvousStateTest, ElasticBelowMinWaitsThenRecovers) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(state_.Join(Elastic(absl::StrCat("w", i), 2, 3), now_).ok());
  }
  ASSERT_TRUE(state_.Leave("e", "w1", now_).ok());
  EXPECT_EQ(state_.Health("e", now_)->state, JobState::kDegraded);
  ASSERT_TRUE(state_.Leave("e", "w2", now_).ok());
  auto h = state_.Health("e", now_);
  EXPECT_EQ(h->generation, 3u);
  EXPECT_EQ(h->state, JobState::kWaiting);
  EXPECT_THAT(h->change, HasSubstr("1 of at least 2 members live, 1 missing"));
  EXPECT_FALSE(state_.GetAssignment("e", "w0").has_value());
  // A restarted w1 brings it back to min: re-formed at once.
  ASSERT_TRUE(state_.Join(Elastic("w1", 2, 3, 77), now_).ok());
  h = state_.Health("e", now_);
  EXPECT_EQ(h->generation, 4u);
  EXPECT_EQ(h->state, JobState::kDegraded);
  EXPECT_THAT(Ids(*h), ElementsAre("0:w0", "1:w1"));
  EXPECT_EQ(h->members[1].since_generation, 4u);
}

TEST_F(RendezvousStateTest, NewcomerAdmittedAfterSettleNotMidStream) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(state_.Join(Elastic(absl::StrCat("w", i), 2, 5), now_).ok());
  }
  Advance(state_.options().elastic_settle);
  state_.Sweep(now_);
  ASSERT_EQ(state_.Health("e", now_)->generation, 1u);
  ASSERT_TRUE(state_.Join(Elastic("w9", 2, 5, 5, /*rank=*/0), now_).ok());
  EXPECT_EQ(state_.Health("e", now_)->generation, 1u);  // waits for settle
  EXPECT_FALSE(state_.GetAssignment("e", "w9").has_value());
  Advance(state_.options().elastic_settle);
  std::vector<std::string> lines = state_.Sweep(now_);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("admitted w9 at host-w9:7000"));
  auto h = state_.Health("e", now_);
  EXPECT_EQ(h->state, JobState::kDegraded);  // 4 of at most 5
  // w9 asked for rank 0 and gets it; w0 moves to the free rank.
  EXPECT_THAT(Ids(*h), ElementsAre("0:w9", "1:w1", "2:w2", "3:w0"));
}

TEST_F(RendezvousStateTest, FullJobRefusesNewcomer) {
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(state_.Join(Elastic(absl::StrCat("w", i), 1, 2), now_).ok());
  }
  absl::Status s = state_.Join(Elastic("w5", 1, 2), now_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("already complete with 2 members"));
}

TEST_F(RendezvousStateTest, RestartUnderSameIdAndAddressReplacesOldProcess) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        state_.Join(Elastic(absl::StrCat("w", i), 3, 3, 100 + i), now_).ok());
  }
  // Same incarnation: a retried join, nothing changes.
  ASSERT_TRUE(state_.Join(Elastic("w1", 3, 3, 101), now_).ok());
  EXPECT_EQ(state_.Health("e", now_)->generation, 1u);
  // New incarnation at the same address: the old process is lost, the new
  // one takes its place (fixed job: waiting, then re-formed).
  ASSERT_TRUE(state_.Join(Elastic("w1", 3, 3, 555), now_).ok());
  auto h = state_.Health("e", now_);
  EXPECT_EQ(h->generation, 3u);
  EXPECT_EQ(h->state, JobState::kHealthy);
  EXPECT_THAT(Ids(*h), ElementsAre("0:w0", "1:w1", "2:w2"));
  EXPECT_EQ(h->members[1].since_generation, 3u);
  // A new incarnation from another address while the old one lives is two
  // processes claiming one id.
  JoinArgs other = Elastic("w2", 3, 3, 999);
  other.address = "elsewhere:1";
  EXPECT_EQ(state_.Join(other, now_).code(), absl::StatusCode::kAlreadyExists);
}

// Three members' claim of generation 7 (elastic min..max).
RingClaim ClaimOfThree(int min, int max) {
  RingClaim c;
  c.generation = 7;
  c.min_world_size = min;
  c.max_world_size = max;
  for (int i = 0; i < 3; ++i) {
    MemberView v;
    v.rank = i;
    v.worker_id = absl::StrCat("w", i);
    v.address = absl::StrCat("host-w", i, ":7000");
    v.since_generation = 1;
    c.members.push_back(v);
  }
  return c;
}

TEST_F(RendezvousStateTest, RestoreFromClaimKeepsGenerationAndRanks) {
  RingClaim c = ClaimOfThree(2, 4);
  EXPECT_EQ(state_.Heartbeat("e", "w0", "", now_).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(state_.Restore("e", c, now_).ok());
  ASSERT_TRUE(state_.Restore("e", c, now_).ok());  // the others' claims: no-op
  ASSERT_TRUE(state_.Heartbeat("e", "w1", "", now_).ok());
  auto h = state_.Health("e", now_);
  EXPECT_EQ(h->generation, 7u);
  EXPECT_EQ(h->state, JobState::kDegraded);
  EXPECT_THAT(Ids(*h), ElementsAre("0:w0", "1:w1", "2:w2"));
  EXPECT_EQ(state_.GetAssignment("e", "w2")->rank, 2);
  // A member that died during the outage is swept as usual.
  Advance(absl::Milliseconds(1500));
  ASSERT_TRUE(state_.Heartbeat("e", "w0", "", now_).ok());
  Advance(absl::Milliseconds(1500));
  ASSERT_TRUE(state_.Heartbeat("e", "w0", "", now_).ok());
  ASSERT_TRUE(state_.Heartbeat("e", "w1", "", now_).ok());
  Advance(absl::Milliseconds(2100));  // the survivors were heard recently
  ASSERT_THAT(state_.Sweep(now_), SizeIs(1));
  EXPECT_EQ(state_.Health("e", now_)->generation, 8u);
  // Claims that are not rings are refused.
  RingClaim bad = c;
  bad.members[1].rank = 2;
  EXPECT_EQ(state_.Restore("x", bad, now_).code(),
            absl::StatusCode::kInvalidArgument);
}

// A rendezvous restarted with another link model than the claimed ring
// ran with restores it as the next generation (every member rebuilds with
// one model); with the same model, at its generation.
TEST(RendezvousRestore, AnotherLinkModelMakesTheNextGeneration) {
  const RingClaim c = ClaimOfThree(3, 3);
  const LinkModel model = *ParseLinkModel("local=2:8,net=50:1.2");
  RendezvousOptions with_model;
  with_model.link_model = model;
  const absl::Time now = absl::FromUnixSeconds(1000);
  {
    RendezvousState s(with_model);
    ASSERT_TRUE(s.Restore("e", c, now).ok());  // the ring ran with none
    auto h = s.Health("e", now);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->generation, 8u);
    EXPECT_THAT(h->change, HasSubstr("generation 7->8: restored"));
    EXPECT_THAT(h->change, HasSubstr("another link model"));
    ASSERT_TRUE(h->link_model.has_value());
    EXPECT_TRUE(SameLinkModel(h->link_model, model));
  }
  {
    RendezvousState s(with_model);
    RingClaim same = c;
    same.link_model = model;
    same.link_model->net.alpha_s = (model.net.alpha_s * 1e6) * 1e-6;
    ASSERT_TRUE(s.Restore("e", same, now).ok());
    auto h = s.Health("e", now);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->generation, 7u);
  }
  {
    RendezvousState s;  // restarted without one
    RingClaim had = c;
    had.link_model = model;
    ASSERT_TRUE(s.Restore("e", had, now).ok());
    auto h = s.Health("e", now);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->generation, 8u);
    EXPECT_FALSE(h->link_model.has_value());
  }
}

// A member ahead of a restored job (the first claim was stale): the job
// moves past both numbers; members at or behind it change nothing.
TEST(RendezvousRestore, AMemberAheadOfTheRestoredJobMovesItPastBoth) {
  RendezvousState s;
  const absl::Time now = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(s.Restore("e", ClaimOfThree(3, 3), now).ok());  // at 7
  EXPECT_FALSE(s.CatchUp("e", "w0", 7));
  EXPECT_FALSE(s.CatchUp("e", "w0", 6));
  EXPECT_FALSE(s.CatchUp("nope", "w0", 9));
  EXPECT_TRUE(s.CatchUp("e", "w1", 8));
  auto h = s.Health("e", now);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->generation, 9u);
  EXPECT_THAT(h->change, HasSubstr("generation 7->9: worker w1 holds "
                                   "generation 8"));
  EXPECT_FALSE(s.CatchUp("e", "w2", 9));  // now the job's own
}

TEST_F(RendezvousStateTest, StaggeredSilenceOfAWholeJobIsAPartition) {
  Form(3);
  // Heartbeats every second until the rendezvous is cut off; w1's last one
  // came a little earlier than the others'.
  Beat({"w0", "w2"});
  Advance(absl::Milliseconds(900));
  Beat({"w0", "w2"});
  // w1 is late first, but nobody else has been heard for 4.1 s either:
  // the rendezvous is the one cut off, and the ring is left alone.
  Advance(absl::Milliseconds(4100));
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  Advance(absl::Seconds(2));
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  EXPECT_EQ(state_.Health("j", now_)->generation, 1u);
  EXPECT_EQ(state_.Health("j", now_)->state, JobState::kHealthy);
}

TEST_F(RendezvousStateTest, DeclareLostNeedsTheCurrentGeneration) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(state_.Join(Elastic(absl::StrCat("w", i), 2, 3), now_).ok());
  }
  EXPECT_EQ(state_.DeclareLost("e", "w2", 5, "link broke", now_).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(state_.DeclareLost("e", "w2", 1, "lost: link broke", now_).ok());
  auto h = state_.Health("e", now_);
  EXPECT_EQ(h->generation, 2u);
  EXPECT_THAT(h->change, HasSubstr("rank 2 (w2, host-w2:7000) lost: link broke"));
  EXPECT_EQ(state_.DeclareLost("e", "w2", 2, "again", now_).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RendezvousStateTest, ElasticRangeMustAgreeAndBeValid) {
  ASSERT_TRUE(state_.Join(Elastic("w0", 2, 4), now_).ok());
  absl::Status s = state_.Join(Elastic("w1", 3, 4), now_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("[3, 4] but it was created with [2, 4]"));
  EXPECT_EQ(state_.Join(Elastic("w2", 3, 2), now_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.Join(Elastic("w2", 0, 2), now_).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RendezvousStateTest, AJobCreatedAgainHasANewEpoch) {
  EXPECT_EQ(state_.JobEpoch("j"), 0u);
  Form(1);
  const uint64_t first = state_.JobEpoch("j");
  EXPECT_GT(first, 0u);
  ASSERT_TRUE(state_.Leave("j", "w0", now_).ok());
  EXPECT_FALSE(state_.HasJob("j"));
  // The same id, a new job: generation 1 again, a different epoch (a cache
  // keyed by generation alone would answer with the old ring).
  ASSERT_TRUE(Join("j", "v0", 1).ok());
  EXPECT_EQ(state_.Generation("j"), 1u);
  EXPECT_NE(state_.JobEpoch("j"), first);
  EXPECT_EQ(state_.AssignedRank("j", "v0"), 0);
  EXPECT_EQ(state_.AssignedRank("j", "w0"), -1);
  EXPECT_EQ(state_.AssignmentView("j")->members[0].worker_id, "v0");
}

}  // namespace
}  // namespace halka
