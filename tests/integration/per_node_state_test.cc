// Workers sharing one process keep their own state: each counts its own
// links (WorkerNode::link_counters, its /metrics), remembers its own wire
// fallbacks, keeps the shm_spin and the security configuration it was
// created with. Several embedded clusters (each a rendezvous and its
// workers) run side by side in this one process, configured differently.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "tests/testing/link_counts.h"
#include "tests/testing/run_ranks.h"
#include "transport/tcp/wire_link.h"
#include "worker/ring_book.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

using halka::testing::CountsOf;
using halka::testing::LinkCounts;
using halka::testing::RunRanks;

// One all-reduce of `count` floats on every rank of `cluster`, through
// `clients` (one per rank), with `algorithm`; true when every rank got the
// sum.
bool AllReduceCorrect(const LocalCluster& cluster,
                      const std::vector<std::unique_ptr<Client>>& clients,
                      Algorithm algorithm, size_t count = 1 << 15) {
  const int g = cluster.size();
  auto ok = RunRanks<bool>(g, [&](int r) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) {
      v[i] = static_cast<float>(r + 1) + static_cast<float>(i % 7);
    }
    OpOptions o;
    o.algorithm = algorithm;
    auto info = clients[static_cast<size_t>(r)]->AllReduce(
        absl::MakeSpan(v), ReduceOp::kSum, o);
    if (!info.ok()) {
      ADD_FAILURE() << "rank " << r << ": " << info.status();
      return false;
    }
    for (size_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(g * (g + 1) / 2) +
                         static_cast<float>(g) * static_cast<float>(i % 7);
      if (v[i] != want) {
        ADD_FAILURE() << "rank " << r << " element " << i << ": " << v[i];
        return false;
      }
    }
    return true;
  });
  for (bool b : ok) {
    if (!b) return false;
  }
  return true;
}

// A started cluster and a client per rank (connected at once: a client
// takes the process's security configuration when it connects).
struct Running {
  std::unique_ptr<LocalCluster> cluster;
  std::vector<std::unique_ptr<Client>> clients;
};

absl::StatusOr<Running> Start(const LocalCluster::Options& o) {
  Running run;
  auto cluster = LocalCluster::Start(o);
  if (!cluster.ok()) return cluster.status();
  run.cluster = std::move(*cluster);
  for (int r = 0; r < run.cluster->size(); ++r) {
    auto client = run.cluster->Connect(r);
    if (!client.ok()) return client.status();
    run.clients.push_back(std::move(*client));
  }
  return run;
}

LocalCluster::Options Cluster(const std::string& job, int workers,
                              bool shm_links, bool wire_links,
                              absl::Duration shm_spin) {
  LocalCluster::Options o;
  o.job_id = job;
  o.workers = workers;
  o.chunk_bytes = 4096;
  o.shm_links = shm_links;
  o.wire_links = wire_links;
  o.shm_spin = shm_spin;
  return o;
}

// The value of one of `worker`'s halka_peer_links_total series, as its
// /metrics serves it ("" when the line is missing).
std::string PeerLinksSample(WorkerNode& worker, const std::string& path,
                            const std::string& outcome) {
  const std::string text = worker.MetricsText();
  const std::string head = absl::StrCat(
      "halka_peer_links_total{halka_job=\"", worker.options().job_id,
      "\",rank=\"", worker.rank(), "\",path=\"", path, "\",outcome=\"",
      outcome, "\"} ");
  const size_t at = text.find(head);
  if (at == std::string::npos) return "";
  const size_t from = at + head.size();
  return text.substr(from, text.find('\n', from) - from);
}

// Three clusters in one process: links on the wire, on gRPC only, and
// through shared memory (each with its own shm_spin). Each worker counts
// its own links, and its /metrics says so: the gRPC-only cluster's count
// nothing although the other clusters' links took the wire and the rings.
TEST(PerNodeState, ClustersInOneProcessCountOnlyTheirOwnLinks) {
  auto wire = Start(Cluster("wire-job", 3, false, true, absl::ZeroDuration()));
  ASSERT_TRUE(wire.ok()) << wire.status();
  auto grpc = Start(Cluster("grpc-job", 3, false, false, absl::Microseconds(50)));
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  auto shm = Start(Cluster("shm-job", 2, true, true, absl::Microseconds(20)));
  ASSERT_TRUE(shm.ok()) << shm.status();
  for (Running* run : {&*wire, &*grpc, &*shm}) {
    ASSERT_TRUE(AllReduceCorrect(*run->cluster, run->clients, Algorithm::kRing));
  }
  for (int r = 0; r < 3; ++r) {
    WorkerNode& w = *wire->cluster->worker(r);
    const LinkCounts n = CountsOf(w);
    EXPECT_GE(n.wire_accepted, 1u) << "wire rank " << r;  // to its successor
    EXPECT_EQ(n.shm_accepted + n.shm_refused, 0u) << "wire rank " << r;
    EXPECT_EQ(n.wire_fell_back + n.wire_refused, 0u) << "wire rank " << r;
    EXPECT_EQ(PeerLinksSample(w, "wire", "accepted"),
              absl::StrCat(n.wire_accepted));
    EXPECT_EQ(w.options().shm_spin, absl::ZeroDuration());

    WorkerNode& g = *grpc->cluster->worker(r);
    const LinkCounts m = CountsOf(g);
    EXPECT_EQ(m.wire_accepted + m.wire_refused + m.wire_fell_back, 0u)
        << "grpc rank " << r << " counted another cluster's wire links";
    EXPECT_EQ(m.shm_accepted + m.shm_refused, 0u) << "grpc rank " << r;
    EXPECT_EQ(m.wire_landed + m.wire_evicted, 0u) << "grpc rank " << r;
    EXPECT_EQ(PeerLinksSample(g, "wire", "accepted"), "0");
    EXPECT_EQ(PeerLinksSample(g, "shm", "accepted"), "0");
    EXPECT_EQ(g.wire_port(), 0);  // no listener: wire_links is off
    EXPECT_EQ(g.options().shm_spin, absl::Microseconds(50));
  }
  for (int r = 0; r < 2; ++r) {
    WorkerNode& s = *shm->cluster->worker(r);
    const LinkCounts n = CountsOf(s);
    EXPECT_GE(n.shm_accepted, 1u) << "shm rank " << r;
    EXPECT_EQ(n.wire_accepted + n.wire_fell_back, 0u) << "shm rank " << r;
    EXPECT_EQ(PeerLinksSample(s, "shm", "accepted"),
              absl::StrCat(n.shm_accepted));
    EXPECT_EQ(s.options().shm_spin, absl::Microseconds(20));
  }
}

// A wire fallback is the noting worker's: worker 0 remembers that worker
// 1's wire could not be reached (as its link would after a failed
// connection) and offers it no wire; worker 2, in the same process, still
// does, and its link to worker 1 takes the wire.
TEST(PerNodeState, AFallbackOneWorkerNotedKeepsNoOtherOffTheWire) {
  auto run = Start(Cluster("fallback-job", 3, false, true, absl::ZeroDuration()));
  ASSERT_TRUE(run.ok()) << run.status();
  LocalCluster& c = *run->cluster;
  const std::string peer = c.worker_address(1);
  c.worker(0)->wire_fallbacks().Note(
      peer, absl::UnavailableError("test: the peer's wire port is blocked"));
  EXPECT_TRUE(c.worker(0)->wire_fallbacks().RecentlyFailed(peer));
  EXPECT_FALSE(c.worker(2)->wire_fallbacks().RecentlyFailed(peer));
  EXPECT_FALSE(c.worker(0)->wire_fallbacks().RecentlyFailed(c.worker_address(2)));
  // Naive: every rank links to both others.
  ASSERT_TRUE(AllReduceCorrect(c, run->clients, Algorithm::kNaive));
  const LinkCounts w0 = CountsOf(*c.worker(0));
  const LinkCounts w2 = CountsOf(*c.worker(2));
  EXPECT_EQ(w0.wire_accepted, 1u) << "worker 0 offered the wire to worker 1";
  EXPECT_EQ(w0.wire_refused + w0.wire_fell_back, 0u);
  EXPECT_EQ(w2.wire_accepted, 2u) << "worker 0's fallback kept worker 2 off";
  EXPECT_EQ(w2.wire_refused + w2.wire_fell_back, 0u);
}

// A worker keeps the security configuration it was created with: a second
// cluster with another job token, set as the process's configuration
// after the first started, changes nothing of the first's workers, whose
// peer links (opened at their first operation, after that change) still
// carry their own job's token.
TEST(PerNodeState, AWorkerKeepsTheSecurityItWasCreatedWith) {
  LocalCluster::Options a = Cluster("job-a", 3, false, true, absl::ZeroDuration());
  a.job_token = "token-of-a";
  auto first = Start(a);
  ASSERT_TRUE(first.ok()) << first.status();
  LocalCluster::Options b = Cluster("job-b", 2, false, true, absl::ZeroDuration());
  b.job_token = "token-of-b";
  auto second = Start(b);  // the process's configuration is job b's now
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->cluster->worker(0)->options().security->job_token,
            "token-of-a");
  EXPECT_EQ(second->cluster->worker(0)->options().security->job_token,
            "token-of-b");
  EXPECT_TRUE(AllReduceCorrect(*first->cluster, first->clients, Algorithm::kRing));
  EXPECT_TRUE(AllReduceCorrect(*second->cluster, second->clients, Algorithm::kRing));
  EXPECT_GE(CountsOf(*first->cluster).wire_accepted, 3u);
  SetSecurityConfig(SecurityConfig());  // as the process had it
}

// The value of `worker`'s one-series counter `name` as its /metrics serves
// it ("" when the line is missing).
std::string CounterSample(WorkerNode& worker, const std::string& name) {
  const std::string text = worker.MetricsText();
  const std::string head =
      absl::StrCat(name, "{halka_job=\"", worker.options().job_id,
                   "\",rank=\"", worker.rank(), "\"} ");
  const size_t at = text.find(head);
  if (at == std::string::npos) return "";
  const size_t from = at + head.size();
  return text.substr(from, text.find('\n', from) - from);
}

// --wire_congestion reaches every wire link's sending socket, and each
// worker counts and serves what came of it: a cluster that asks for reno
// (in every kernel, and allowed to every process) changes each of its wire
// links unless the host's default is reno already; one that asks for the
// host's own (system) changes none. A malformed name stops the worker at
// start, naming the flag.
TEST(PerNodeState, WireLinksTakeTheCongestionControlTheWorkerAsksFor) {
  const std::string host = DefaultCongestion();
  ASSERT_FALSE(host.empty());
  LocalCluster::Options ro =
      Cluster("cc-reno", 3, false, true, absl::ZeroDuration());
  ro.wire_congestion = "reno";
  auto reno = Start(ro);
  ASSERT_TRUE(reno.ok()) << reno.status();
  LocalCluster::Options so =
      Cluster("cc-system", 2, false, true, absl::ZeroDuration());
  so.wire_congestion = "system";
  auto system = Start(so);
  ASSERT_TRUE(system.ok()) << system.status();
  ASSERT_TRUE(AllReduceCorrect(*reno->cluster, reno->clients, Algorithm::kRing));
  ASSERT_TRUE(
      AllReduceCorrect(*system->cluster, system->clients, Algorithm::kRing));
  for (int r = 0; r < reno->cluster->size(); ++r) {
    WorkerNode& w = *reno->cluster->worker(r);
    const WireLinkCounts& c = w.link_counters().wire;
    ASSERT_GE(c.accepted.load(), 1u) << "rank " << r;
    ASSERT_EQ(c.fell_back.load(), 0u) << "rank " << r;
    const uint64_t want = host == "reno" ? 0 : c.accepted.load();
    EXPECT_EQ(c.congestion_changed.load(), want) << "rank " << r;
    EXPECT_EQ(c.congestion_refused.load(), 0u) << "rank " << r;
    EXPECT_EQ(CounterSample(w, "halka_wire_congestion_changed_total"),
              absl::StrCat(want))
        << "rank " << r;
  }
  for (int r = 0; r < system->cluster->size(); ++r) {
    WorkerNode& w = *system->cluster->worker(r);
    const WireLinkCounts& c = w.link_counters().wire;
    ASSERT_GE(c.accepted.load(), 1u) << "rank " << r;
    EXPECT_EQ(c.congestion_changed.load(), 0u) << "rank " << r;
    EXPECT_EQ(c.congestion_refused.load(), 0u) << "rank " << r;
    EXPECT_EQ(CounterSample(w, "halka_wire_congestion_refused_total"), "0")
        << "rank " << r;
  }
  LocalCluster::Options bad =
      Cluster("cc-bad", 2, false, true, absl::ZeroDuration());
  bad.wire_congestion = "Not A Name";
  auto refused = LocalCluster::Start(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--wire_congestion"),
            std::string::npos)
      << refused.status();
}

// --shm_spin_us=-1, the worker's default: an operation polls its rings
// only where this host's ranks of the ring each have a CPU; an explicit
// value is kept as it is.
TEST(OperationSpin, AutoPollsOnlyWhereThisHostsRanksHaveACpuEach) {
  const absl::Duration none = absl::ZeroDuration();
  EXPECT_EQ(WorkerOptions().shm_spin, kShmSpinAuto);
  // The ranks on a rank's host: its own host's count, or all where hosts
  // are not known.
  const std::vector<std::vector<int>> twos = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  const std::vector<std::vector<int>> fours = {{0, 1, 2, 3}, {4, 5, 6, 7}};
  EXPECT_EQ(RanksOnHost(5, 8, twos), 2);
  EXPECT_EQ(RanksOnHost(5, 8, fours), 4);
  EXPECT_EQ(RanksOnHost(1, 4, {}), 4);
  // Auto polls where they are no more than the CPUs (1 at least).
  EXPECT_EQ(OperationSpin(kShmSpinAuto, 2, 2), kShmAutoSpin);
  EXPECT_EQ(OperationSpin(kShmSpinAuto, 4, 2), none);
  EXPECT_EQ(OperationSpin(kShmSpinAuto, 4, 64), kShmAutoSpin);
  EXPECT_EQ(OperationSpin(kShmSpinAuto, 2, 0), none);
  // Explicit values win, whatever the CPUs.
  EXPECT_EQ(OperationSpin(absl::Microseconds(20), 64, 1),
            absl::Microseconds(20));
  EXPECT_EQ(OperationSpin(none, 2, 64), none);
  EXPECT_GE(CpusOfThisProcess(), 1);
}

// And where auto does not poll (ranks outnumber the CPUs), it yields the
// core between looks before it sleeps; an explicit value yields never.
TEST(OperationSpin, AutoYieldsWhereTheRanksOutnumberTheCpus) {
  const absl::Duration none = absl::ZeroDuration();
  EXPECT_EQ(OperationYield(kShmSpinAuto, 4, 2), kShmAutoYield);
  EXPECT_EQ(OperationYield(kShmSpinAuto, 2, 0), kShmAutoYield);
  EXPECT_EQ(OperationYield(kShmSpinAuto, 2, 2), none);
  EXPECT_EQ(OperationYield(kShmSpinAuto, 4, 64), none);
  EXPECT_EQ(OperationYield(absl::Microseconds(20), 64, 1), none);
  EXPECT_EQ(OperationYield(none, 8, 2), none);
  // Yielding counts the CPUs it may run on, not a quota (a yield with idle
  // cores spins the quota away): at least the CPUs spinning counts.
  EXPECT_GE(CpusOfAffinity(), CpusOfThisProcess());
  // Exactly one of the two, under auto, for the same count.
  for (int ranks : {1, 2, 3, 8}) {
    EXPECT_NE(OperationSpin(kShmSpinAuto, ranks, 2) > none,
              OperationYield(kShmSpinAuto, ranks, 2) > none)
        << ranks;
  }
}

// A container's CPU limit counts: auto must not poll with 4 ranks on a
// pod limited to 2 CPUs of a 64-CPU node.
TEST(OperationSpin, ACgroupsCpuQuotaLimitsTheCpusAutoCounts) {
  EXPECT_EQ(CpusOfQuota("max 100000\n"), std::nullopt);
  EXPECT_EQ(CpusOfQuota("200000 100000\n"), 2);
  EXPECT_EQ(CpusOfQuota("150000 100000"), 1);  // whole CPUs only
  EXPECT_EQ(CpusOfQuota("5000 100000"), 1);     // 1 at least
  EXPECT_EQ(CpusOfQuota("1000000000000000 1000"),
            std::numeric_limits<int>::max());  // no overflow
  EXPECT_EQ(CpusOfQuota("-1 100000"), std::nullopt);  // v1: no quota
  EXPECT_EQ(CpusOfQuota("garbage"), std::nullopt);
  EXPECT_EQ(CpusOfQuota(""), std::nullopt);

  char dir_template[] = "/tmp/halka_cgroup_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string fs = dir_template;
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  };
  // v2: the pod's level limits to 3 CPUs, the container's below it to
  // none of its own: the lowest on the way up counts.
  std::filesystem::create_directories(fs + "/kubepods/pod1/ctr");
  write(fs + "/kubepods/cpu.max", "max 100000\n");
  write(fs + "/kubepods/pod1/cpu.max", "300000 100000\n");
  write(fs + "/kubepods/pod1/ctr/cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuLimit(fs, "0::/kubepods/pod1/ctr\n"), 3);
  // A looser level below does not lift the pod's limit (the lowest, not
  // the first found on the way up).
  write(fs + "/kubepods/pod1/ctr/cpu.max", "400000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(fs, "0::/kubepods/pod1/ctr\n"), 3);
  // A tighter level below wins.
  write(fs + "/kubepods/pod1/ctr/cpu.max", "100000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(fs, "0::/kubepods/pod1/ctr\n"), 1);
  // Inside a cgroup namespace the process's path is "/": the mount's root.
  write(fs + "/cpu.max", "200000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(fs, "0::/\n"), 2);
  // No quota anywhere, or nothing to read.
  EXPECT_EQ(CgroupCpuLimit(fs, "0::/elsewhere\n"), 2);  // only the root's
  std::filesystem::remove(fs + "/cpu.max");
  EXPECT_EQ(CgroupCpuLimit(fs, "0::/elsewhere\n"), std::nullopt);
  EXPECT_EQ(CgroupCpuLimit(fs, "not a cgroup line\n"), std::nullopt);
  // v1: the cpu controller's own hierarchy.
  std::filesystem::create_directories(fs + "/cpu,cpuacct/docker/abc");
  write(fs + "/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000\n");
  write(fs + "/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(fs, "12:memory:/docker/abc\n"
                               "4:cpu,cpuacct:/docker/abc\n"), 2);
  write(fs + "/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(CgroupCpuLimit(fs, "4:cpu,cpuacct:/docker/abc\n"), std::nullopt);
  // Docker on v1 bind-mounts the container's cgroup at the hierarchy's
  // root: the host's path in /proc/self/cgroup names no directory here,
  // and the walk up reaches the root's quota.
  write(fs + "/cpu,cpuacct/cpu.cfs_quota_us", "200000\n");
  write(fs + "/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(fs, "4:cpu,cpuacct:/docker/other\n"), 2);
  // A hierarchy mounted under its controllers' names in another order.
  std::filesystem::create_directories(fs + "/cpuacct,cpu");
  write(fs + "/cpuacct,cpu/cpu.cfs_quota_us", "300000\n");
  write(fs + "/cpuacct,cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(fs, "3:cpuacct,cpu:/\n"), 3);
  // Hybrid: a v2 line without the cpu controller (no cpu.max on its way)
  // and the v1 cpu line, which counts.
  std::filesystem::create_directories(fs + "/unified/x");
  EXPECT_EQ(CgroupCpuLimit(fs, "0::/unified/x\n4:cpu,cpuacct:/\n"), 2);
  std::filesystem::remove_all(fs);
}

}  // namespace
}  // namespace halka
