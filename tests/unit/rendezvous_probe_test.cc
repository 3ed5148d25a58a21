// The measured link model (RendezvousOptions::probe_links,
// server/rendezvous_probe.cc): which generations ask their members to
// probe, how the reports become the job's model (medians per level) and
// the next generation, and what a missing, failed, stale or foreign
// report does.
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous_state.h"

namespace halka {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

LinkProbeReport Probe(uint64_t generation, double local_us, double local_gbps,
                      double net_us, double net_gbps) {
  LinkProbeReport r;
  r.generation = generation;
  r.local = LevelCost{local_us * 1e-6, local_gbps * 1e9};
  r.local_edges = local_gbps > 0 ? 1 : 0;
  r.net = LevelCost{net_us * 1e-6, net_gbps * 1e9};
  r.net_edges = net_gbps > 0 ? 1 : 0;
  return r;
}

// A claim of a ring of w0 on host A and w1 on host B at `generation`.
RingClaim ClaimOfTwo(uint64_t generation) {
  RingClaim c;
  c.generation = generation;
  c.min_world_size = 2;
  c.max_world_size = 2;
  for (int r = 0; r < 2; ++r) {
    MemberView m;
    m.rank = r;
    m.worker_id = absl::StrCat("w", r);
    m.address = absl::StrCat("10.0.0.", r, ":7000");
    m.host = r == 0 ? "A" : "B";
    c.members.push_back(m);
  }
  return c;
}

class RendezvousProbeTest : public ::testing::Test {
 protected:
  explicit RendezvousProbeTest(bool probe = true) : state_(Options(probe)) {}
  static RendezvousOptions Options(bool probe) {
    RendezvousOptions o;
    o.probe_links = probe;
    o.probe_wait = absl::Seconds(30);
    o.heartbeat_timeout = absl::Seconds(60);
    return o;
  }
  // w0..w3 on hosts A, A, B, B (min > 0: an elastic job of min..n).
  void Form(int n = 4, int min = 0) {
    for (int i = 0; i < n; ++i) {
      JoinArgs a;
      a.job_id = "j";
      a.worker_id = absl::StrCat("w", i);
      a.address = absl::StrCat("10.0.0.", i, ":7000");
      a.world_size = n;
      if (min > 0) {
        a.min_world_size = min;
        a.max_world_size = n;
      }
      a.requested_rank = i;
      a.host = i < n / 2 ? "A" : "B";
      ASSERT_TRUE(state_.Join(a, now_).ok()) << i;
    }
  }
  MembershipView View() {
    std::optional<MembershipView> v = state_.AssignmentView("j");
    EXPECT_TRUE(v.has_value());
    return v.value_or(MembershipView());
  }
  std::string Report(int w, const LinkProbeReport& r) {
    return state_.ReportLinkProbe("j", absl::StrCat("w", w), r, now_);
  }

  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  RendezvousState state_;
};

TEST_F(RendezvousProbeTest, EveryMembersReportMakesTheMediansTheNextGeneration) {
  Form();
  MembershipView v = View();
  EXPECT_EQ(v.generation, 1u);
  EXPECT_TRUE(v.probe_links);
  EXPECT_FALSE(v.link_model.has_value());
  // Ranks 0 and 3 measured a local and a net edge, 1 and 2 one local each
  // twice over (their two edges inside the host: given as one here).
  EXPECT_EQ(Report(0, Probe(1, 10, 8, 100, 1)), "");
  EXPECT_EQ(Report(1, Probe(1, 20, 6, 0, 0)), "");
  EXPECT_EQ(Report(2, Probe(1, 30, 4, 0, 0)), "");
  // A report again replaces the member's first, and counts once.
  EXPECT_EQ(Report(0, Probe(1, 12, 8, 100, 1)), "");
  EXPECT_EQ(View().generation, 1u);
  const std::string line = Report(3, Probe(1, 40, 2, 300, 3));
  EXPECT_THAT(line, HasSubstr("generation 1->2: link model measured on "
                              "generation 1 by 4 of 4 members"));
  v = View();
  EXPECT_EQ(v.generation, 2u);
  EXPECT_FALSE(v.probe_links);
  ASSERT_TRUE(v.link_model.has_value());
  // Local: medians of 12, 20, 30, 40 us and 8, 6, 4, 2 GB/s; net: of
  // ranks 0 and 3.
  EXPECT_NEAR(v.link_model->local.alpha_s, 25e-6, 1e-12);
  EXPECT_NEAR(v.link_model->local.bytes_per_s, 5e9, 1);
  EXPECT_NEAR(v.link_model->net.alpha_s, 200e-6, 1e-12);
  EXPECT_NEAR(v.link_model->net.bytes_per_s, 2e9, 1);
  EXPECT_EQ(v.link_model->measured_generation, 1u);
  EXPECT_THAT(DescribeLinkModel(*v.link_model),
              HasSubstr(", measured at generation 1"));
  // Same members and ranks: the ring is the same.
  ASSERT_THAT(v.members, SizeIs(4));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(v.members[r].worker_id, absl::StrCat("w", r));
  }
  // Reports of the old generation, or now that nothing is asked, change
  // nothing.
  EXPECT_EQ(Report(0, Probe(1, 1, 1, 1, 1)), "");
  EXPECT_EQ(Report(0, Probe(2, 1, 1, 1, 1)), "");
  EXPECT_EQ(View().generation, 2u);
}

TEST_F(RendezvousProbeTest, AChangeOfMembersAsksAgainAndKeepsTheOldModelMeanwhile) {
  Form(4, 3);
  for (int w = 0; w < 4; ++w) Report(w, Probe(1, 10, 8, 100, 1));
  ASSERT_EQ(View().generation, 2u);
  ASSERT_TRUE(state_.Leave("j", "w3", now_).ok());
  MembershipView v = View();
  EXPECT_EQ(v.generation, 3u);
  EXPECT_TRUE(v.probe_links);
  ASSERT_TRUE(v.link_model.has_value());
  EXPECT_EQ(v.link_model->measured_generation, 1u);
  // A member that is not in the ring is not counted, nor waited for.
  EXPECT_EQ(Report(3, Probe(3, 1, 1, 1, 1)), "");
  EXPECT_EQ(Report(0, Probe(3, 10, 8, 50, 2)), "");
  EXPECT_EQ(Report(1, Probe(3, 10, 8, 0, 0)), "");
  EXPECT_THAT(Report(2, Probe(3, 10, 8, 50, 2)), HasSubstr("3->4"));
  v = View();
  EXPECT_FALSE(v.probe_links);
  ASSERT_TRUE(v.link_model.has_value());
  EXPECT_EQ(v.link_model->measured_generation, 3u);
  EXPECT_NEAR(v.link_model->net.alpha_s, 50e-6, 1e-12);
}

TEST_F(RendezvousProbeTest, ASilentMemberIsNotWaitedForPastTheProbeWait) {
  Form();
  Report(0, Probe(1, 10, 8, 100, 1));
  Report(1, Probe(1, 10, 8, 0, 0));
  // The members beat (a job this rendezvous does not hear is left alone).
  auto beat = [&] {
    for (int w = 0; w < 4; ++w) {
      ASSERT_TRUE(state_.Heartbeat("j", absl::StrCat("w", w), "", now_).ok());
    }
  };
  now_ += absl::Seconds(29);
  beat();
  EXPECT_THAT(state_.Sweep(now_), IsEmpty());
  EXPECT_EQ(View().generation, 1u);
  now_ += absl::Seconds(2);
  beat();
  EXPECT_THAT(state_.Sweep(now_),
              ElementsAre(HasSubstr("measured on generation 1 by 2 of 4")));
  const MembershipView v = View();
  EXPECT_EQ(v.generation, 2u);
  ASSERT_TRUE(v.link_model.has_value());
  EXPECT_NEAR(v.link_model->net.alpha_s, 100e-6, 1e-12);
}

TEST_F(RendezvousProbeTest, ProbesThatMeasuredNothingLeaveTheRulesAndStopAsking) {
  Form(2);
  LinkProbeReport failed;
  failed.generation = 1;
  failed.error = "the link to rank 1: DEADLINE_EXCEEDED";
  EXPECT_EQ(Report(0, failed), "");
  // The next generation says the probe is over (members waiting for it go
  // on), with no model.
  EXPECT_THAT(Report(1, failed),
              AllOf(HasSubstr("generation 1->2: the link probes of 2 of 2 "
                              "members measured no link"),
                    HasSubstr("DEADLINE_EXCEEDED"),
                    HasSubstr("its counting rules")));
  const MembershipView v = View();
  EXPECT_EQ(v.generation, 2u);
  EXPECT_FALSE(v.probe_links);
  EXPECT_FALSE(v.link_model.has_value());
}

TEST_F(RendezvousProbeTest, ARestoredRingKeepsTheModelItsMembersMeasured) {
  RingClaim c = ClaimOfTwo(5);
  LinkModel measured = *ParseLinkModel("net=70:1.5");
  measured.measured_generation = 4;
  c.link_model = measured;
  ASSERT_TRUE(state_.Restore("j", c, now_).ok());
  const MembershipView v = View();
  EXPECT_EQ(v.generation, 5u);
  EXPECT_FALSE(v.probe_links);
  ASSERT_TRUE(v.link_model.has_value());
  EXPECT_EQ(v.link_model->measured_generation, 4u);
}

TEST(RendezvousProbe, AModelOlderThanProbeEveryIsMeasuredAgain) {
  RendezvousOptions o;
  o.probe_links = true;
  o.probe_every = absl::Minutes(10);
  o.heartbeat_timeout = absl::Hours(1);
  RendezvousState s(o);
  absl::Time now = absl::FromUnixSeconds(1700000000);
  for (int i = 0; i < 2; ++i) {
    JoinArgs a;
    a.job_id = "j";
    a.worker_id = absl::StrCat("w", i);
    a.address = absl::StrCat("10.0.0.", i, ":7000");
    a.world_size = 2;
    a.host = absl::StrCat("h", i);
    ASSERT_TRUE(s.Join(a, now).ok());
  }
  auto report = [&](int w, uint64_t gen, double net_us) {
    return s.ReportLinkProbe("j", absl::StrCat("w", w),
                             Probe(gen, 0, 0, net_us, 1), now);
  };
  report(0, 1, 100);
  ASSERT_THAT(report(1, 1, 100), HasSubstr("1->2"));
  // Within the interval nothing moves; past it the next generation asks.
  now += absl::Minutes(9);
  EXPECT_THAT(s.Sweep(now), IsEmpty());
  now += absl::Minutes(2);
  EXPECT_THAT(s.Sweep(now),
              ElementsAre(HasSubstr("generation 2->3: the link model "
                                    "measured at generation 1 is older than "
                                    "10m: the members probe their links "
                                    "again")));
  std::optional<MembershipView> v = s.AssignmentView("j");
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->probe_links);
  ASSERT_TRUE(v->link_model.has_value());  // the old one meanwhile
  EXPECT_EQ(v->link_model->measured_generation, 1u);
  report(0, 3, 300);
  EXPECT_THAT(report(1, 3, 300), HasSubstr("3->4"));
  v = s.AssignmentView("j");
  EXPECT_FALSE(v->probe_links);
  EXPECT_EQ(v->link_model->measured_generation, 3u);
  EXPECT_NEAR(v->link_model->net.alpha_s, 300e-6, 1e-12);
  EXPECT_THAT(s.Sweep(now + absl::Minutes(1)), IsEmpty());
}

// A claim of a generation that was still measuring its members (a
// membership change after a measured model): the restored job still asks,
// takes the members' reports of that generation, and publishes theirs.
TEST_F(RendezvousProbeTest, ARestoredRingThatWasMeasuringIsMeasuredStill) {
  RingClaim c = ClaimOfTwo(5);
  LinkModel before = *ParseLinkModel("net=70:1.5");
  before.measured_generation = 2;
  c.link_model = before;
  c.probe_links = true;
  ASSERT_TRUE(state_.Restore("j", c, now_).ok());
  MembershipView v = View();
  EXPECT_EQ(v.generation, 5u);
  EXPECT_TRUE(v.probe_links);
  ASSERT_TRUE(v.link_model.has_value());
  EXPECT_EQ(v.link_model->measured_generation, 2u);
  EXPECT_EQ(Report(0, Probe(5, 0, 0, 40, 2)), "");
  EXPECT_THAT(Report(1, Probe(5, 0, 0, 40, 2)), HasSubstr("5->6"));
  v = View();
  EXPECT_FALSE(v.probe_links);
  EXPECT_EQ(v.link_model->measured_generation, 5u);
  EXPECT_NEAR(v.link_model->net.alpha_s, 40e-6, 1e-12);
}

class RendezvousNoProbeTest : public RendezvousProbeTest {
 protected:
  RendezvousNoProbeTest() : RendezvousProbeTest(false) {}
};

TEST_F(RendezvousNoProbeTest, WithoutProbeLinksNothingIsAskedOrTaken) {
  Form();
  EXPECT_FALSE(View().probe_links);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(Report(w, Probe(1, 10, 8, 100, 1)), "");
  EXPECT_EQ(View().generation, 1u);
  EXPECT_FALSE(View().link_model.has_value());
}

}  // namespace
}  // namespace halka
