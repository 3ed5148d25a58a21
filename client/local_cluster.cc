#include "halka/local_cluster.h"

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "server/parameter_server.h"
#include "server/rendezvous_service.h"
#include "worker/worker_node.h"

namespace halka {

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    Options options) {
  if (options.workers < 1 || options.workers > 64) {
    return absl::InvalidArgumentError("local cluster: workers must be 1..64");
  }
  TuneProcessForStreaming();
  // The workers get this cluster's configuration as their own
  // (WorkerOptions::security); the rendezvous and shards, the process's.
  std::optional<LinkModel> link_model;
  const bool probe_links = options.link_model == "probe";
  if (!options.link_model.empty() && !probe_links) {
    absl::StatusOr<LinkModel> m = ParseLinkModel(options.link_model);
    if (!m.ok()) return m.status();
    link_model = *m;
  }
  std::optional<SecurityConfig> security;
  if (!options.tls_cert.empty() || !options.tls_key.empty() ||
      !options.tls_ca.empty() || !options.job_token.empty()) {
    SecurityConfig sec;
    sec.tls_cert = options.tls_cert;
    sec.tls_key = options.tls_key;
    sec.tls_ca = options.tls_ca;
    sec.job_id = options.job_id;
    sec.job_token = options.job_token;
    security = sec;
    SetSecurityConfig(std::move(sec));
  }
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  RendezvousOptions ro;
  ro.heartbeat_interval = options.heartbeat_interval;
  ro.heartbeat_timeout = options.heartbeat_timeout;
  ro.link_model = link_model;
  ro.probe_links = probe_links;
  auto rv = RendezvousServer::Start("127.0.0.1:0", ro,
                                    options.metrics ? -1 : 0);
  if (!rv.ok()) return rv.status();
  c->rendezvous_ = std::move(*rv);
  for (int k = 0; k < options.ps_shards; ++k) {
    PsOptions po;
    po.job_id = options.job_id;
    po.shard = k;
    po.shards = options.ps_shards;
    po.rendezvous = c->rendezvous_->address();
    auto ps = ParameterServerNode::Start(po);
    if (!ps.ok()) return ps.status();
    c->ps_.push_back(std::move(*ps));
  }
  std::vector<std::unique_ptr<WorkerNode>> nodes;
  for (int i = 0; i < options.workers; ++i) {
    WorkerOptions wo;
    wo.job_id = options.job_id;
    wo.worker_id = absl::StrCat("worker-", i);
    wo.world_size = options.workers;
    wo.requested_rank = i;
    wo.rendezvous = c->rendezvous_->address();
    wo.listen = "127.0.0.1:0";
    wo.chunk_bytes = options.chunk_bytes;
    wo.shm_links = options.shm_links;
    // Auto counts every worker of the cluster as this machine's, also
    // where they name several hosts (--hosts), which the workers' own rule
    // would count apart.
    wo.shm_spin = options.shm_spin;
    if (options.shm_spin == kShmSpinAuto) wo.machine_ranks = options.workers;
    wo.wire_links = options.wire_links;
    wo.wire_landing = options.wire_landing;
    wo.wire_congestion = options.wire_congestion;
    wo.wire_tap = options.wire_tap;
    wo.op_timeout = options.op_timeout;
    wo.join_timeout = absl::Seconds(30);
    if (i == options.slow_rank) wo.test_reduce_delay = options.test_reduce_delay;
    if (static_cast<size_t>(i) < options.hosts.size()) {
      wo.host_id = options.hosts[static_cast<size_t>(i)];
    }
    if (options.metrics) wo.metrics_port = -1;
    wo.security = security;  // unset: the process's, captured by Create
    auto node = WorkerNode::Create(wo);
    if (!node.ok()) return node.status();
    nodes.push_back(std::move(*node));
  }
  std::vector<absl::Status> joined(nodes.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < nodes.size(); ++i) {
    threads.emplace_back([&, i] { joined[i] = nodes[i]->Join(); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : joined) {
    if (!s.ok()) return s;
  }
  c->workers_.resize(nodes.size());
  for (auto& n : nodes) {
    const int r = n->rank();
    c->workers_[static_cast<size_t>(r)] = std::move(n);
  }
  return c;
}

LocalCluster::~LocalCluster() {
  // Workers first, in parallel: each leaves and stops within a second.
  std::vector<std::thread> threads;
  for (auto& w : workers_) {
    if (w) threads.emplace_back([&w] { w.reset(); });
  }
  for (auto& t : threads) t.join();
  ps_.clear();
  rendezvous_.reset();
}

ParameterServerNode* LocalCluster::ps(int shard) const {
  return ps_[static_cast<size_t>(shard)].get();
}

void LocalCluster::KillPs(int shard) {
  ps_[static_cast<size_t>(shard)]->Shutdown(absl::ZeroDuration());
  ps_[static_cast<size_t>(shard)].reset();
}

const std::string& LocalCluster::rendezvous_address() const {
  return rendezvous_->address();
}

const std::string& LocalCluster::worker_address(int rank) const {
  return workers_[static_cast<size_t>(rank)]->address();
}

std::string LocalCluster::metrics_address(int rank) const {
  if (rank < 0) return rendezvous_->metrics_address();
  return workers_[static_cast<size_t>(rank)]->metrics_address();
}

WorkerNode* LocalCluster::worker(int rank) const {
  return workers_[static_cast<size_t>(rank)].get();
}

absl::StatusOr<std::unique_ptr<Client>> LocalCluster::Connect(
    int rank, Client::Options options) const {
  if (rank < 0 || rank >= size() || !workers_[static_cast<size_t>(rank)]) {
    return absl::InvalidArgumentError(absl::StrCat("no live rank ", rank));
  }
  return Client::Connect(worker_address(rank), options);
}

void LocalCluster::KillWorker(int rank) {
  workers_[static_cast<size_t>(rank)]->Shutdown(/*leave=*/false);
  workers_[static_cast<size_t>(rank)].reset();
}

}  // namespace halka
