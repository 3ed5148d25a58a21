// Ring health end to end: a LocalCluster whose rank 2 reduces slowly on
// purpose (the worker's test-only reduce delay); GetRingHealth, through the
// rendezvous, must name rank 2 as the rank the others wait on and 2->3 as
// the slowest edge, with per-edge figures from the heartbeats.
#include <cstdio>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "client/client_proto.h"
#include "client/halkactl/bench.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "halka/v1/rendezvous.grpc.pb.h"
#include "tests/testing/ring_ops.h"
#include "tests/testing/run_ranks.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::RunRanks;

v1::RingHealth GetHealth(const LocalCluster& c) {
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(
      c.rendezvous_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::RingHealthRequest req;
  req.set_job_id("local");
  v1::RingHealth reply;
  grpc::Status s = stub->GetRingHealth(&ctx, req, &reply);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return reply;
}

// GET over HTTP with the curl binary ("" when it fails).
std::string Curl(const std::string& url) {
  std::string out;
  FILE* p = popen(("curl -sf --max-time 5 '" + url + "'").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) return "";
  return out;
}

// Prometheus text format: every sample line "name{labels} value" parses,
// and every sample's metric (less _bucket/_sum/_count) has a # TYPE line.
// Returns series -> value.
std::map<std::string, double> ParseProm(const std::string& text) {
  std::map<std::string, double> series;
  std::set<std::string> typed;
  const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+)$)");
  const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram)$)");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::smatch m;
    if (line[0] == '#') {
      if (std::regex_match(line, m, type)) typed.insert(m[1]);
      continue;
    }
    EXPECT_TRUE(std::regex_match(line, m, sample)) << "bad line: " << line;
    if (m.empty()) continue;
    std::string name = m[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (name.size() > s.size() &&
          name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          typed.count(name.substr(0, name.size() - s.size())) > 0) {
        name = name.substr(0, name.size() - s.size());
      }
    }
    EXPECT_TRUE(typed.count(name) > 0) << "no # TYPE for " << line;
    series[line.substr(0, line.rfind(' '))] = std::stod(m[5]);
  }
  return series;
}

struct Cluster {
  Cluster(int g, int slow_rank, absl::Duration delay, bool metrics = false) {
    LocalCluster::Options o;
    o.workers = g;
    o.chunk_bytes = 256 << 10;
    o.heartbeat_interval = absl::Milliseconds(200);
    o.slow_rank = slow_rank;
    o.test_reduce_delay = delay;
    o.metrics = metrics;
    cluster = LocalCluster::Start(o).value();
    for (int r = 0; r < g; ++r) clients.push_back(cluster->Connect(r).value());
  }
  void RunOps(int n, size_t count) {
    ASSERT_NO_FATAL_FAILURE(testing::RunRingAllReduces(clients, n, count));
    absl::SleepFor(absl::Milliseconds(700));  // a few heartbeats
  }
  std::unique_ptr<LocalCluster> cluster;
  std::vector<std::unique_ptr<Client>> clients;
};

TEST(RingHealth, ThrottledRankIsNamedAsTheStraggler) {
  const int g = 4;
  Cluster c(g, /*slow_rank=*/2, absl::Milliseconds(5));
  // 4 MiB: 1 MiB segments of 4 chunks; 24 delayed chunks (120 ms) per op.
  c.RunOps(10, 1 << 20);
  const v1::RingHealth h = GetHealth(*c.cluster);
  std::printf("%s", FormatHealth(ToRingHealth(h)).c_str());
  EXPECT_EQ(h.job_state(), v1::JOB_STATE_HEALTHY);
  EXPECT_EQ(h.last_algorithm(), "ring");
  EXPECT_EQ(h.last_chunk_bytes(), 256u << 10);
  ASSERT_TRUE(h.diagnosis().has_straggler()) << h.diagnosis().summary();
  EXPECT_EQ(h.diagnosis().straggler_rank(), 2);
  EXPECT_EQ(h.diagnosis().slowest_from(), 2);
  EXPECT_EQ(h.diagnosis().slowest_to(), 3);
  EXPECT_THAT(h.diagnosis().summary(), HasSubstr("rank 2 is the straggler"));
  // Every ring edge carried the same payload: 2 (G-1) segments of 1 MiB
  // per op, 10 ops (the fingerprints carry no payload).
  int ring_edges = 0;
  for (const v1::EdgeHealth& e : h.edges()) {
    if (!e.ring()) continue;
    ++ring_edges;
    EXPECT_EQ(e.bytes(), 10u * 2 * (g - 1) * (1 << 20)) << e.from() << "->" << e.to();
    EXPECT_GT(e.wait_p99_seconds(), 0);
    EXPECT_GE(e.wait_p99_seconds(), e.wait_p50_seconds());
  }
  EXPECT_EQ(ring_edges, g);
  // Rank 2's telemetry shows the delay as reduce time on its edge from 1.
  const v1::WorkerTelemetry& t2 = h.telemetry(2);
  double reduce = 0;
  for (const v1::EdgeTelemetry& e : t2.window().edges()) {
    if (e.peer() == 1) reduce = e.reduce_seconds();
  }
  EXPECT_GE(reduce, 10 * 24 * 0.005 * 0.9);
  EXPECT_EQ(t2.last_op().ops(), 1u);
  EXPECT_EQ(t2.window().ops(), 10u);
  // The SDK's plain struct (through a worker) says the same, and is what
  // halkactl prints.
  absl::StatusOr<halka::RingHealth> sdk = c.clients[1]->RingHealth();
  ASSERT_TRUE(sdk.ok()) << sdk.status();
  EXPECT_EQ(sdk->job_id, "local");
  EXPECT_EQ(sdk->job_state, JobState::kHealthy);
  EXPECT_EQ(sdk->world_size, g);
  ASSERT_EQ(sdk->members.size(), static_cast<size_t>(g));
  ASSERT_EQ(sdk->telemetry.size(), static_cast<size_t>(g));
  EXPECT_EQ(sdk->members[3].worker_id, h.members(3).worker_id());
  EXPECT_EQ(sdk->members[3].address, h.members(3).address());
  EXPECT_GE(sdk->telemetry[2].ops_completed, 10u);
  EXPECT_EQ(sdk->last_algorithm, "ring");
  EXPECT_EQ(sdk->diagnosis.straggler_rank, 2);
  EXPECT_EQ(sdk->diagnosis.slowest_from, 2);
  EXPECT_EQ(sdk->diagnosis.slowest_to, 3);
  EXPECT_EQ(sdk->edges.size(), static_cast<size_t>(h.edges_size()));
  EXPECT_EQ(sdk->ranks.size(), static_cast<size_t>(h.ranks_size()));
  const std::string table = FormatHealth(*sdk);
  EXPECT_THAT(table, HasSubstr("*2->3"));
  EXPECT_THAT(table, HasSubstr("<- slowest"));
  EXPECT_THAT(table, HasSubstr("diagnosis: rank 2 is the straggler"));
}

TEST(RingHealth, ThrottledRankZeroToo) {
  const int g = 3;
  Cluster c(g, /*slow_rank=*/0, absl::Milliseconds(5));
  c.RunOps(8, 1 << 20);
  const v1::RingHealth h = GetHealth(*c.cluster);
  std::printf("diagnosis: %s\n", h.diagnosis().summary().c_str());
  EXPECT_EQ(h.diagnosis().straggler_rank(), 0) << h.diagnosis().summary();
  EXPECT_EQ(h.diagnosis().slowest_from(), 0);
  EXPECT_EQ(h.diagnosis().slowest_to(), 1);
}

TEST(RingHealth, MetricsAndRingPageOverHttp) {
  if (std::system("curl --version >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no curl";
  }
  const int g = 4;
  Cluster c(g, /*slow_rank=*/2, absl::Milliseconds(5), /*metrics=*/true);
  c.RunOps(6, 1 << 20);
  // A worker's /metrics.
  const std::string w0 = Curl("http://" + c.cluster->metrics_address(0) + "/metrics");
  ASSERT_FALSE(w0.empty());
  std::map<std::string, double> s = ParseProm(w0);
  const std::string b = "halka_job=\"local\",rank=\"0\"";
  EXPECT_EQ(s["halka_operations_total{" + b +
              ",kind=\"all_reduce\",algorithm=\"ring\",outcome=\"ok\"}"], 6);
  EXPECT_EQ(s["halka_operation_seconds_count{" + b + "}"], 6);
  EXPECT_EQ(s["halka_operation_seconds_bucket{" + b + ",le=\"+Inf\"}"], 6);
  EXPECT_GT(s["halka_operation_seconds_sum{" + b + "}"], 6 * 0.03);
  EXPECT_EQ(s["halka_edge_bytes_total{" + b + ",peer=\"1\",direction=\"sent\"}"],
            6.0 * 2 * (g - 1) * (1 << 20));
  EXPECT_EQ(s["halka_edge_bytes_total{" + b + ",peer=\"3\",direction=\"received\"}"],
            6.0 * 2 * (g - 1) * (1 << 20));
  EXPECT_GT(s["halka_edge_wait_seconds_total{" + b + ",peer=\"3\"}"], 0);
  EXPECT_EQ(s["halka_worker_generation{" + b + "}"], 1);
  // The client's calls ran in its worker's process, on its own thread
  // (common/in_process.h): no session was opened.
  EXPECT_EQ(s["halka_worker_in_process_calls_total{" + b + "}"], 6);
  EXPECT_EQ(s["halka_worker_sessions{" + b + "}"], 0);
  EXPECT_EQ(s["halka_worker_session_calls_total{" + b + "}"], 0);
  // The slow rank's reduce time per edge shows the delay.
  const std::map<std::string, double> s2 =
      ParseProm(Curl("http://" + c.cluster->metrics_address(2) + "/metrics"));
  EXPECT_GE(s2.at("halka_edge_reduce_seconds_total{halka_job=\"local\",rank=\"2\",peer=\"1\"}"),
            6 * 24 * 0.005 * 0.9);
  // The rendezvous's /metrics.
  const std::string rv = Curl("http://" + c.cluster->metrics_address(-1) + "/metrics");
  std::printf("%s", rv.c_str());
  s = ParseProm(rv);
  EXPECT_EQ(s["halka_ring_state{halka_job=\"local\",state=\"healthy\"}"], 1);
  EXPECT_EQ(s["halka_ring_state{halka_job=\"local\",state=\"degraded\"}"], 0);
  EXPECT_EQ(s["halka_ring_generation{halka_job=\"local\"}"], 1);
  EXPECT_EQ(s["halka_ring_members{halka_job=\"local\"}"], 4);
  EXPECT_EQ(s["halka_ring_straggler_rank{halka_job=\"local\"}"], 2);
  EXPECT_EQ(s["halka_member_alive{halka_job=\"local\",rank=\"3\",worker=\"worker-3\"}"], 1);
  EXPECT_EQ(s["halka_edge_window_bytes{halka_job=\"local\",from=\"2\",to=\"3\",ring=\"true\"}"],
            6.0 * 2 * (g - 1) * (1 << 20));
  // The ring page and its JSON.
  const std::string page = Curl("http://" + c.cluster->metrics_address(-1) + "/");
  EXPECT_THAT(page, HasSubstr("<svg id=\"ring\""));
  EXPECT_THAT(page, HasSubstr("api/health?job="));
  EXPECT_THAT(page, ::testing::Not(HasSubstr("src=\"http")));  // no CDN
  EXPECT_THAT(page, ::testing::Not(HasSubstr("href=\"http")));
  EXPECT_THAT(page, ::testing::Not(HasSubstr("<link")));
  EXPECT_EQ(Curl("http://" + c.cluster->metrics_address(-1) + "/api/jobs"),
            "[\"local\"]");
  const std::string json =
      Curl("http://" + c.cluster->metrics_address(-1) + "/api/health?job=local");
  EXPECT_THAT(json, HasSubstr("\"straggler_rank\":2"));
  EXPECT_THAT(json, HasSubstr("\"state\":\"healthy\""));
  EXPECT_EQ(Curl("http://" + c.cluster->metrics_address(-1) + "/api/health?job=nope"), "");
}

TEST(RingHealth, IdleRingReportsNoTraffic) {
  Cluster c(3, -1, absl::ZeroDuration());
  absl::SleepFor(absl::Milliseconds(500));
  const v1::RingHealth h = GetHealth(*c.cluster);
  EXPECT_FALSE(h.diagnosis().has_straggler());
  EXPECT_EQ(h.diagnosis().straggler_rank(), -1);
  EXPECT_EQ(h.diagnosis().summary(), "no ring traffic in the window");
  EXPECT_EQ(h.last_algorithm(), "");
  // Client::Info: the worker's own view, in the SDK's plain struct.
  absl::StatusOr<WorkerInfo> info = c.clients[2]->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->job_id, "local");
  EXPECT_EQ(info->rank, 2);
  EXPECT_EQ(info->world_size, 3);
  EXPECT_EQ(info->generation, h.generation());
  EXPECT_TRUE(info->in_ring);
  EXPECT_EQ(info->job_state, JobState::kHealthy);
  ASSERT_EQ(info->members.size(), 3u);
  EXPECT_EQ(info->members[2].rank, 2);
  EXPECT_EQ(info->members[2].worker_id, info->worker_id);
  EXPECT_TRUE(info->members[0].alive);
}

// The verdict is current: asked right after a successful round on every
// rank that follows a failed one, health says healthy, and right after the
// failed round it says failing. Each worker reports a change of its last
// operation's outcome with a heartbeat before the call returns, not at its
// next beat (2 s away here, so a late report would show every time).
TEST(RingHealth, VerdictIsCurrentRightAfterARecovery) {
  const int g = 4;
  LocalCluster::Options o;
  o.workers = g;
  o.heartbeat_interval = absl::Seconds(2);
  o.heartbeat_timeout = absl::Seconds(10);
  auto cluster = LocalCluster::Start(o).value();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < g; ++r) clients.push_back(cluster->Connect(r).value());
  std::vector<std::vector<float>> bufs(g, std::vector<float>(1000, 1.0f));
  auto round = [&](bool mismatched) {
    return RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
      // Mismatched: ranks 1 and 2 call with another count than 0 and 3.
      const size_t count = mismatched && (r == 1 || r == 2) ? 999 : 1000;
      return clients[r]->AllReduce(absl::MakeSpan(bufs[r].data(), count),
                                   ReduceOp::kSum);
    });
  };
  for (int rep = 0; rep < 10; ++rep) {
    SCOPED_TRACE(absl::StrCat("repetition ", rep));
    for (const auto& res : round(/*mismatched=*/true)) {
      ASSERT_EQ(res.status().code(), absl::StatusCode::kFailedPrecondition)
          << res.status();
    }
    v1::RingHealth h = GetHealth(*cluster);
    EXPECT_TRUE(h.failing()) << h.DebugString();
    std::string table = FormatHealth(ToRingHealth(h));
    EXPECT_EQ(table.rfind("job local: FAILING, generation 1: operations are "
                          "failing", 0),
              0u)
        << table;
    for (const auto& res : round(/*mismatched=*/false)) {
      ASSERT_TRUE(res.ok()) << res.status();
    }
    h = GetHealth(*cluster);
    EXPECT_FALSE(h.failing()) << h.diagnosis().failure();
    table = FormatHealth(ToRingHealth(h));
    EXPECT_EQ(table.rfind("job local: healthy, generation 1, 4 members", 0), 0u)
        << table;
  }
}

// Ranks interleaved over two hosts (A, B, A, B): the ring passes A's
// ranks, then B's (0 -> 2 -> 1 -> 3 -> 0), every collective still gives
// the rank-order result, and health says the hosts and ring positions.
TEST(RingHealth, InterleavedHostsRunInHostOrder) {
  const int g = 4;
  LocalCluster::Options o;
  o.workers = g;
  o.chunk_bytes = 64 << 10;
  o.heartbeat_interval = absl::Milliseconds(200);
  o.hosts = {"A", "B", "A", "B"};
  auto cluster = LocalCluster::Start(o).value();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < g; ++r) clients.push_back(cluster->Connect(r).value());
  const size_t n = 1 << 18;  // 1 MiB of floats: the ring, 4 chunks a segment
  OpOptions ring;
  ring.algorithm = Algorithm::kRing;
  std::vector<std::vector<float>> bufs(g);
  for (int r = 0; r < g; ++r) bufs[r].assign(n, static_cast<float>(r + 1));
  auto ar = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    return clients[r]->AllReduce(absl::MakeSpan(bufs[r]), ReduceOp::kSum, ring);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(ar[r].ok()) << ar[r].status();
    EXPECT_EQ(ar[r]->rank, r);
    EXPECT_EQ(ar[r]->model_seconds, 0) << "no link model, no prediction";
    EXPECT_EQ(bufs[r], std::vector<float>(n, 10.0f)) << "rank " << r;
  }
  // Reduce-scatter: rank r gets slice r; all-gather: slice i is rank i's;
  // broadcast from rank 1.
  const size_t slice = 1000;
  std::vector<std::vector<float>> out(g, std::vector<float>(g * slice));
  auto rs = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    std::vector<float> send(g * slice);
    for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(i / slice * 10 + r);
    return clients[r]->ReduceScatter(absl::MakeConstSpan(send),
                                     absl::MakeSpan(out[r].data(), slice),
                                     ReduceOp::kSum);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(rs[r].ok()) << rs[r].status();
    EXPECT_EQ(out[r][0], static_cast<float>(g * r * 10 + 0 + 1 + 2 + 3)) << r;
  }
  auto ag = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    std::vector<float> mine(slice, static_cast<float>(100 + r));
    return clients[r]->AllGather(absl::MakeConstSpan(mine),
                                 absl::MakeSpan(out[r]));
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(ag[r].ok()) << ag[r].status();
    for (int i = 0; i < g; ++i) {
      EXPECT_EQ(out[r][i * slice], static_cast<float>(100 + i)) << r << " " << i;
    }
  }
  auto bc = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    bufs[r].assign(n, static_cast<float>(r));
    return clients[r]->Broadcast(absl::MakeSpan(bufs[r]), /*root=*/1);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(bc[r].ok()) << bc[r].status();
    EXPECT_EQ(bufs[r], std::vector<float>(n, 1.0f)) << r;
  }
  absl::SleepFor(absl::Milliseconds(700));  // a few heartbeats
  const v1::RingHealth h = GetHealth(*cluster);
  EXPECT_THAT(h.ring_order(), ::testing::ElementsAre(0, 2, 1, 3));
  ASSERT_EQ(h.hosts_size(), 2);
  EXPECT_EQ(h.hosts(0).host(), "A");
  EXPECT_THAT(h.hosts(0).ranks(), ::testing::ElementsAre(0, 2));
  EXPECT_THAT(h.hosts(1).ranks(), ::testing::ElementsAre(1, 3));
  for (int r = 0; r < g; ++r) EXPECT_EQ(h.members(r).host(), r % 2 == 0 ? "A" : "B");
  // The ring edges the data took follow the hosts: one crossing each way.
  std::set<std::pair<int, int>> ring_edges;
  for (const v1::EdgeHealth& e : h.edges()) {
    if (e.ring() && e.bytes() > 0) ring_edges.insert({e.from(), e.to()});
  }
  EXPECT_EQ(ring_edges, (std::set<std::pair<int, int>>{{0, 2}, {2, 1}, {1, 3}, {3, 0}}));
  const std::string table = FormatHealth(ToRingHealth(h));
  std::printf("%s", table.c_str());
  EXPECT_EQ(table.rfind("job local: healthy, generation 1, 4 members on 2 hosts\n", 0), 0u)
      << table;
  EXPECT_THAT(table, HasSubstr("ring over 2 hosts: A [0 2] -> B [1 3] -> A"));
  EXPECT_THAT(table, HasSubstr("rank  pos  worker         host"));
  // The SDK's struct says the same.
  absl::StatusOr<halka::RingHealth> sdk = clients[3]->RingHealth();
  ASSERT_TRUE(sdk.ok()) << sdk.status();
  EXPECT_EQ(sdk->ring_order, (std::vector<int>{0, 2, 1, 3}));
  ASSERT_EQ(sdk->hosts.size(), 2u);
  EXPECT_EQ(sdk->hosts[1].host, "B");
  EXPECT_EQ(sdk->members[3].host, "B");
  EXPECT_EQ(sdk->link_model, "") << "no --link_model, no model";
}

// Four workers on hosts A, A, B, B with the rendezvous's --link_model.
LocalCluster::Options TwoByTwo(const std::string& link_model) {
  LocalCluster::Options o;
  o.workers = 4;
  o.heartbeat_interval = absl::Milliseconds(200);
  o.hosts = {"A", "A", "B", "B"};
  o.link_model = link_model;
  return o;
}

std::vector<std::unique_ptr<Client>> ConnectAll(LocalCluster& cluster, int g) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < g; ++r) clients.push_back(cluster.Connect(r).value());
  return clients;
}

// The rendezvous's link model reaches every member with the membership:
// auto runs what it ranks first (here, with a model whose links inside a
// host are slow (1 ms), naive for 64 bytes, where the counting rules run
// recursive doubling, which crosses such a link; two-level for a
// reduce-scatter), the same on every rank, and health shows the model. A
// model the rendezvous cannot read stops the cluster before it starts.
TEST(RingHealth, TheJobsLinkModelDrivesAutoAndHealthShowsIt) {
  const int g = 4;
  LocalCluster::Options o = TwoByTwo("local=1000:10,net=100:1");
  auto cluster = LocalCluster::Start(o).value();
  std::vector<std::unique_ptr<Client>> clients = ConnectAll(*cluster, g);
  std::vector<std::vector<float>> small(g, std::vector<float>(16));
  auto ar = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    small[r].assign(16, static_cast<float>(r + 1));
    return clients[r]->AllReduce(absl::MakeSpan(small[r]), ReduceOp::kSum);
  });
  // What the model predicted for it, on every rank: naive on 2 x 2, the
  // fingerprint pass and one net hop, and 2 x 2 copies of 64 bytes through
  // a host's NIC.
  const double predicted = 100e-6 + 100e-6 + 4 * 64 / 1e9;
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(ar[r].ok()) << ar[r].status();
    EXPECT_EQ(ar[r]->algorithm, "naive") << "rank " << r;
    EXPECT_NEAR(ar[r]->model_seconds, predicted, 1e-12) << "rank " << r;
    EXPECT_EQ(small[r], std::vector<float>(16, 10.0f)) << "rank " << r;
  }
  const size_t slice = 1000;
  std::vector<std::vector<float>> out(g, std::vector<float>(slice));
  auto rs = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    std::vector<float> send(g * slice);
    for (size_t i = 0; i < send.size(); ++i) {
      send[i] = static_cast<float>(i / slice * 10 + r);
    }
    return clients[r]->ReduceScatter(absl::MakeConstSpan(send),
                                     absl::MakeSpan(out[r]), ReduceOp::kSum);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(rs[r].ok()) << rs[r].status();
    EXPECT_EQ(rs[r]->algorithm, "two_level") << "rank " << r;
    EXPECT_EQ(out[r], std::vector<float>(slice, static_cast<float>(
                                                    g * r * 10 + 0 + 1 + 2 + 3)))
        << "rank " << r;
  }
  // The reduce-scatter's prediction reaches health with the heartbeats.
  const double rs_predicted = rs[0]->model_seconds;
  EXPECT_GT(rs_predicted, 0);
  v1::RingHealth h;
  for (int i = 0; i < 50; ++i) {
    h = GetHealth(*cluster);
    if (h.last_model_seconds() == rs_predicted) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(h.last_algorithm(), "two_level");
  EXPECT_DOUBLE_EQ(h.last_model_seconds(), rs_predicted);
  EXPECT_GT(h.last_op_seconds(), 0);
  ASSERT_TRUE(h.has_link_model());
  EXPECT_DOUBLE_EQ(h.link_model().local_alpha_us(), 1000.0);
  EXPECT_DOUBLE_EQ(h.link_model().net_bytes_per_s(), 1e9);
  const std::string table = FormatHealth(ToRingHealth(h));
  EXPECT_THAT(table,
              HasSubstr("link model (auto ranks by it): local: alpha 1000.0 "
                        "us, B 10.000 GB/s; net: alpha 100.0 us, B 1.000 "
                        "GB/s\n"))
      << table;
  EXPECT_THAT(table, HasSubstr(absl::StrFormat(
                         "last operations: algorithm two_level, chunk %d "
                         "bytes; the last took ",
                         h.last_chunk_bytes())))
      << table;
  EXPECT_THAT(table, HasSubstr(absl::StrFormat(
                         ", the link model predicted %.3f ms\n",
                         rs_predicted * 1e3)))
      << table;

  LocalCluster::Options bad = o;
  bad.link_model = "local=1:10,wan=3:1";
  absl::StatusOr<std::unique_ptr<LocalCluster>> refused = LocalCluster::Start(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("'wan=3:1'"));
}

// --link_model=probe: the members measure their ring links on the ring
// the job formed with, and the rendezvous publishes the medians as the
// next generation, which every rank's auto then ranks by and health shows.
TEST(RingHealth, TheMembersProbeTheirLinksAndAutoRanksByTheMeasuredModel) {
  const int g = 4;
  auto cluster = LocalCluster::Start(TwoByTwo("probe")).value();
  std::vector<std::unique_ptr<Client>> clients = ConnectAll(*cluster, g);
  // Each rank's probe runs on the first generation's ring (built when it
  // joined), and the workers' Join returns (LocalCluster::Start with it)
  // only once the rendezvous published the model as generation 2: no call
  // runs on the ring that is replaced at once.
  v1::RingHealth h = GetHealth(*cluster);
  ASSERT_TRUE(h.has_link_model()) << h.change();
  EXPECT_EQ(h.link_model().measured_generation(), 1u);
  EXPECT_EQ(h.generation(), 2u);
  EXPECT_THAT(h.change(), HasSubstr("link model measured on generation 1 by 4 "
                                    "of 4 members"));
  // Both levels measured on loopback: the shared-memory and wire links
  // inside and between the two named hosts.
  EXPECT_GT(h.link_model().local_alpha_us(), 0);
  EXPECT_GT(h.link_model().local_bytes_per_s(), 0);
  EXPECT_GT(h.link_model().net_alpha_us(), 0);
  EXPECT_GT(h.link_model().net_bytes_per_s(), 0);
  // Every rank's auto ranks by it from the first call: the same algorithm
  // everywhere, its prediction in the reply, the result right.
  std::vector<std::vector<float>> bufs(g, std::vector<float>(50000));
  auto ar = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    bufs[r].assign(bufs[r].size(), static_cast<float>(r + 1));
    return clients[r]->AllReduce(absl::MakeSpan(bufs[r]), ReduceOp::kSum);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(ar[r].ok()) << ar[r].status();
    EXPECT_EQ(ar[r]->generation, 2u) << "rank " << r;
    EXPECT_EQ(ar[r]->algorithm, ar[0]->algorithm) << "rank " << r;
    EXPECT_GT(ar[r]->model_seconds, 0) << "rank " << r;
    EXPECT_EQ(bufs[r], std::vector<float>(bufs[r].size(), 10.0f)) << r;
  }
  const std::string table = FormatHealth(ToRingHealth(GetHealth(*cluster)));
  EXPECT_THAT(table, HasSubstr(", measured at generation 1\n")) << table;
}

}  // namespace
}  // namespace halka
