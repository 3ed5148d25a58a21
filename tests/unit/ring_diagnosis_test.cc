// DiagnoseRing: the straggler is the sender of the ring edge that adds the
// most wait, with the evidence in numbers.
#include "server/ring_diagnosis.h"

#include "gtest/gtest.h"

namespace halka {
namespace {

// A ring of g ranks after `op_s` seconds of operations carrying `bytes` per
// ring edge, where rank `slow` (-1: none) spends `slow_s` reducing and
// everyone downstream waits for it.
std::vector<RankInput> Ring(int g, int slow, double op_s, double slow_s,
                            uint64_t bytes) {
  std::vector<RankInput> out;
  for (int r = 0; r < g; ++r) {
    RankInput in;
    in.rank = r;
    in.has_telemetry = true;
    in.op_seconds = op_s;
    const int pred = (r + g - 1) % g;
    const int succ = (r + 1) % g;
    EdgeInput from_pred;
    from_pred.peer = pred;
    from_pred.bytes_received = bytes;
    // Everyone but the straggler waits nearly the whole time for its
    // predecessor (a pipeline); the straggler barely waits.
    from_pred.wait_seconds = slow < 0 ? 0.01 : (r == slow ? 0.02 : slow_s);
    from_pred.reduce_seconds = r == slow ? slow_s : 0.01;
    from_pred.wait_p50_seconds = from_pred.wait_seconds / 100;
    from_pred.wait_p99_seconds = from_pred.wait_seconds / 50;
    EdgeInput to_succ;
    to_succ.peer = succ;
    to_succ.bytes_sent = bytes;
    to_succ.send_seconds = 0.005;
    if (g == 2) {
      from_pred.bytes_sent = bytes;
      from_pred.send_seconds = 0.005;
      in.edges = {from_pred};
    } else {
      in.edges = {from_pred, to_succ};
    }
    out.push_back(in);
  }
  return out;
}

TEST(RingDiagnosisTest, NamesTheSlowRankAndItsOutgoingEdge) {
  for (int g : {2, 3, 4, 8}) {
    for (int slow = 0; slow < g; ++slow) {
      const RingDiagnosis d = DiagnoseRing(g, Ring(g, slow, 2.0, 1.8, 24000000));
      SCOPED_TRACE(d.summary);
      EXPECT_TRUE(d.has_straggler);
      EXPECT_EQ(d.straggler_rank, slow);
      EXPECT_EQ(d.slowest_from, slow);
      EXPECT_EQ(d.slowest_to, (slow + 1) % g);
      EXPECT_NE(d.summary.find("rank " + std::to_string(slow) +
                               " is the straggler"),
                std::string::npos);
    }
  }
}

TEST(RingDiagnosisTest, EvidenceInNumbers) {
  const RingDiagnosis d = DiagnoseRing(4, Ring(4, 2, 2.0, 1.8, 24000000));
  EXPECT_EQ(d.summary,
            "rank 2 is the straggler: its successor rank 3 waited 1.80 s of "
            "2.00 s for it, while rank 2 waited 0.02 s for rank 1 and reduced "
            "for 1.80 s (median rank 0.01 s); edge 2->3 carries 13.4 MB/s vs "
            "4800.0 MB/s median");
  ASSERT_EQ(d.edges.size(), 4u);
  for (const EdgeReport& e : d.edges) {
    EXPECT_TRUE(e.ring);
    EXPECT_EQ(e.to, (e.from + 1) % 4);
    EXPECT_EQ(e.bytes, 24000000u);
  }
  // 2->3: rank 3 waited 1.8 s, rank 2 waited 0.02 s on rank 1.
  EXPECT_NEAR(d.edges[2].added_wait_seconds, 1.78, 1e-9);
  EXPECT_NEAR(d.edges[2].throughput_bps, 24e6 / 1.785, 1e-3);
  // 3->0: rank 0 waited as long as rank 3 did: nothing added.
  EXPECT_NEAR(d.edges[3].added_wait_seconds, 0, 1e-9);
  EXPECT_NEAR(d.edges[2].wait_p99_seconds, 1.8 / 50, 1e-12);
}

TEST(RingDiagnosisTest, BalancedRingHasNoStraggler) {
  const RingDiagnosis d = DiagnoseRing(4, Ring(4, -1, 2.0, 0, 24000000));
  EXPECT_FALSE(d.has_straggler);
  EXPECT_EQ(d.straggler_rank, -1);
  EXPECT_EQ(d.summary.rfind("no straggler", 0), 0u) << d.summary;
}

TEST(RingDiagnosisTest, SmallWaitsAreNotAStraggler) {
  // 40 ms added over 10 s of operations: below both thresholds.
  const RingDiagnosis d = DiagnoseRing(4, Ring(4, 1, 10.0, 0.04, 1000000));
  EXPECT_FALSE(d.has_straggler);
  EXPECT_EQ(d.slowest_from, 1);
}

TEST(RingDiagnosisTest, NoTrafficAndMissingRanks) {
  EXPECT_EQ(DiagnoseRing(4, {}).summary, "no ring traffic in the window");
  EXPECT_EQ(DiagnoseRing(0, {}).summary, "no members");
  // A rank without telemetry (dead) does not break the rest.
  std::vector<RankInput> in = Ring(4, 2, 2.0, 1.8, 1000);
  in.erase(in.begin());
  const RingDiagnosis d = DiagnoseRing(4, in);
  EXPECT_EQ(d.straggler_rank, 2);
}

TEST(RingDiagnosisTest, ErrorsAreCountedAndNamed) {
  std::vector<RankInput> in = Ring(3, -1, 2.0, 0, 1000);
  in[1].edges[0].errors = 2;  // rank 1's edge with rank 0
  const RingDiagnosis d = DiagnoseRing(3, in);
  bool found = false;
  for (const EdgeReport& e : d.edges) {
    if (e.from == 0 && e.to == 1) {
      EXPECT_EQ(e.errors, 2u);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_NE(d.summary.find("errors on edge 0->1 (2)"), std::string::npos)
      << d.summary;
}

TEST(RingDiagnosisTest, NonRingEdgesAreListedButNotBlamed) {
  std::vector<RankInput> in = Ring(4, -1, 2.0, 0, 1000);
  EdgeInput extra;  // rank 2 waited 5 s for rank 0 (all-to-all fingerprints)
  extra.peer = 0;
  extra.bytes_received = 10;
  extra.wait_seconds = 5;
  in[2].edges.push_back(extra);
  const RingDiagnosis d = DiagnoseRing(4, in);
  EXPECT_FALSE(d.has_straggler);
  bool found = false;
  for (const EdgeReport& e : d.edges) {
    if (e.from == 0 && e.to == 2) {
      EXPECT_FALSE(e.ring);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

// DiagnoseFailures: the sentence `halkactl health` prints when operations
// fail.
LastOpInput Op(int rank, uint64_t seq, bool failed = false,
               const std::string& error = "", uint64_t calls = 0) {
  LastOpInput in;
  in.rank = rank;
  in.op_seq = seq;
  in.failed = failed;
  in.error = error;
  in.calls_received = calls;
  return in;
}

TEST(DiagnoseFailuresTest, NoFailureNoSentence) {
  EXPECT_EQ(DiagnoseFailures({}), "");
  EXPECT_EQ(DiagnoseFailures({Op(0, 5), Op(1, 5), Op(2, 0)}), "");
}

TEST(DiagnoseFailuresTest, OneRankBehindNamesItAndWhereTheOthersAre) {
  EXPECT_EQ(DiagnoseFailures({Op(3, 24, true, "deadline exceeded"), Op(1, 25),
                              Op(0, 25), Op(2, 25)}),
            "operations are failing: rank 3's last op #24 failed (deadline "
            "exceeded); ranks 0-2 are at #25");
}

TEST(DiagnoseFailuresTest, GroupsRanksWithTheSameFailure) {
  EXPECT_EQ(
      DiagnoseFailures({Op(0, 7, true, "aborted"), Op(1, 7, true, "aborted"),
                        Op(3, 7, true, "aborted"), Op(2, 6, true, "bad dtype"),
                        Op(4, 0)}),
      "operations are failing: ranks 0-1, 3's last op #7 failed "
      "(aborted); rank 2's last op #6 failed (bad dtype); rank 4 has "
      "ended no op");
}

TEST(DiagnoseFailuresTest, CallsReceivedFollowWhenTheyDiffer) {
  EXPECT_EQ(
      DiagnoseFailures({Op(0, 25, false, "", 25), Op(1, 25, false, "", 25),
                        Op(2, 24, true, "x", 24), Op(3, 26, false, "", 26)}),
      "operations are failing: rank 2's last op #24 failed (x); ranks "
      "0-1 are at #25, rank 3 is at #26; calls received: ranks 0-1 25, "
      "rank 2 24, rank 3 26");
}

TEST(DiagnoseFailuresTest, LongErrorsAreCut) {
  const std::string sentence =
      DiagnoseFailures({Op(0, 1, true, std::string(1000, 'e'))});
  EXPECT_EQ(sentence, "operations are failing: rank 0's last op #1 failed (" +
                          std::string(160, 'e') + ")");
}

}  // namespace
}  // namespace halka
