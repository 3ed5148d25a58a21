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
    to_succ.wire_seconds = 0.2;
    if (g == 2) {
      from_pred.bytes_sent = bytes;
      from_pred.send_seconds = 0.005;
      from_pred.wire_seconds = 0.2;
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

TEST(RingDiagnosisTest, RingEdgesFollowTheRingOrder) {
  // A host-ordered ring, 0 -> 2 -> 1 -> 3 -> 0: the figures of Ring() by
  // position, renamed to the ranks at those positions.
  const std::vector<int> order = {0, 2, 1, 3};
  std::vector<RankInput> in = Ring(4, /*slow=*/1, 2.0, 1.8, 24000000);
  for (RankInput& r : in) {
    r.rank = order[static_cast<size_t>(r.rank)];
    for (EdgeInput& e : r.edges) e.peer = order[static_cast<size_t>(e.peer)];
  }
  const RingDiagnosis d = DiagnoseRing(4, in, DiagnosisOptions(), order);
  SCOPED_TRACE(d.summary);
  EXPECT_EQ(d.straggler_rank, 2);
  EXPECT_EQ(d.slowest_from, 2);
  EXPECT_EQ(d.slowest_to, 1);
  ASSERT_EQ(d.edges.size(), 4u);
  for (const EdgeReport& e : d.edges) EXPECT_TRUE(e.ring) << e.from << "->" << e.to;
  // In rank order the same figures have no ring edge 0->1.
  const RingDiagnosis plain = DiagnoseRing(4, in);
  for (const EdgeReport& e : plain.edges) {
    if (e.from == 0 && e.to == 2) {
      EXPECT_FALSE(e.ring);
    }
  }
}

TEST(RingDiagnosisTest, EvidenceInNumbers) {
  const RingDiagnosis d = DiagnoseRing(4, Ring(4, 2, 2.0, 1.8, 24000000));
  EXPECT_EQ(d.summary,
            "rank 2 is the straggler: its successor rank 3 waited 1.80 s of "
            "2.00 s in the ring for it, while rank 2 waited 0.02 s for rank 1 "
            "and reduced for 1.80 s (median rank 0.01 s); edge 2->3 writes at "
            "120.0 MB/s; ring edges write at 120.0 MB/s median while busy "
            "(bytes over the time each edge was writing)");
  EXPECT_EQ(d.late_rank, -1);
  EXPECT_EQ(d.stalled_rank, -1);
  ASSERT_EQ(d.edges.size(), 4u);
  for (const EdgeReport& e : d.edges) {
    EXPECT_TRUE(e.ring);
    EXPECT_EQ(e.to, (e.from + 1) % 4);
    EXPECT_EQ(e.bytes, 24000000u);
  }
  // 2->3: rank 3 waited 1.8 s, rank 2 waited 0.02 s on rank 1.
  EXPECT_NEAR(d.edges[2].added_wait_seconds, 1.78, 1e-9);
  // The rate is bytes over the time the sender's link was writing, not
  // over the wait the edge adds.
  EXPECT_NEAR(d.edges[2].throughput_bps, 24e6 / 0.2, 1e-3);
  EXPECT_NEAR(d.edges[2].wire_seconds, 0.2, 1e-12);
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

// Ranks that trained between calls: the data phases are balanced (every
// rank waits ~10 ms per op), the fingerprint waits are not counted, and the
// arrival lags say who called late.
std::vector<RankInput> TrainingRing(int g, const std::vector<double>& lag_p50) {
  std::vector<RankInput> in = Ring(g, -1, 20.0, 0, 24000000);
  for (int r = 0; r < g; ++r) {
    RankInput& x = in[static_cast<size_t>(r)];
    x.ops = 200;
    x.ring_seconds = 4.0;  // 20 ms per op in the ring, the rest arrival
    x.arrival_lag_p50_seconds = lag_p50[static_cast<size_t>(r)];
    x.arrival_lag_p99_seconds = 2 * lag_p50[static_cast<size_t>(r)];
    x.arrival_ops = 200;
  }
  return in;
}

TEST(RingDiagnosisTest, LateCallerIsNamedAsACaller) {
  for (int late = 0; late < 4; ++late) {
    std::vector<double> lags(4, 0.002);
    lags[static_cast<size_t>(late)] = 0.048;
    const RingDiagnosis d = DiagnoseRing(4, TrainingRing(4, lags));
    SCOPED_TRACE(d.summary);
    EXPECT_TRUE(d.has_straggler);
    EXPECT_EQ(d.straggler_rank, late);
    EXPECT_EQ(d.late_rank, late);
    EXPECT_EQ(d.stalled_rank, -1);
    EXPECT_EQ(d.summary.rfind("rank " + std::to_string(late) +
                                  "'s calls arrive 48 ms after the others' "
                                  "(p50 over the last minute",
                              0),
              0u);
    EXPECT_NE(d.summary.find("its host or its training step is slow"),
              std::string::npos);
  }
}

TEST(RingDiagnosisTest, BalancedCallersWithWorkBetweenCallsAreNoStraggler) {
  // Everyone is sometimes last: similar lags, no rank stands out.
  const RingDiagnosis d =
      DiagnoseRing(4, TrainingRing(4, {0.011, 0.014, 0.009, 0.012}));
  EXPECT_FALSE(d.has_straggler) << d.summary;
  EXPECT_EQ(d.late_rank, -1);
  EXPECT_EQ(d.summary.rfind("no straggler", 0), 0u) << d.summary;
}

TEST(RingDiagnosisTest, CallersLateByTurnsOnBusyCoresAreNoStraggler) {
  // The lags of system_straggler_sigstop's control trial in one CI run (4
  // callers checking 16 MiB results on 2 cores, fast same-host rings): the
  // latest rank is 21 ms over the median, but only 14 ms over the next.
  const RingDiagnosis d =
      DiagnoseRing(4, TrainingRing(4, {0.0221, 0.0023, 0.0072, 0.0359}));
  EXPECT_FALSE(d.has_straggler) << d.summary;
  EXPECT_EQ(d.late_rank, -1);
  // The same latest rank 20 ms or more over every other one is named.
  const RingDiagnosis late =
      DiagnoseRing(4, TrainingRing(4, {0.0121, 0.0023, 0.0072, 0.0359}));
  EXPECT_EQ(late.late_rank, 3) << late.summary;
}

TEST(RingDiagnosisTest, FewOpsDoNotNameALateCaller) {
  std::vector<RankInput> in = TrainingRing(4, {0.002, 0.3, 0.002, 0.002});
  for (RankInput& r : in) r.arrival_ops = 3;
  EXPECT_FALSE(DiagnoseRing(4, in).has_straggler);
}

TEST(RingDiagnosisTest, OwnStallIsNotBlamedOnThePredecessor) {
  // Rank 2's process was stopped for 6 s of 20: its successor waited for it
  // in the ring, and its own waits (booked without the stopped time) are
  // short. Its predecessor, rank 1, is not the straggler.
  std::vector<RankInput> in = TrainingRing(4, {0.002, 0.002, 0.060, 0.002});
  in[2].stall_seconds = 6.0;
  in[3].edges[0].wait_seconds = 3.0;  // rank 3 on rank 2
  for (int r : {0, 1, 3}) in[static_cast<size_t>(r)].stall_seconds = 0.01;
  const RingDiagnosis d = DiagnoseRing(4, in);
  SCOPED_TRACE(d.summary);
  EXPECT_EQ(d.straggler_rank, 2);
  EXPECT_EQ(d.stalled_rank, 2);
  EXPECT_EQ(d.late_rank, 2);
  EXPECT_EQ(d.slowest_from, 2);
  EXPECT_EQ(d.slowest_to, 3);
  EXPECT_EQ(d.summary.rfind("rank 2 is the straggler: its process did not run "
                            "for 6.00 s",
                            0),
            0u);
  EXPECT_EQ(d.summary.find("rank 1 is"), std::string::npos);
}

TEST(RingDiagnosisTest, AStallShorterThanTheSlowEdgesWaitIsNotTheCause) {
  // Rank 2 is slow in the ring (its successor waits 0.84 s of 1 s for it);
  // rank 3's process was starved for 0.30 s (the ranks' median 0.03 s):
  // the edge is the cause. Starved for 3 s, rank 3 is.
  std::vector<RankInput> in = Ring(4, /*slow=*/2, 1.0, 0.84, 24000000);
  for (RankInput& r : in) r.stall_seconds = 0.03;
  in[3].stall_seconds = 0.30;
  RingDiagnosis d = DiagnoseRing(4, in);
  EXPECT_EQ(d.straggler_rank, 2) << d.summary;
  EXPECT_EQ(d.stalled_rank, -1) << d.summary;
  EXPECT_EQ(d.summary.rfind("rank 2 is the straggler: its successor", 0), 0u)
      << d.summary;
  in[3].stall_seconds = 3.0;
  d = DiagnoseRing(4, in);
  EXPECT_EQ(d.straggler_rank, 3) << d.summary;
  EXPECT_EQ(d.stalled_rank, 3) << d.summary;
}

TEST(RingDiagnosisTest, EqualStallsOfOneHostAreNoStraggler) {
  // Ranks in one process (or one loaded host) stall alike.
  std::vector<RankInput> in = TrainingRing(4, {0.002, 0.002, 0.002, 0.002});
  for (RankInput& r : in) r.stall_seconds = 5.0;
  const RingDiagnosis d = DiagnoseRing(4, in);
  EXPECT_FALSE(d.has_straggler) << d.summary;
  EXPECT_EQ(d.stalled_rank, -1);
}

TEST(RingDiagnosisTest, SlowEdgeInsideTheRingIsAnEdgeNotACaller) {
  // A shaped link 1->2: callers arrive together; rank 2 waits on rank 1 in
  // the ring for 3 s of its 4 s of ring time; the link writes at 12.5 MB/s.
  std::vector<RankInput> in = TrainingRing(4, {0.002, 0.003, 0.002, 0.002});
  in[2].edges[0].wait_seconds = 3.0;
  in[1].edges[1].wire_seconds = 24000000 / 12.5e6;
  const RingDiagnosis d = DiagnoseRing(4, in);
  SCOPED_TRACE(d.summary);
  EXPECT_EQ(d.straggler_rank, 1);
  EXPECT_EQ(d.late_rank, -1);
  EXPECT_EQ(d.stalled_rank, -1);
  EXPECT_EQ(d.slowest_from, 1);
  EXPECT_EQ(d.slowest_to, 2);
  EXPECT_NE(d.summary.find("edge 1->2 writes at 12.5 MB/s"), std::string::npos);
}

// system_dashboard_chromium once: rank 2 reduces slowly (5 ms a chunk), so
// rank 3 waits 0.85 s for it over 7 operations (120 ms each), and rank 1,
// whose frames rank 2 takes late, ends each operation later and calls
// 35 ms after the others. Rank 2 is the straggler; rank 1's lag is its echo.
TEST(RingDiagnosisTest, ALateCallerUpstreamOfASlowEdgeIsItsEcho) {
  std::vector<RankInput> in = TrainingRing(4, {0.0, 0.035, 0.011, 0.0});
  for (RankInput& x : in) {
    x.ops = 7;
    x.arrival_ops = 7;
    x.ring_seconds = 0.9;
    x.op_seconds = 1.0;
  }
  in[3].edges[0].wait_seconds = 0.856;
  in[2].edges[0].wait_seconds = 0.003;
  const RingDiagnosis d = DiagnoseRing(4, in);
  SCOPED_TRACE(d.summary);
  EXPECT_EQ(d.straggler_rank, 2);
  EXPECT_EQ(d.slowest_from, 2);
  EXPECT_EQ(d.slowest_to, 3);
  EXPECT_EQ(d.late_rank, -1);
  // A late caller whose lag is more than the edge adds is still named.
  for (RankInput& x : in) x.arrival_lag_p50_seconds = 0.0;
  in[1].arrival_lag_p50_seconds = 0.300;
  const RingDiagnosis late = DiagnoseRing(4, in);
  SCOPED_TRACE(late.summary);
  EXPECT_EQ(late.straggler_rank, 1);
  EXPECT_EQ(late.late_rank, 1);
}

TEST(ArrivalLagsTest, LagsFromTheFirstCallerOverOpsEveryRankReported) {
  // Ops every second; each ends 0.5 s after its first caller arrived.
  std::vector<std::vector<ArrivalInput>> by_rank(3);
  for (uint64_t seq = 1; seq <= 9; ++seq) {
    const int64_t t = 1'000'000 * static_cast<int64_t>(seq);
    const int64_t end = t + 500'000;
    by_rank[0].push_back({4, seq, t, end});
    by_rank[1].push_back({4, seq, t + 48'000, end});  // 48 ms late
    by_rank[2].push_back({4, seq, t + (seq % 2 == 0 ? 1'000 : 0), end});
  }
  by_rank[1].push_back({4, 10, 10'000'000, 10'500'000});  // only rank 1
  by_rank[2].push_back({5, 1, 1'000'000, 1'500'000});     // another generation
  std::vector<ArrivalLag> lags = ArrivalLags(3, by_rank, 0);
  ASSERT_EQ(lags.size(), 3u);
  EXPECT_EQ(lags[0].ops, 8u);  // #1 has no previous op to measure from
  EXPECT_NEAR(lags[0].p50_seconds, 0, 1e-12);
  EXPECT_NEAR(lags[1].p50_seconds, 0.048, 1e-12);
  EXPECT_NEAR(lags[1].p99_seconds, 0.048, 1e-12);
  EXPECT_NEAR(lags[2].p99_seconds, 0.001, 1e-12);
  // Only operations since `since` count.
  lags = ArrivalLags(3, by_rank, 5'000'000);
  EXPECT_EQ(lags[1].ops, 5u);
  // A rank whose op ended late (a slow edge upstream) but whose caller came
  // straight back is not late: only its caller's own time counts.
  std::vector<std::vector<ArrivalInput>> edge(3);
  for (uint64_t seq = 1; seq <= 9; ++seq) {
    const int64_t t = 1'000'000 * static_cast<int64_t>(seq);
    for (int r = 0; r < 3; ++r) {
      const int64_t late_end = r == 2 ? 160'000 : 0;  // rank 2 ends late
      // Each caller checks for 20 ms after its op ended, then calls.
      const int64_t start = t + (r == 2 ? 160'000 : 0);
      edge[static_cast<size_t>(r)].push_back(
          {4, seq, start, t + 980'000 + late_end});
    }
  }
  lags = ArrivalLags(3, edge, 0);
  EXPECT_EQ(lags[2].ops, 8u);
  EXPECT_NEAR(lags[2].p50_seconds, 0, 1e-12);
  // Too few ranks' lists, or one rank: nothing.
  EXPECT_EQ(ArrivalLags(3, {by_rank[0]}, 0)[0].ops, 0u);
  EXPECT_EQ(ArrivalLags(1, {by_rank[0]}, 0)[0].ops, 0u);
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
