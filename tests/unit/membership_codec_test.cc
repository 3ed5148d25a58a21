// The compact memberships of the rendezvous wire: deflated Join replies
// and Watch deltas (issue 18).
#include "codec/membership_codec.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace halka {
namespace {

v1::Member M(int rank, const std::string& id, uint64_t since, bool alive = true) {
  v1::Member m;
  m.set_rank(rank);
  m.set_worker_id(id);
  m.set_address(absl::StrCat("10.0.0.", rank, ":7000-", id));
  m.set_device("cpu");
  m.set_alive(alive);
  m.set_since_generation(since);
  m.set_last_heartbeat_age_s(0.25);
  return m;
}

v1::Membership Ring(uint64_t generation, const std::vector<std::string>& ids,
                    uint64_t since = 1) {
  v1::Membership m;
  m.set_job_id("job");
  m.set_generation(generation);
  m.set_world_size(static_cast<int>(ids.size()));
  m.set_min_world_size(2);
  m.set_max_world_size(8);
  m.set_job_state(v1::JOB_STATE_HEALTHY);
  for (size_t i = 0; i < ids.size(); ++i) {
    *m.add_members() = M(static_cast<int>(i), ids[i], since);
  }
  return m;
}

// `m` without the members' heartbeat ages (a delta does not carry them).
v1::Membership NoAges(v1::Membership m) {
  for (v1::Member& x : *m.mutable_members()) x.clear_last_heartbeat_age_s();
  for (v1::Member& x : *m.mutable_lost()) x.clear_last_heartbeat_age_s();
  return m;
}

bool Same(const v1::Membership& a, const v1::Membership& b) {
  std::string diff;
  google::protobuf::util::MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  const bool same = d.Compare(a, b);
  if (!same) ADD_FAILURE() << diff;
  return same;
}

// A member's address stays tied to its id when its rank changes.
v1::Membership Renumbered(v1::Membership m) {
  for (int i = 0; i < m.members_size(); ++i) {
    v1::Member* x = m.mutable_members(i);
    x->set_rank(i);
  }
  return m;
}

TEST(MembershipCodecTest, DeflateRoundTripsWithoutAges) {
  std::vector<std::string> ids;
  for (int i = 0; i < 1024; ++i) ids.push_back(absl::StrCat("worker-", i));
  v1::Membership m = Ring(3, ids);
  *m.add_lost() = M(7, "gone", 1, false);
  m.set_change("generation 2->3: rank 7 (gone) lost");
  const std::string packed = DeflateMembership(m);
  // The point of it: several times smaller than the plain message.
  EXPECT_LT(packed.size() * 4, m.ByteSizeLong());
  absl::StatusOr<v1::Membership> back = InflateMembership(packed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(Same(*back, NoAges(m)));
  EXPECT_EQ(back->members(1000).worker_id(), "worker-1000");
  EXPECT_EQ(back->members(1000).last_heartbeat_age_s(), 0);
}

TEST(MembershipCodecTest, InflateRefusesGarbageAndTruncation) {
  EXPECT_EQ(InflateMembership("not zlib at all").status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string packed = DeflateMembership(Ring(1, {"a", "b", "c"}));
  EXPECT_EQ(InflateMembership(packed.substr(0, packed.size() / 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InflateMembership("").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MembershipCodecTest, LeaveInTheMiddleIsTwoRunsAndNoMembers) {
  std::vector<std::string> ids;
  for (int i = 0; i < 100; ++i) ids.push_back(absl::StrCat("w", i));
  const v1::Membership base = Ring(4, ids);
  std::vector<std::string> left = ids;
  left.erase(left.begin() + 40);
  v1::Membership next = Ring(5, left);
  // Ring() gives new addresses by rank; keep each member's own.
  for (int i = 40; i < next.members_size(); ++i) {
    next.mutable_members(i)->set_address(base.members(i + 1).address());
  }
  next.set_change("generation 4->5: w40 left");
  *next.add_lost() = base.members(40);
  const v1::Membership d = MakeMembershipDelta(base, next);
  EXPECT_EQ(d.delta_base(), 4u);
  EXPECT_EQ(d.members_size(), 0);
  ASSERT_EQ(d.delta_runs_size(), 4);
  EXPECT_EQ(d.delta_runs(0), 0);
  EXPECT_EQ(d.delta_runs(1), 40);
  EXPECT_EQ(d.delta_runs(2), 41);
  EXPECT_EQ(d.delta_runs(3), 59);
  EXPECT_EQ(d.lost_size(), 1);
  EXPECT_LT(d.ByteSizeLong() * 20, next.ByteSizeLong());
  absl::StatusOr<v1::Membership> got = ApplyMembershipDelta(base, d);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(Same(NoAges(*got), NoAges(next)));
  EXPECT_EQ(got->lost(0).last_heartbeat_age_s(), 0.25);  // sent whole
  EXPECT_EQ(got->members(40).worker_id(), "w41");
  EXPECT_EQ(got->members(40).rank(), 40);
}

TEST(MembershipCodecTest, HostsAndTheRingOrderSurviveADelta) {
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(absl::StrCat("w", i));
  v1::Membership base = Ring(4, ids);
  for (int i = 0; i < 6; ++i) {
    base.mutable_members(i)->set_host(i % 2 == 0 ? "A" : "B");
  }
  v1::Membership next = base;
  next.set_generation(5);
  next.set_change("generation 4->5: nothing but the order");
  for (int r : {0, 2, 4, 1, 3, 5}) next.add_ring_order(r);
  v1::HostGroup* a = next.add_hosts();
  a->set_host("A");
  for (int r : {0, 2, 4}) a->add_ranks(r);
  // Every member is copied: the hosts ride on the base, the order whole.
  const v1::Membership d = MakeMembershipDelta(base, next);
  EXPECT_EQ(d.members_size(), 0);
  absl::StatusOr<v1::Membership> got = ApplyMembershipDelta(base, d);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(Same(NoAges(*got), NoAges(next)));
  EXPECT_EQ(got->members(3).host(), "B");
  // A member whose host changed is not a copy.
  v1::Membership moved = next;
  moved.mutable_members(3)->set_host("C");
  EXPECT_EQ(MakeMembershipDelta(base, moved).members_size(), 1);
  // The whole groups, as the rendezvous publishes them: the rule gives
  // them and the order for the members' hosts, so the delta and the
  // deflated form leave both out and the reader derives them.
  v1::HostGroup* b = next.add_hosts();
  b->set_host("B");
  for (int r : {1, 3, 5}) b->add_ranks(r);
  const v1::Membership lean = MakeMembershipDelta(base, next);
  EXPECT_TRUE(lean.host_ring_derived());
  EXPECT_EQ(lean.ring_order_size(), 0);
  EXPECT_EQ(lean.hosts_size(), 0);
  got = ApplyMembershipDelta(base, lean);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(Same(NoAges(*got), NoAges(next)));
  absl::StatusOr<v1::Membership> inflated =
      InflateMembership(DeflateMembership(next));
  ASSERT_TRUE(inflated.ok()) << inflated.status();
  EXPECT_TRUE(Same(*inflated, NoAges(next)));
  // An order the rule does not give travels whole.
  next.clear_ring_order();
  for (int r : {1, 3, 5, 0, 2, 4}) next.add_ring_order(r);
  EXPECT_FALSE(MakeMembershipDelta(base, next).host_ring_derived());
  EXPECT_EQ(MakeMembershipDelta(base, next).ring_order_size(), 6);
}

TEST(MembershipCodecTest, NewcomersReorderingAndDownMembers) {
  const v1::Membership base = Ring(7, {"a", "b", "c", "d", "e"});
  // Generation 8: c is gone, x and y are new (since 8), e moved to the
  // front, b is down (kept while the job waits).
  v1::Membership next = base;
  next.set_generation(8);
  next.clear_members();
  const v1::Member& a = base.members(0);
  const v1::Member& b = base.members(1);
  const v1::Member& d = base.members(3);
  const v1::Member& e = base.members(4);
  for (const v1::Member& m : {e, a, b, d}) *next.add_members() = m;
  *next.add_members() = M(4, "x", 8);
  *next.add_members() = M(5, "y", 8);
  next = Renumbered(next);
  next.mutable_members(2)->set_alive(false);  // b
  next.set_world_size(6);
  next.set_job_state(v1::JOB_STATE_WAITING);
  const v1::Membership delta = MakeMembershipDelta(base, next);
  EXPECT_EQ(delta.members_size(), 2);  // x and y only
  ASSERT_EQ(delta.delta_down_size(), 1);
  EXPECT_EQ(delta.delta_down(0), 2);
  absl::StatusOr<v1::Membership> got = ApplyMembershipDelta(base, delta);
  ASSERT_TRUE(got.ok()) << got.status();
  // x and y arrive as sent (with their ages); the copies carry none.
  v1::Membership want = NoAges(next);
  want.mutable_members(4)->set_last_heartbeat_age_s(0.25);
  want.mutable_members(5)->set_last_heartbeat_age_s(0.25);
  EXPECT_TRUE(Same(*got, want));
  EXPECT_EQ(got->members(0).worker_id(), "e");
  EXPECT_EQ(got->members(0).rank(), 0);
  EXPECT_FALSE(got->members(2).alive());
}

TEST(MembershipCodecTest, ARejoinWithANewSinceGenerationIsNotACopy) {
  const v1::Membership base = Ring(2, {"a", "b", "c"});
  v1::Membership next = base;
  next.set_generation(3);
  next.mutable_members(1)->set_since_generation(3);  // b restarted
  const v1::Membership d = MakeMembershipDelta(base, next);
  ASSERT_EQ(d.members_size(), 1);
  EXPECT_EQ(d.members(0).worker_id(), "b");
  absl::StatusOr<v1::Membership> got = ApplyMembershipDelta(base, d);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->members(1).since_generation(), 3u);
  EXPECT_EQ(got->members(2).worker_id(), "c");
}

TEST(MembershipCodecTest, AWholeMembershipPassesThrough) {
  const v1::Membership whole = Ring(9, {"a", "b"});
  absl::StatusOr<v1::Membership> got =
      ApplyMembershipDelta(Ring(3, {"z"}), whole);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(Same(*got, whole));
}

TEST(MembershipCodecTest, RefusesTheWrongBaseAndBadRuns) {
  const v1::Membership base = Ring(4, {"a", "b", "c"});
  v1::Membership next = Ring(5, {"a", "b"});
  v1::Membership d = MakeMembershipDelta(base, next);
  EXPECT_EQ(ApplyMembershipDelta(Ring(3, {"a", "b", "c"}), d).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Each broken copy of the delta is refused, naming what is wrong.
  auto refused = [&](const std::function<void(v1::Membership*)>& spoil) {
    v1::Membership bad = d;
    spoil(&bad);
    return ApplyMembershipDelta(base, bad).status().code() ==
           absl::StatusCode::kInvalidArgument;
  };
  // 9 members from a base of 3.
  EXPECT_TRUE(refused([](v1::Membership* m) { m->set_delta_runs(1, 9); }));
  EXPECT_TRUE(refused([](v1::Membership* m) { m->add_delta_runs(0); }));
  // A new member that is not there.
  EXPECT_TRUE(refused([](v1::Membership* m) {
    m->add_delta_runs(-1);
    m->add_delta_runs(1);
  }));
  // A new member in no run.
  EXPECT_TRUE(refused([](v1::Membership* m) { *m->add_members() = M(2, "q", 5); }));
  EXPECT_TRUE(refused([](v1::Membership* m) { m->add_delta_down(7); }));
}

TEST(MembershipCodecTest, DeltasChainOverGenerations) {
  std::vector<std::string> ids;
  for (int i = 0; i < 16; ++i) ids.push_back(absl::StrCat("w", i));
  v1::Membership held = Ring(1, ids);
  v1::Membership server = held;
  for (uint64_t g = 2; g <= 6; ++g) {
    v1::Membership next = server;
    next.set_generation(g);
    // Drop the member at g, append a newcomer.
    next.mutable_members()->erase(next.mutable_members()->begin() +
                                  static_cast<int>(g));
    *next.add_members() = M(0, absl::StrCat("new", g), g);
    next = Renumbered(next);
    absl::StatusOr<v1::Membership> got =
        ApplyMembershipDelta(held, MakeMembershipDelta(server, next));
    ASSERT_TRUE(got.ok()) << got.status();
    held = *got;
    server = next;
    EXPECT_TRUE(Same(NoAges(held), NoAges(server))) << "generation " << g;
  }
}

}  // namespace
}  // namespace halka
