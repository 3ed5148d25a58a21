// The per-rank timeline's store (bounded), the telemetry ledger's split of
// arrival waits from data waits, and the stall monitor on a real stop.
#include "core/timeline.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "core/stall_monitor.h"
#include "core/telemetry.h"

namespace halka {
namespace {

TraceSpan Span(TraceSpan::Kind kind, int peer) {
  TraceSpan s;
  s.kind = kind;
  s.peer = peer;
  s.start = absl::UnixEpoch() + absl::Seconds(1);
  s.end = s.start + absl::Milliseconds(2);
  return s;
}

TEST(TimelineTest, KeepsTheLastOpsAndBoundsSpansPerOp) {
  Timeline t;
  for (uint64_t seq = 1; seq <= Timeline::kMaxOps + 5; ++seq) {
    t.BeginOp();
    const size_t spans = seq == Timeline::kMaxOps + 5
                             ? Timeline::kMaxSpansPerOp + 7
                             : 3;
    for (size_t i = 0; i < spans; ++i) {
      t.Add(Span(TraceSpan::Kind::kWait, 1));
    }
    TraceOp op;
    op.op_seq = seq;
    t.EndOp(op);
  }
  const std::vector<TraceOp> ops = t.Ops();
  ASSERT_EQ(ops.size(), Timeline::kMaxOps);
  EXPECT_EQ(ops.front().op_seq, 6u);  // the 5 oldest were dropped
  EXPECT_EQ(ops.back().op_seq, Timeline::kMaxOps + 5);
  EXPECT_EQ(ops.front().spans.size(), 3u);
  EXPECT_EQ(ops.back().spans.size(), Timeline::kMaxSpansPerOp);
  EXPECT_EQ(ops.back().spans_dropped, 7u);
  EXPECT_EQ(ops.front().spans_dropped, 0u);
}

// A full timeline lends the oldest operation's span storage to the next
// operation: every kept operation still holds exactly its own spans (each
// operation's spans carry its number and count, different per operation).
TEST(TimelineTest, EveryKeptOpHoldsItsOwnSpansAfterTheStorageIsReused) {
  Timeline t;
  const uint64_t total = 3 * Timeline::kMaxOps + 1;
  for (uint64_t seq = 1; seq <= total; ++seq) {
    t.BeginOp();
    for (uint64_t i = 0; i < seq % 7 + 1; ++i) {
      TraceSpan s = Span(TraceSpan::Kind::kSend, static_cast<int>(seq));
      s.step = static_cast<int>(i);
      t.Add(s);
    }
    TraceOp op;
    op.op_seq = seq;
    t.EndOp(op);
  }
  const std::vector<TraceOp> ops = t.Ops();
  ASSERT_EQ(ops.size(), Timeline::kMaxOps);
  for (const TraceOp& op : ops) {
    ASSERT_EQ(op.spans.size(), op.op_seq % 7 + 1) << "op " << op.op_seq;
    for (size_t i = 0; i < op.spans.size(); ++i) {
      EXPECT_EQ(op.spans[i].peer, static_cast<int>(op.op_seq));
      EXPECT_EQ(op.spans[i].step, static_cast<int>(i));
    }
  }
  EXPECT_EQ(ops.back().op_seq, total);
}

TEST(TimelineTest, BeginOpForgetsAnUnfinishedOpsSpans) {
  Timeline t;
  t.Add(Span(TraceSpan::Kind::kSend, 2));
  t.BeginOp();
  t.Add(Span(TraceSpan::Kind::kReduce, 3));
  t.EndOp(TraceOp());
  ASSERT_EQ(t.Ops().size(), 1u);
  ASSERT_EQ(t.Ops()[0].spans.size(), 1u);
  EXPECT_EQ(t.Ops()[0].spans[0].kind, TraceSpan::Kind::kReduce);
  EXPECT_STREQ(TraceSpanKindName(TraceSpan::Kind::kWire), "wire");
}

TEST(TimelineTest, LedgerBooksArrivalWaitsApartAndKeepsArrivalsAndSpans) {
  OpTelemetry ledger;
  const absl::Time t0 = absl::Now();
  ledger.BeginOp();
  // The fingerprint pass: 300 ms waiting for the predecessor's call.
  ledger.BookWait(t0, OpTelemetry::WaitEnd::kFrame, 1, 0,
                  absl::Milliseconds(300), /*arrival=*/true);
  // The data phases: 20 ms of waits for 4096 bytes, 10 ms of wire.
  ledger.BookWait(t0, OpTelemetry::WaitEnd::kFrame, 1, 4096,
                  absl::Milliseconds(20));
  ledger.BookWire(t0, 2, absl::Milliseconds(10));
  ledger.BookSpan(Span(TraceSpan::Kind::kWait, 1));
  OpTelemetry::OpEnd end;
  end.algorithm = "ring";
  end.elapsed = absl::Milliseconds(400);
  end.generation = 3;
  end.op_seq = 17;
  end.start = t0 - absl::Milliseconds(400);
  end.fingerprint_end = t0 - absl::Milliseconds(80);
  ledger.EndOp(t0, end);
  const Telemetry t = ledger.Snapshot(t0);
  const EdgeStats& from1 = t.window.edges.at(1);
  EXPECT_NEAR(from1.wait_seconds, 0.020, 1e-9);
  EXPECT_NEAR(from1.arrival_wait_seconds, 0.300, 1e-9);
  EXPECT_EQ(from1.chunks_received, 1u);
  EXPECT_EQ(from1.bytes_received, 4096u);
  EXPECT_NEAR(t.window.edges.at(2).wire_seconds, 0.010, 1e-9);
  EXPECT_NEAR(t.window.op_seconds, 0.4, 1e-9);
  EXPECT_NEAR(t.window.ring_seconds, 0.08, 1e-9);
  ASSERT_EQ(t.arrivals.size(), 1u);
  EXPECT_EQ(t.arrivals[0].op_seq, 17u);
  EXPECT_EQ(t.arrivals[0].generation, 3u);
  EXPECT_EQ(t.arrivals[0].end, t0);
  const std::vector<TraceOp> trace = ledger.Trace();
  ASSERT_EQ(trace.size(), 1u);
  EXPECT_EQ(trace[0].op_seq, 17u);
  EXPECT_EQ(trace[0].spans.size(), 1u);
  EXPECT_EQ(trace[0].end, t0);
}

TEST(StallMonitorTest, AStoppedProcessReadsAsStalled) {
  StallMonitor& m = StallMonitor::Get();
  absl::SleepFor(absl::Milliseconds(20));  // the monitor is ticking
  const absl::Time t0 = absl::Now();
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // async-signal-safe calls only
    usleep(300 * 1000);
    kill(parent, SIGCONT);
    _exit(0);
  }
  raise(SIGSTOP);  // this whole process stops until the child continues it
  const absl::Time t1 = absl::Now();
  int status = 0;
  waitpid(child, &status, 0);
  const absl::Duration stalled = m.StalledBetween(t0, t1);
  EXPECT_GE(stalled, absl::Milliseconds(200)) << t1 - t0;
  EXPECT_LE(stalled, t1 - t0);
  // Before the stop, nothing like it.
  EXPECT_LT(m.StalledBetween(t0 - absl::Seconds(10), t0 - absl::Seconds(9)),
            absl::Milliseconds(200));
  // Once the monitor ticks again the stop is a stored stall: a window over
  // it still reads it (not the look that skips the lock, which answers only
  // windows that begin after the newest stall), and one after it does not.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_GE(m.StalledBetween(t0, absl::Now()), absl::Milliseconds(200));
  // A window that begins inside the stop reads the rest of it.
  EXPECT_GE(m.StalledBetween(t0 + absl::Milliseconds(100), t1),
            absl::Milliseconds(100));
  const absl::Time t2 = absl::Now();
  absl::SleepFor(absl::Milliseconds(10));
  EXPECT_LT(m.StalledBetween(t2, absl::Now()), absl::Milliseconds(200));
}

}  // namespace
}  // namespace halka
