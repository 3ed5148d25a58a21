// The call-numbering rule (worker/numbering.h) without gRPC: which number a
// worker's first operation on a new ring runs as, which calls are stale, and
// what a call's place in its caller's order asks (lost calls, late ones).
#include "worker/numbering.h"

#include "gtest/gtest.h"

namespace halka {
namespace {

v1::Membership Members(uint64_t generation,
                       std::vector<std::tuple<std::string, uint64_t, bool>> m) {
  v1::Membership out;
  out.set_generation(generation);
  int rank = 0;
  for (const auto& [id, since, alive] : m) {
    v1::Member* x = out.add_members();
    x->set_rank(rank++);
    x->set_worker_id(id);
    x->set_address(id + ":1");
    x->set_since_generation(since);
    x->set_alive(alive);
  }
  return out;
}

TEST(FindSelfTest, MatchesIdAndAddressOfAnAliveMember) {
  v1::Membership m = Members(3, {{"w0", 1, true}, {"w1", 2, true}, {"w2", 3, true}});
  SelfInMembership s = FindSelf(m, "w1", "w1:1");
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.since_generation, 2u);
  EXPECT_TRUE(s.others_older);  // w0 since 1
  EXPECT_EQ(FindSelf(m, "w1", "w1:2").rank, -1);  // another process
  EXPECT_FALSE(FindSelf(m, "w0", "w0:1").others_older);
}

TEST(FindSelfTest, DeadMembersAreNeitherSelfNorOlder) {
  v1::Membership m = Members(4, {{"w0", 1, false}, {"w1", 4, true}});
  EXPECT_EQ(FindSelf(m, "w0", "w0:1").rank, -1);
  EXPECT_FALSE(FindSelf(m, "w1", "w1:1").others_older);
}

TEST(DecideNumberingTest, FirstRingOfAFreshJobStartsAtOne) {
  NumberingInput in;  // as at Join: no ring, seq 1
  in.self = {0, 1, false};
  NumberingDecision d = DecideNumbering(in);
  EXPECT_EQ(d.first_op_seq, 1u);
  EXPECT_FALSE(d.adopted);
  EXPECT_FALSE(d.refuse_retry);
}

TEST(DecideNumberingTest, NewcomerAdoptsTheRingsNumber) {
  NumberingInput in;
  in.self = {3, 5, true};
  NumberingDecision d = DecideNumbering(in);
  EXPECT_EQ(d.first_op_seq, 0u);
  EXPECT_TRUE(d.adopted);
}

TEST(DecideNumberingTest, MemberThatRanOperationsKeepsItsNumber) {
  NumberingInput in;
  in.last_ring_generation = 4;
  in.last_ring_numbered = true;
  in.seq = 17;
  in.self = {1, 1, true};
  NumberingDecision d = DecideNumbering(in);
  EXPECT_EQ(d.first_op_seq, 17u);
  EXPECT_FALSE(d.adopted);
}

// The chaos finding: admitted in generation 31, a second admission came
// in 32 before any operation. The ring built at 31 never got a number, so
// the worker is as new as one admitted now and must adopt (it used to
// start from #1 while the ring was at #200).
TEST(DecideNumberingTest, AdmittedTwiceBeforeAnyOperationStillAdopts) {
  NumberingInput in;
  in.last_ring_generation = 31;
  in.last_ring_numbered = false;
  in.seq = 1;
  in.self = {2, 31, true};
  NumberingDecision d = DecideNumbering(in);
  EXPECT_EQ(d.first_op_seq, 0u);
  EXPECT_TRUE(d.adopted);
}

TEST(DecideNumberingTest, ReadmittedSinceTheLastRingAdopts) {
  NumberingInput in;
  in.last_ring_generation = 7;
  in.last_ring_numbered = true;
  in.seq = 40;
  in.self = {0, 9, true};  // lost and re-admitted in 9
  EXPECT_TRUE(DecideNumbering(in).adopted);
}

TEST(DecideNumberingTest, WhenEveryoneIsNewTheRingStartsFromOwnNumber) {
  NumberingInput in;
  in.last_ring_generation = 7;
  in.last_ring_numbered = true;
  in.seq = 40;
  in.self = {0, 9, false};  // nobody older: no number to adopt
  NumberingDecision d = DecideNumbering(in);
  EXPECT_EQ(d.first_op_seq, 40u);
  EXPECT_FALSE(d.adopted);
}

TEST(DecideNumberingTest, ReRunAcrossOwnReadmissionIsRefused) {
  NumberingInput in;
  in.last_ring_generation = 7;
  in.last_ring_numbered = true;
  in.seq = 40;
  in.retry = true;
  in.self = {0, 9, true};
  EXPECT_TRUE(DecideNumbering(in).refuse_retry);
  in.self = {0, 1, true};  // a member all along: the re-run may go ahead
  NumberingDecision d = DecideNumbering(in);
  EXPECT_FALSE(d.refuse_retry);
  EXPECT_EQ(d.first_op_seq, 40u);
}

TEST(IsStaleCallTest, OnlyCallsOlderThanAnAdoptedRingAreStale) {
  const absl::Time admitted = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(IsStaleCall(false, 5, admitted, 0, absl::FromUnixSeconds(1)));
  EXPECT_TRUE(IsStaleCall(true, 5, admitted, 4, absl::InfiniteFuture()));
  EXPECT_TRUE(IsStaleCall(true, 5, admitted, 5, absl::FromUnixSeconds(999)));
  EXPECT_FALSE(IsStaleCall(true, 5, admitted, 5, absl::FromUnixSeconds(1000)));
  EXPECT_FALSE(IsStaleCall(true, 5, admitted, 6, absl::InfiniteFuture()));
}

// Caller 7's call 5 took #20 on generation 3's ring.
constexpr CallerPlace kLast{7, 5, 20, 3};

TEST(PlaceInCallerOrderTest, TheNextCallOfTheCallerNeedsNothing) {
  const CallerOrder o = PlaceInCallerOrder(kLast, 7, 6, 21, 3);
  EXPECT_FALSE(o.arrived_late);
  EXPECT_EQ(o.lost, 0u);
}

TEST(PlaceInCallerOrderTest, AGapBehindTheRingsNumberGivesTheLostNumbersUp) {
  // Call 6 never arrived: call 7 pairs with #22, the ring is at #21.
  EXPECT_EQ(PlaceInCallerOrder(kLast, 7, 7, 21, 3).lost, 1u);
  EXPECT_EQ(PlaceInCallerOrder(kLast, 7, 9, 21, 3).lost, 3u);
  // A call without an index (a foreign client's) took #21 in between: the
  // worker's count is already where the caller's is.
  EXPECT_EQ(PlaceInCallerOrder(kLast, 7, 7, 22, 3).lost, 0u);
  // The ring is further still (a peer was ahead): nothing to give up.
  EXPECT_EQ(PlaceInCallerOrder(kLast, 7, 7, 30, 3).lost, 0u);
}

TEST(PlaceInCallerOrderTest, ACallAfterItsSuccessorOrACopyArrivesLate) {
  EXPECT_TRUE(PlaceInCallerOrder(kLast, 7, 5, 21, 3).arrived_late);
  EXPECT_TRUE(PlaceInCallerOrder(kLast, 7, 4, 21, 3).arrived_late);
  EXPECT_EQ(PlaceInCallerOrder(kLast, 7, 4, 21, 3).lost, 0u);
}

TEST(PlaceInCallerOrderTest, NothingIsInferredWithoutTheSameCallerAndRing) {
  // Another caller, no caller, no index: arrival order only.
  for (const CallerOrder o :
       {PlaceInCallerOrder(kLast, 8, 9, 21, 3),
        PlaceInCallerOrder(kLast, 0, 9, 21, 3),
        PlaceInCallerOrder(kLast, 7, 0, 21, 3),
        // Another ring: the numbering rules of a new generation apply.
        PlaceInCallerOrder(kLast, 7, 7, 21, 4),
        // The last call took no number known here; the ring adopts one.
        PlaceInCallerOrder(CallerPlace{7, 5, 0, 3}, 7, 7, 21, 3),
        PlaceInCallerOrder(kLast, 7, 7, 0, 3)}) {
    EXPECT_FALSE(o.arrived_late);
    EXPECT_EQ(o.lost, 0u);
  }
}

TEST(PlaceInCallerOrderTest, AGapLongerThanTheBoundIsNotGuessedAt) {
  EXPECT_EQ(PlaceInCallerOrder(kLast, 7, 6 + kMaxLostCalls, 21, 3).lost,
            kMaxLostCalls);
  EXPECT_FALSE(PlaceInCallerOrder(kLast, 7, 6 + kMaxLostCalls, 21, 3)
                   .gap_too_long);
  const CallerOrder far = PlaceInCallerOrder(kLast, 7, 7 + kMaxLostCalls, 21, 3);
  EXPECT_EQ(far.lost, 0u);
  EXPECT_TRUE(far.gap_too_long);
  // A long gap in indices whose numbers the ring mostly passed already is
  // not too long: only the numbers still ahead count.
  EXPECT_EQ(PlaceInCallerOrder(kLast, 7, 200, 200 + 20 - 5 - 2, 3).lost, 2u);
}

}  // namespace
}  // namespace halka
