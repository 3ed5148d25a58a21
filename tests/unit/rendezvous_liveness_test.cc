// RendezvousState liveness with a fake clock: when a silent member is
// lost, and when silence is not a loss (a blackout of the rendezvous, a
// world that takes long to form).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous_state.h"
#include "tests/testing/rendezvous_fixture.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

class RendezvousLivenessTest : public testing::RendezvousFixture {
 protected:
  // Every worker joins job "j".
  absl::Status Join(const std::string& worker, int world) {
    return RendezvousFixture::Join("j", worker, world);
  }
  void Beat(const std::string& worker) {
    ASSERT_TRUE(state_.Heartbeat("j", worker, "", now_).ok()) << worker;
  }
  void BeatAll(int world) {
    for (int i = 0; i < world; ++i) Beat(absl::StrCat("w", i));
  }
  // Advances by `d` in sweeper steps (half an interval), sweeping each.
  std::vector<std::string> SweepFor(absl::Duration d) {
    std::vector<std::string> lines;
    for (absl::Time end = now_ + d; now_ < end;) {
      now_ = std::min(end, now_ + absl::Milliseconds(500));
      for (std::string& l : state_.Sweep(now_)) lines.push_back(std::move(l));
    }
    return lines;
  }
  uint64_t Generation() { return state_.Generation("j"); }
};

TEST_F(RendezvousLivenessTest, HealedBlackoutGivesEveryoneAFullTimeout) {
  Form(4);
  BeatAll(4);
  // The rendezvous is cut off for twice the timeout: nobody is lost.
  EXPECT_THAT(SweepFor(2 * kTimeout), IsEmpty());
  // One member's heartbeat comes back first; the others' resume one by
  // one within a timeout of it (their heartbeat calls back off).
  Beat("w2");
  EXPECT_THAT(SweepFor(absl::Seconds(2)), IsEmpty());
  Beat("w2");
  Beat("w0");
  EXPECT_THAT(SweepFor(absl::Seconds(2)), IsEmpty());
  Beat("w2");
  Beat("w0");
  Beat("w1");
  EXPECT_THAT(SweepFor(absl::Milliseconds(900)), IsEmpty());
  Beat("w3");  // 4.9 s after the blackout ended
  EXPECT_THAT(SweepFor(absl::Seconds(1)), IsEmpty());
  BeatAll(4);
  EXPECT_THAT(SweepFor(absl::Seconds(1)), IsEmpty());
  EXPECT_EQ(Generation(), 1u);
  EXPECT_EQ(state_.Health("j", now_)->state, JobState::kHealthy);
}

TEST_F(RendezvousLivenessTest, SilentAfterTheBlackoutIsLostOneTimeoutLater) {
  Form(3);
  BeatAll(3);
  EXPECT_THAT(SweepFor(2 * kTimeout), IsEmpty());
  const absl::Time ended = now_;
  // w0 and w1 come back; w2 never does.
  for (int i = 0; i < 5; ++i) {
    Beat("w0");
    Beat("w1");
    EXPECT_THAT(SweepFor(absl::Seconds(1)), IsEmpty()) << i;
  }
  // Exactly one timeout after the blackout ended: not yet older than it.
  EXPECT_EQ(now_, ended + kTimeout);
  EXPECT_EQ(Generation(), 1u);
  Beat("w0");
  Beat("w1");
  now_ += absl::Milliseconds(1);
  std::vector<std::string> lines = state_.Sweep(now_);
  ASSERT_THAT(lines, SizeIs(1));
  // The line gives the real silence (since w2's last heartbeat).
  EXPECT_THAT(lines[0], HasSubstr("rank 2 (w2, host-w2:7000) lost: "
                                  "no heartbeat for 15s"));
  EXPECT_EQ(Generation(), 2u);
}

TEST_F(RendezvousLivenessTest, ShortBlackoutHealsWithoutLoss) {
  // The clean-machine failure: the partition lasted 4 s (less than the
  // timeout), so no sweep saw the whole job late; then the first member
  // came back and the others' ages passed the timeout before theirs did.
  Form(4);
  BeatAll(4);
  EXPECT_THAT(SweepFor(absl::Seconds(4)), IsEmpty());
  Beat("w1");
  EXPECT_THAT(SweepFor(absl::Seconds(2)), IsEmpty());
  Beat("w1");
  EXPECT_THAT(SweepFor(absl::Seconds(2)), IsEmpty());
  BeatAll(4);
  EXPECT_THAT(SweepFor(absl::Seconds(3)), IsEmpty());
  EXPECT_EQ(Generation(), 1u);
}

TEST_F(RendezvousLivenessTest, OneMemberSilentWhileOthersBeatIsStillLost) {
  // No blackout: the job is heard all along, so the usual rule holds.
  Form(3);
  BeatAll(3);
  std::vector<std::string> lines;
  for (int i = 0; i < 6; ++i) {
    now_ += absl::Seconds(1);
    Beat("w0");
    Beat("w2");
    for (std::string& l : state_.Sweep(now_)) lines.push_back(l);
  }
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("rank 1 (w1, host-w1:7000) lost"));
}

TEST_F(RendezvousLivenessTest, SlowFormationLosesNobody) {
  // Members start 7 s apart with a 5 s timeout; a member blocked in Join
  // cannot heartbeat.
  for (int i = 0; i < 4; ++i) {
    if (i > 0) EXPECT_THAT(SweepFor(absl::Seconds(7)), IsEmpty());
    ASSERT_TRUE(Join(absl::StrCat("w", i), 4).ok());
  }
  ASSERT_TRUE(state_.GetAssignment("j", "w0").has_value());
  EXPECT_EQ(Generation(), 1u);
  // Their Joins return now; they heartbeat within an interval.
  EXPECT_THAT(SweepFor(absl::Seconds(1)), IsEmpty());
  BeatAll(4);
  EXPECT_THAT(SweepFor(absl::Seconds(4)), IsEmpty());
  EXPECT_EQ(Generation(), 1u);
  EXPECT_EQ(state_.Health("j", now_)->state, JobState::kHealthy);
}

TEST_F(RendezvousLivenessTest, AdmittedMemberSilentForATimeoutIsLost) {
  Form(2);
  // w1 never heartbeats after its Join returned; w0 does.
  std::vector<std::string> lines;
  for (int i = 0; i < 6; ++i) {
    now_ += absl::Seconds(1);
    Beat("w0");
    for (std::string& l : state_.Sweep(now_)) lines.push_back(l);
  }
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("rank 1 (w1, host-w1:7000) lost"));
}

TEST_F(RendezvousLivenessTest, FormingLogCountsAboveTheListLimit) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Join(absl::StrCat("w", i), 16).ok());
  EXPECT_EQ(state_.DescribeForming("j", 8),
            "job j: 3 of 16 joined (w0 at host-w0:7000, w1 at host-w1:7000, "
            "w2 at host-w2:7000); 13 missing");
  for (int i = 3; i < 12; ++i) ASSERT_TRUE(Join(absl::StrCat("w", i), 16).ok());
  EXPECT_EQ(state_.DescribeForming("j", 8),
            "job j: 12 of 16 joined; 4 missing");
  // Without a limit (the join timeout's error) every member is named.
  EXPECT_THAT(state_.DescribeForming("j"), HasSubstr("w11 at host-w11:7000"));
  EXPECT_THAT(state_.DescribeForming("j"), Not(HasSubstr("12 of 16 joined;")));
}

TEST_F(RendezvousLivenessTest, MembersMinutesApartFormGenerationOneAndStay) {
  // Pods that start minutes apart: 24 heartbeat timeouts between the first
  // and the last.
  for (int i = 0; i < 4; ++i) {
    if (i > 0) EXPECT_THAT(SweepFor(absl::Seconds(40)), IsEmpty());
    ASSERT_TRUE(Join(absl::StrCat("w", i), 4).ok());
  }
  EXPECT_EQ(Generation(), 1u);
  for (int round = 0; round < 30; ++round) {
    BeatAll(4);
    EXPECT_THAT(SweepFor(absl::Seconds(1)), IsEmpty()) << "round " << round;
  }
  EXPECT_EQ(Generation(), 1u);
  EXPECT_EQ(state_.Health("j", now_)->state, JobState::kHealthy);
}

TEST_F(RendezvousLivenessTest, LateJoinReplyCountsFromWhenItWasSent) {
  Form(3);
  // w2's reply took 4 s to reach it (thousands of replies on a busy
  // host); w0 and w1 beat from the start.
  for (int i = 0; i < 4; ++i) {
    now_ += absl::Seconds(1);
    Beat("w0");
    Beat("w1");
    EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  }
  state_.JoinReturned("j", "w2", now_);
  // Past the timeout counted from formation, within it from the reply.
  for (int i = 0; i < 4; ++i) {
    now_ += absl::Seconds(1);
    Beat("w0");
    Beat("w1");
    EXPECT_THAT(state_.Sweep(now_), IsEmpty()) << i;
  }
  Beat("w2");
  EXPECT_EQ(Generation(), 1u);
  // The grace is not a pass: silent for a full timeout after it, w2 is lost.
  std::vector<std::string> lines;
  for (int i = 0; i < 6; ++i) {
    now_ += absl::Seconds(1);
    Beat("w0");
    Beat("w1");
    for (std::string& l : state_.Sweep(now_)) lines.push_back(l);
  }
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("rank 2 (w2, host-w2:7000) lost"));
}

TEST_F(RendezvousLivenessTest, ManyLostAtOnceAreCountedNotListed) {
  Form(20);
  // Half the job (a rack) goes silent.
  std::vector<std::string> lines;
  for (int i = 0; i < 7; ++i) {
    now_ += absl::Seconds(1);
    for (int w = 0; w < 10; ++w) Beat(absl::StrCat("w", w));
    for (std::string& l : state_.Sweep(now_)) lines.push_back(l);
  }
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("rank 10 (w10, host-w10:7000) lost"));
  EXPECT_THAT(lines[0], HasSubstr("and 2 more (10 lost)"));
  EXPECT_THAT(lines[0], Not(HasSubstr("w19")));
}

}  // namespace
}  // namespace halka
