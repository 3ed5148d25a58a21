// The worker's /metrics text and heartbeat telemetry as pure functions of a
// communicator's Telemetry (worker/worker_metrics.h).
#include "worker/worker_metrics.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace halka {
namespace {

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

Telemetry Sample() {
  Telemetry t;
  t.ops_by_label[{"all_reduce", "ring", "ok"}] = 7;
  t.latency_buckets.assign(kLatencyBounds.size(), 0);
  t.latency_buckets[2] = 5;
  t.latency_buckets.back() = 2;  // slower than every finite bound
  t.latency_sum_seconds = 123.5;
  t.latency_count = 7;
  EdgeStats e;
  e.bytes_sent = 100;
  e.bytes_received = 200;
  e.errors = 1;
  t.edges_total[1] = e;
  t.edges_total[4] = e;  // world 4: parameter-server shard 0
  return t;
}

TEST(WorkerMetricsTest, EveryFamilyOnceWithLabelsEscaped) {
  const std::string text =
      WorkerMetricsText("j\"1", 2, 9, 4, Sample(), LinkCounters());
  EXPECT_EQ(Count(text, "# TYPE halka_operation_seconds histogram\n"), 1);
  EXPECT_EQ(Count(text, "# HELP halka_edge_bytes_total "), 1);
  EXPECT_TRUE(absl::StrContains(
      text, "halka_worker_generation{halka_job=\"j\\\"1\",rank=\"2\"} 9\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text,
      "halka_operations_total{halka_job=\"j\\\"1\",rank=\"2\",kind=\"all_reduce\","
      "algorithm=\"ring\",outcome=\"ok\"} 7\n"));
  EXPECT_TRUE(absl::StrContains(
      text, "halka_edge_bytes_total{halka_job=\"j\\\"1\",rank=\"2\",peer=\"ps0\","
            "direction=\"received\"} 200\n"));
  EXPECT_TRUE(absl::StrContains(
      text, "halka_edge_errors_total{halka_job=\"j\\\"1\",rank=\"2\",peer=\"1\"} 1\n"));
}

TEST(WorkerMetricsTest, HistogramIsCumulativeAndEndsAtTheCount) {
  const std::string text =
      WorkerMetricsText("j", 0, 1, 2, Sample(), LinkCounters());
  EXPECT_TRUE(absl::StrContains(
      text, "halka_operation_seconds_bucket{halka_job=\"j\",rank=\"0\",le=\"0.0025\"} 5\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "halka_operation_seconds_bucket{halka_job=\"j\",rank=\"0\",le=\"60\"} 5\n"));
  EXPECT_TRUE(absl::StrContains(
      text, "halka_operation_seconds_bucket{halka_job=\"j\",rank=\"0\",le=\"+Inf\"} 7\n"));
  EXPECT_TRUE(absl::StrContains(
      text, "halka_operation_seconds_count{halka_job=\"j\",rank=\"0\"} 7\n"));
  EXPECT_FALSE(absl::StrContains(text, "1e+300"));
  EXPECT_EQ(Count(text, "# TYPE halka_missed_wakeups_total counter\n"), 1);
  EXPECT_EQ(Count(text, "# TYPE halka_wire_frames_landed_total counter\n"), 1);
}

// The link counters are the worker's own (WorkerNode::link_counters):
// what it is given is what it exports.
TEST(WorkerMetricsTest, LinkCountersAreTheOnesGiven) {
  LinkCounters links;
  links.shm.refused = 2;
  links.wire.accepted = 3;
  links.wire.fell_back = 1;
  links.wire.landed = 5;
  links.wire.evicted = 4;
  links.missed_wakeups = 6;
  links.waits_yielded = 7;
  links.grpc_frames_batched = 9;
  const std::string text = WorkerMetricsText("j", 1, 1, 2, Sample(), links);
  const std::string base = "{halka_job=\"j\",rank=\"1\"";
  for (const std::string& line :
       {base + ",path=\"shm\",outcome=\"accepted\"} 0\n",
        base + ",path=\"shm\",outcome=\"refused\"} 2\n",
        base + ",path=\"wire\",outcome=\"accepted\"} 3\n",
        base + ",path=\"wire\",outcome=\"refused\"} 0\n",
        base + ",path=\"wire\",outcome=\"fell_back\"} 1\n"}) {
    EXPECT_TRUE(absl::StrContains(text, "halka_peer_links_total" + line))
        << line << text;
  }
  EXPECT_TRUE(absl::StrContains(text, "halka_wire_frames_landed_total" + base +
                                          "} 5\n"));
  EXPECT_TRUE(absl::StrContains(
      text, "halka_wire_silent_connections_evicted_total" + base + "} 4\n"));
  EXPECT_TRUE(
      absl::StrContains(text, "halka_missed_wakeups_total" + base + "} 6\n"));
  EXPECT_TRUE(
      absl::StrContains(text, "halka_waits_yielded_total" + base + "} 7\n"));
  EXPECT_TRUE(absl::StrContains(
      text, "halka_grpc_frames_batched_total" + base + "} 9\n"));
}

TEST(WorkerMetricsTest, TelemetryProtoDatesTheCurrentWait) {
  Progress p;
  p.busy = true;
  p.op = "all_reduce #3";
  p.phase = Phase::kReduceScatter;
  p.step = 1;
  p.chunk = 0;
  p.chunks = 4;
  p.awaited_rank = 3;
  p.waiting_since = absl::FromUnixSeconds(100);
  v1::WorkerTelemetry t =
      TelemetryProto(Sample(), p, absl::FromUnixSeconds(102));
  EXPECT_EQ(t.current_op(), "all_reduce #3");
  EXPECT_EQ(t.awaited_rank(), 3);
  EXPECT_DOUBLE_EQ(t.waiting_for_s(), 2.0);
  EXPECT_EQ(t.chunk(), 1);
  Progress idle;
  EXPECT_EQ(TelemetryProto(Sample(), idle, absl::Now()).awaited_rank(), -1);
}

}  // namespace
}  // namespace halka
