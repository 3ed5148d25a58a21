// The per-rank timeline end to end: a LocalCluster runs a few all-reduces,
// every worker's timeline is gathered (Worker.GetTimeline, as `halkactl
// trace` does) and written as one Chrome trace; the JSON is parsed back and
// its structure checked: one process row per rank, every span inside its
// operation's span, spans of one row in order without overlap, and the
// same operations on every rank.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "server/timeline_trace.h"
#include "tests/testing/ring_health.h"
#include "tests/testing/ring_ops.h"
#include "tests/testing/run_ranks.h"

namespace halka {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using halka::testing::RunRanks;

std::vector<v1::Member> Members(const LocalCluster& c) {
  auto h = halka::testing::FetchRingHealth(c.rendezvous_address(), "local");
  EXPECT_TRUE(h.ok()) << h.status();
  if (!h.ok()) return {};
  return {h->members().begin(), h->members().end()};
}

struct Event {
  std::string name, cat, ph;
  int pid = -1, tid = -1;
  double ts = 0, dur = 0;
  double op_seq = -1;
};

std::vector<Event> ParseTrace(const std::string& json) {
  Struct root;
  auto st = google::protobuf::util::JsonStringToMessage(json, &root);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::vector<Event> out;
  const auto& fields = root.fields();
  EXPECT_EQ(fields.count("traceEvents"), 1u);
  if (fields.count("traceEvents") == 0) return out;
  for (const Value& v : fields.at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    Event e;
    e.name = f.at("name").string_value();
    e.ph = f.at("ph").string_value();
    e.pid = static_cast<int>(f.at("pid").number_value());
    e.tid = static_cast<int>(f.at("tid").number_value());
    if (e.ph == "X") {
      e.cat = f.at("cat").string_value();
      e.ts = f.at("ts").number_value();
      e.dur = f.at("dur").number_value();
      e.op_seq = f.at("args").struct_value().fields().at("op_seq").number_value();
    } else if (e.name == "process_name") {
      e.cat = f.at("args").struct_value().fields().at("name").string_value();
    }
    out.push_back(e);
  }
  return out;
}

TEST(TimelineTrace, GatheredTraceHasOneRowPerRankAndNestedOrderedSpans) {
  const int g = 3;
  const int ops = 5;
  LocalCluster::Options o;
  o.workers = g;
  o.chunk_bytes = 64 << 10;
  auto cluster = LocalCluster::Start(o).value();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < g; ++r) clients.push_back(cluster->Connect(r).value());
  ASSERT_NO_FATAL_FAILURE(testing::RunRingAllReduces(clients, ops, 1 << 17));
  auto timelines = GatherTimelines(Members(*cluster), absl::Seconds(10));
  ASSERT_TRUE(timelines.ok()) << timelines.status();
  ASSERT_EQ(timelines->size(), static_cast<size_t>(g));
  const std::vector<Event> events = ParseTrace(ChromeTraceJson(*timelines));
  ASSERT_FALSE(events.empty());

  // One process row per rank, named after it.
  std::map<int, std::string> processes;
  for (const Event& e : events) {
    if (e.ph == "M" && e.name == "process_name") {
      EXPECT_EQ(processes.count(e.pid), 0u) << "two rows for rank " << e.pid;
      processes[e.pid] = e.cat;
    }
  }
  ASSERT_EQ(processes.size(), static_cast<size_t>(g));
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(processes.count(r), 1u);
    EXPECT_EQ(processes[r].rfind("rank " + std::to_string(r) + " (", 0), 0u);
  }

  // Operations per rank: the same sequence numbers everywhere.
  std::map<int, std::map<double, Event>> op_of;  // pid -> op_seq -> op span
  for (const Event& e : events) {
    if (e.ph == "X" && e.cat == "op") {
      EXPECT_EQ(op_of[e.pid].count(e.op_seq), 0u);
      op_of[e.pid][e.op_seq] = e;
    }
  }
  ASSERT_EQ(op_of.size(), static_cast<size_t>(g));
  std::set<double> seqs0;
  for (const auto& [seq, e] : op_of[0]) seqs0.insert(seq);
  EXPECT_EQ(seqs0.size(), static_cast<size_t>(ops));
  for (int r = 1; r < g; ++r) {
    std::set<double> seqs;
    for (const auto& [seq, e] : op_of[r]) seqs.insert(seq);
    EXPECT_EQ(seqs, seqs0) << "rank " << r;
  }

  // Every span lies inside its operation's span (1 us of rounding), and
  // the spans of one row follow each other without overlap.
  std::map<std::string, int> kinds;
  std::map<std::pair<int, int>, std::vector<const Event*>> rows;
  for (const Event& e : events) {
    if (e.ph != "X" || e.cat == "op") continue;
    ++kinds[e.cat];
    ASSERT_EQ(op_of[e.pid].count(e.op_seq), 1u) << e.name;
    const Event& op = op_of[e.pid][e.op_seq];
    EXPECT_GE(e.ts + 1, op.ts) << e.name << " of rank " << e.pid;
    EXPECT_LE(e.ts + e.dur, op.ts + op.dur + 1)
        << e.name << " of rank " << e.pid;
    rows[{e.pid, e.tid}].push_back(&e);
  }
  for (const char* kind : {"phase", "wait", "reduce", "send", "wire"}) {
    EXPECT_GT(kinds[kind], 0) << "no " << kind << " spans";
  }
  for (const auto& [row, spans] : rows) {
    for (size_t i = 1; i < spans.size(); ++i) {
      // Booked in order; a row never runs two spans at once.
      EXPECT_GE(spans[i]->ts + 1, spans[i - 1]->ts + spans[i - 1]->dur)
          << "rank " << row.first << " row " << row.second << ": "
          << spans[i - 1]->name << " then " << spans[i]->name;
    }
  }
  // Per op, the phases on every rank: fingerprint, reduce-scatter,
  // all-gather.
  std::map<int, std::multiset<std::string>> phases;
  for (const Event& e : events) {
    if (e.ph == "X" && e.cat == "phase") phases[e.pid].insert(e.name);
  }
  for (int r = 0; r < g; ++r) {
    for (const char* p : {"fingerprint", "reduce-scatter", "all-gather"}) {
      EXPECT_EQ(phases[r].count(p), static_cast<size_t>(ops))
          << "rank " << r << " " << p;
    }
  }
}

TEST(TimelineTrace, EmptyTimelinesMakeAValidTrace) {
  v1::Timeline t;
  t.set_rank(0);
  t.set_worker_id("w\"0");  // quoted correctly
  const std::vector<Event> events = ParseTrace(ChromeTraceJson({t}));
  ASSERT_EQ(events.size(), 4u);  // process name, sort index, thread name, sort
  EXPECT_EQ(events[0].cat, "rank 0 (w\"0)");
}

TEST(TimelineTrace, UnreachableWorkerIsNamed) {
  v1::Member m;
  m.set_rank(1);
  m.set_worker_id("gone");
  m.set_address("127.0.0.1:1");
  m.set_alive(true);
  auto t = GatherTimelines({m}, absl::Seconds(2));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("timeline of rank 1 (gone, 127.0.0.1:1)"),
            std::string::npos)
      << t.status();
}

}  // namespace
}  // namespace halka
