// Groups inside a job's ring (core/sub_ring.h): the job's inbox routes a
// group's frames to the group's inbox as the sender's group rank, holds
// those that come before the group is attached (bounded) and hands them
// over in order, refuses a non-member's, forwards link failures and
// interrupts; the landing board never takes a group's frame; the group's
// id; and sub-rings over the in-process transport, several at once beside
// the job's own collectives, bit for bit.
#include <future>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/sub_ring.h"
#include "core/testing/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/inproc_ring.h"
#include "tests/testing/run_ranks.h"

namespace halka {
namespace {

InFrame GroupFrame(uint64_t group, uint64_t op_seq, int sender, int step,
                   std::vector<uint8_t> bytes = {}) {
  InFrame f;
  f.meta.kind = FrameKind::kData;
  f.meta.group = group;
  f.meta.op_seq = op_seq;
  f.meta.sender_rank = sender;
  f.meta.step = step;
  f.meta.phase = Phase::kReduceScatter;
  f.meta.dtype = DType::kUInt8;
  f.meta.count = bytes.size();
  auto own = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  if (!own->empty()) f.pieces.push_back(absl::MakeConstSpan(*own));
  f.keepalive = own;
  return f;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

TEST(GroupId, TheSameListTheSameIdAnotherOrderOrTagAnother) {
  EXPECT_EQ(GroupId({0, 2, 3}), GroupId({0, 2, 3}));
  EXPECT_EQ(GroupId({0, 2, 3}, 9), GroupId({0, 2, 3}, 9));
  EXPECT_NE(GroupId({0, 2, 3}, 9), GroupId({0, 2, 3}, 10));
  EXPECT_NE(GroupId({0, 2, 3}), GroupId({0, 3, 2}));
  EXPECT_NE(GroupId({0, 2}), GroupId({0, 2, 3}));
  EXPECT_NE(GroupId({1}), 0u);
}

TEST(InboxGroups, FramesGoToTheGroupAsItsRanks) {
  Inbox job(4);
  auto group = std::make_shared<Inbox>(2);
  const uint64_t id = GroupId({3, 1});
  ASSERT_TRUE(job.AttachGroup(id, {3, 1}, group).ok());
  ASSERT_TRUE(job.Deliver(1, GroupFrame(id, 1, 1, 0, {7, 8})).ok());
  ASSERT_TRUE(job.Deliver(3, GroupFrame(id, 1, 3, 0, {9})).ok());
  Inbox::Event ev = group->Next(1, 1, {}, Soon());
  ASSERT_EQ(ev.type, Inbox::Event::kFrame);
  EXPECT_EQ(ev.frame.meta.sender_rank, 1);  // job rank 1 is group rank 1
  EXPECT_EQ(ev.frame.meta.group, 0u);       // the group's own frame there
  EXPECT_EQ(ev.frame.PayloadBytes(), 2u);
  ev = group->Next(0, 1, {}, Soon());
  ASSERT_EQ(ev.type, Inbox::Event::kFrame);
  EXPECT_EQ(ev.frame.meta.sender_rank, 0);  // job rank 3 is group rank 0
  // Nothing of the group stayed in the job's inbox.
  EXPECT_EQ(job.Next(1, 1, {}, absl::Now()).type, Inbox::Event::kTimeout);
  EXPECT_EQ(job.MaxOpSeqSeen(), 0u);
  // A rank outside the group cannot speak for it.
  absl::Status s = job.Deliver(0, GroupFrame(id, 1, 0, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "not a member")) << s;
  // Attached twice, or as group 0: refused.
  EXPECT_FALSE(job.AttachGroup(id, {3, 1}, group).ok());
  EXPECT_FALSE(job.AttachGroup(0, {3, 1}, group).ok());
}

TEST(InboxGroups, EarlyFramesAreHeldThenHandedOverInOrder) {
  Inbox job(4);
  const uint64_t id = GroupId({0, 2});
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(job.Deliver(2, GroupFrame(id, 1, 2, step, {uint8_t(step)})).ok());
  }
  auto group = std::make_shared<Inbox>(2);
  ASSERT_TRUE(job.AttachGroup(id, {0, 2}, group).ok());
  ASSERT_TRUE(job.Deliver(2, GroupFrame(id, 1, 2, 5, {5})).ok());
  for (int step = 0; step < 6; ++step) {
    Inbox::Event ev = group->Next(1, 1, {}, Soon());
    ASSERT_EQ(ev.type, Inbox::Event::kFrame) << step;
    EXPECT_EQ(ev.frame.meta.step, step);
    ASSERT_EQ(ev.frame.PayloadBytes(), 1u);
    EXPECT_EQ(ev.frame.pieces[0][0], step);
  }
  // Detached: held again, handed over at the next attach.
  job.DetachGroup(id);
  ASSERT_TRUE(job.Deliver(2, GroupFrame(id, 2, 2, 0)).ok());
  auto again = std::make_shared<Inbox>(2);
  ASSERT_TRUE(job.AttachGroup(id, {0, 2}, again).ok());
  EXPECT_EQ(again->Next(1, 2, {}, Soon()).type, Inbox::Event::kFrame);
}

TEST(InboxGroups, WhatIsHeldForUnattachedGroupsIsBoundedOldestFirst) {
  Inbox job(4);
  Inbox::ByteBudget budget;
  budget.per_peer = 1000;
  job.SetByteBudget(budget);
  for (size_t g = 0; g < Inbox::kMaxHeldGroups; ++g) {
    ASSERT_TRUE(job.Deliver(1, GroupFrame(1000 + g, 1, 1, 0)).ok()) << g;
  }
  // The 65th group lets go of the first.
  absl::Status s = job.Deliver(1, GroupFrame(5, 1, 1, 0));
  EXPECT_TRUE(s.ok()) << s;
  auto first = std::make_shared<Inbox>(2), last = std::make_shared<Inbox>(2);
  ASSERT_TRUE(job.AttachGroup(1000, {0, 1}, first).ok());
  ASSERT_TRUE(job.AttachGroup(5, {0, 1}, last).ok());
  EXPECT_EQ(first->Next(1, 1, {}, absl::Now()).type, Inbox::Event::kTimeout);
  EXPECT_EQ(last->Next(1, 1, {}, Soon()).type, Inbox::Event::kFrame);
  // Bytes: an attached group's held frames leave the count.
  Inbox other(4);
  other.SetByteBudget(budget);
  ASSERT_TRUE(other.Deliver(1, GroupFrame(7, 1, 1, 0, std::vector<uint8_t>(600))).ok());
  s = other.Deliver(1, GroupFrame(7, 1, 1, 1, std::vector<uint8_t>(600)));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  auto group = std::make_shared<Inbox>(2);
  ASSERT_TRUE(other.AttachGroup(7, {0, 1}, group).ok());
  EXPECT_TRUE(other.Deliver(1, GroupFrame(8, 1, 1, 0, std::vector<uint8_t>(600))).ok());
  // Room for a new group is made by letting go of the one held longest.
  EXPECT_TRUE(other.Deliver(1, GroupFrame(9, 1, 1, 0, std::vector<uint8_t>(600))).ok());
  auto nine = std::make_shared<Inbox>(2), eight = std::make_shared<Inbox>(2);
  ASSERT_TRUE(other.AttachGroup(9, {0, 1}, nine).ok());
  ASSERT_TRUE(other.AttachGroup(8, {0, 1}, eight).ok());
  EXPECT_EQ(nine->Next(1, 1, {}, Soon()).type, Inbox::Event::kFrame);
  EXPECT_EQ(eight->Next(1, 1, {}, absl::Now()).type, Inbox::Event::kTimeout);
  // A frame larger than the room for held frames: refused, and nothing
  // held is let go of for it.
  ASSERT_TRUE(other.Deliver(1, GroupFrame(11, 1, 1, 0, {1})).ok());
  s = other.Deliver(1, GroupFrame(10, 1, 1, 0, std::vector<uint8_t>(1200)));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  auto eleven = std::make_shared<Inbox>(2);
  ASSERT_TRUE(other.AttachGroup(11, {0, 1}, eleven).ok());
  EXPECT_EQ(eleven->Next(1, 1, {}, Soon()).type, Inbox::Event::kFrame);
}

TEST(InboxGroups, LinkFailuresAndInterruptsReachTheGroup) {
  Inbox job(4);
  auto group = std::make_shared<Inbox>(2);
  const uint64_t id = GroupId({2, 3});
  ASSERT_TRUE(job.AttachGroup(id, {2, 3}, group).ok());
  job.LinkFailed(0, absl::UnavailableError("rank 0 gone"));  // not a member
  const int watch_both[] = {0, 1};
  EXPECT_EQ(group->Next(0, 1, watch_both, absl::Now()).type,
            Inbox::Event::kTimeout);
  job.LinkFailed(3, absl::UnavailableError("rank 3 gone"));
  Inbox::Event ev = group->Next(0, 1, watch_both, Soon());
  ASSERT_EQ(ev.type, Inbox::Event::kLinkFailed);
  EXPECT_EQ(ev.peer, 1);  // job rank 3 is group rank 1
  // An interrupt for the job's operation alone (AbortIfUntouched) stays
  // there.
  job.Interrupt(absl::AbortedError("the job's operation only"),
                /*groups=*/false);
  group->ClearLinkFailures();
  EXPECT_EQ(group->Next(0, 1, {}, absl::Now()).type, Inbox::Event::kTimeout);
  job.Interrupt(absl::AbortedError("membership changed"));
  ev = group->Next(0, 1, {}, Soon());
  ASSERT_EQ(ev.type, Inbox::Event::kInterrupted);
  EXPECT_EQ(ev.status.code(), absl::StatusCode::kAborted);
  job.ClearInterrupt();
  EXPECT_EQ(group->Next(0, 1, {}, absl::Now()).type, Inbox::Event::kTimeout);
  // A group attached after the interrupt starts interrupted too.
  job.Interrupt(absl::UnavailableError("shutting down"));
  auto late = std::make_shared<Inbox>(2);
  ASSERT_TRUE(job.AttachGroup(GroupId({1, 2}), {1, 2}, late).ok());
  EXPECT_EQ(late->Next(0, 1, {}, Soon()).type, Inbox::Event::kInterrupted);
}

TEST(LandingGroups, AGroupsFrameNeverTakesTheJobsLanding) {
  LandingBoard board;
  board.AddSource(1);
  std::vector<uint8_t> dst(kMinLandingBytes);
  FrameMeta expect;
  expect.kind = FrameKind::kData;
  expect.op_seq = 3;
  expect.phase = Phase::kAllGather;
  expect.count = dst.size();
  expect.dtype = DType::kUInt8;
  std::shared_ptr<Landing> offered =
      board.Offer(1, expect, dst.data(), dst.size());
  ASSERT_NE(offered, nullptr);
  FrameMeta group = expect;
  group.group = GroupId({0, 1});
  EXPECT_EQ(board.Claim(1, group, dst.size()), nullptr);
  EXPECT_NE(board.Claim(1, expect, dst.size()), nullptr);
}

// Over the in-process transport: groups {0,1} and {2,3} and {3,1} run
// at once with the job's own all-reduce, repeatedly; every result is
// its ranks' reduction, bit for bit.
TEST(SubRings, GroupsAndTheJobRunAtOnceBitForBit) {
  const int g = 4;
  halka::testing::InProcRing ring(g, 64);
  const std::vector<std::vector<int>> groups = {{0, 1}, {2, 3}, {3, 1}};
  std::vector<std::vector<std::unique_ptr<SubRing>>> subs(groups.size());
  for (size_t k = 0; k < groups.size(); ++k) {
    for (int r : groups[k]) {
      absl::StatusOr<std::unique_ptr<SubRing>> s = SubRing::Attach(
          ring.comms[r]->config(), ring.net.transport(r), ring.net.inbox(r),
          groups[k]);
      ASSERT_TRUE(s.ok()) << s.status();
      subs[k].push_back(std::move(*s));
    }
  }
  const size_t n = 1001;
  for (int round = 0; round < 4; ++round) {
    std::vector<std::vector<uint8_t>> job =
        MakeRanksData(DType::kFloat32, ReduceOp::kSum, n, g, 10 + round);
    const std::vector<std::vector<uint8_t>> job_inputs = job;
    std::vector<std::vector<std::vector<uint8_t>>> data(groups.size());
    std::vector<std::future<std::vector<absl::StatusOr<OpResult>>>> running;
    for (size_t k = 0; k < groups.size(); ++k) {
      const int m = static_cast<int>(groups[k].size());
      data[k] = MakeRanksData(DType::kFloat32, ReduceOp::kMax, n, m,
                              round * 7 + static_cast<int>(k));
      running.push_back(std::async(std::launch::async, [&, k, m] {
        return halka::testing::RunRanks<absl::StatusOr<OpResult>>(
            m, [&, k](int i) {
              return subs[k][i]->comm().AllReduce(
                  data[k][i].data(), n, DType::kFloat32, ReduceOp::kMax,
                  absl::ZeroDuration());
            });
      }));
    }
    auto job_results = ring.AllReduce(job, n, DType::kFloat32, ReduceOp::kSum);
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(job_results[r].ok()) << job_results[r].status();
      EXPECT_EQ(job_results[r]->op_seq, static_cast<uint64_t>(round + 1));
      const CheckResult c = CheckAllReduce(DType::kFloat32, ReduceOp::kSum,
                                           job_inputs, job[r].data(), n);
      ASSERT_EQ(c.wrong, 0u) << "job rank " << r << ": " << c.first;
      ASSERT_EQ(job[r], job[0]) << "job rank " << r << " differs from 0";
    }
    for (size_t k = 0; k < groups.size(); ++k) {
      std::vector<absl::StatusOr<OpResult>> res = running[k].get();
      std::vector<std::vector<uint8_t>> inputs = MakeRanksData(
          DType::kFloat32, ReduceOp::kMax, n,
          static_cast<int>(groups[k].size()), round * 7 + static_cast<int>(k));
      for (size_t i = 0; i < res.size(); ++i) {
        ASSERT_TRUE(res[i].ok()) << res[i].status();
        EXPECT_EQ(res[i]->rank, static_cast<int>(i));
        EXPECT_EQ(res[i]->world_size, static_cast<int>(groups[k].size()));
        EXPECT_EQ(res[i]->op_seq, static_cast<uint64_t>(round + 1));
        const CheckResult c = CheckAllReduce(DType::kFloat32, ReduceOp::kMax,
                                             inputs, data[k][i].data(), n);
        ASSERT_EQ(c.wrong, 0u) << "group " << k << " rank " << i << ": "
                               << c.first;
      }
    }
  }
}

// A member whose call is refused before it reaches the group gives its
// number up (SkipNextOp): the other's copy fails at once naming it, and
// the group's next call pairs.
TEST(SubRings, ASkippedNumberFailsTheOthersAtOnceAndTheNextPairs) {
  halka::testing::InProcRing ring(3, 64);
  std::vector<std::unique_ptr<SubRing>> subs;
  for (int r : {2, 0}) {
    absl::StatusOr<std::unique_ptr<SubRing>> s = SubRing::Attach(
        ring.comms[r]->config(), ring.net.transport(r), ring.net.inbox(r),
        {2, 0}, /*tag=*/5);
    ASSERT_TRUE(s.ok()) << s.status();
    subs.push_back(std::move(*s));
  }
  std::vector<float> x(10, 1.0f), y(10, 2.0f);
  const absl::Time start = absl::Now();
  auto waiting = std::async(std::launch::async, [&] {
    return subs[1]->comm().AllReduce(x.data(), x.size(), DType::kFloat32,
                                     ReduceOp::kSum, absl::Seconds(20));
  });
  absl::StatusOr<uint64_t> skipped =
      subs[0]->comm().SkipNextOp(absl::InvalidArgumentError("bad counts"));
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(*skipped, 1u);
  absl::StatusOr<OpResult> failed = waiting.get();
  ASSERT_FALSE(failed.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "w2"))
      << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "bad counts"))
      << failed.status();
  auto again = std::async(std::launch::async, [&] {
    return subs[1]->comm().AllReduce(x.data(), x.size(), DType::kFloat32,
                                     ReduceOp::kSum, absl::Seconds(20));
  });
  absl::StatusOr<OpResult> mine = subs[0]->comm().AllReduce(
      y.data(), y.size(), DType::kFloat32, ReduceOp::kSum, absl::Seconds(20));
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_TRUE(again.get().ok());
  EXPECT_EQ(mine->op_seq, 2u);
  EXPECT_EQ(x, std::vector<float>(10, 3.0f));
  EXPECT_EQ(y, x);
  EXPECT_EQ(subs[0]->Name(), "group [2,0] tag 5");
}

TEST(SubRings, AttachRefusesWhatIsNotAGroupOfThisRank) {
  halka::testing::InProcRing ring(3, 64);
  auto attach = [&](std::vector<int> ranks) {
    return SubRing::Attach(ring.comms[0]->config(), ring.net.transport(0),
                           ring.net.inbox(0), std::move(ranks))
        .status();
  };
  EXPECT_TRUE(absl::StrContains(attach({}).message(), "at least one"));
  EXPECT_TRUE(absl::StrContains(attach({1, 2}).message(), "rank 0"));
  EXPECT_TRUE(absl::StrContains(attach({0, 3}).message(), "not a rank"));
  EXPECT_TRUE(absl::StrContains(attach({0, 0}).message(), "repeated"));
  absl::StatusOr<std::unique_ptr<SubRing>> held = SubRing::Attach(
      ring.comms[0]->config(), ring.net.transport(0), ring.net.inbox(0),
      {2, 0});
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ((*held)->comm().config().rank, 1);
  EXPECT_EQ((*held)->Name(), "group [2,0]");
  // The same group again on the same inbox while it is attached: refused;
  // once it is gone, the group can be made again.
  EXPECT_EQ(attach({2, 0}).code(), absl::StatusCode::kInvalidArgument);
  held->reset();
  EXPECT_TRUE(attach({2, 0}).ok());
}

}  // namespace
}  // namespace halka
