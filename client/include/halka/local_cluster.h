// An embedded halka cluster: a rendezvous and N workers in this process,
// on loopback, with no setup. For the demo, benchmarks and tests.
//
//   auto cluster = halka::LocalCluster::Start({.workers = 4}).value();
//   auto client = cluster->Connect(0).value();  // a Client of rank 0's worker
#ifndef HALKA_CLIENT_LOCAL_CLUSTER_H_
#define HALKA_CLIENT_LOCAL_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "halka/client.h"

namespace halka {

class WorkerNode;
class RendezvousServer;
class ParameterServerNode;

class LocalCluster {
 public:
  struct Options {
    int workers = 4;
    std::string job_id = "local";
    size_t chunk_bytes = size_t{1} << 20;
    // Workers' peer links through shared memory (all run in this process,
    // so on this host); false: gRPC over loopback TCP.
    bool shm_links = true;
    // Each worker's WorkerOptions::shm_spin (its own: the rings of its
    // links and SDK sessions; a client's replies ring polls as long as its
    // Client::Options::shm_spin says). -1 us: auto, as a worker's, with
    // every worker of this cluster counted as this machine's whatever
    // hosts they name (their operations poll 50 us where the cluster's
    // workers are no more than this process's CPUs).
    absl::Duration shm_spin = absl::ZeroDuration();
    // Links that are not same-host on a TCP connection of their own.
    bool wire_links = true;
    // WorkerOptions::wire_landing.
    bool wire_landing = true;
    // WorkerOptions::wire_tap.
    bool wire_tap = true;
    // WorkerOptions::wire_congestion (system, auto or a name).
    std::string wire_congestion = "system";
    absl::Duration op_timeout = kDefaultOpTimeout;
    absl::Duration heartbeat_interval = absl::Milliseconds(500);
    absl::Duration heartbeat_timeout = absl::Seconds(5);
    // Parameter-server shards to start as well (for Algorithm::kParameterServer).
    int ps_shards = 0;
    // FOR TESTS ONLY: rank `slow_rank` sleeps test_reduce_delay per
    // received data chunk while reducing (a straggler on purpose).
    int slow_rank = -1;
    absl::Duration test_reduce_delay = absl::ZeroDuration();
    // The host each rank's worker names (WorkerOptions::host_id), e.g.
    // {"A", "B", "A", "B"} for ranks interleaved over two hosts: the ring
    // then passes A's ranks, then B's. Empty: this host, for every rank.
    std::vector<std::string> hosts;
    // The job's link model (halka-rendezvous --link_model, e.g.
    // "local=5:8,net=60:1.2"; "probe": the members measure it on their
    // ring links, docs/scaling.md); "": none (auto counts). Start fails
    // INVALID_ARGUMENT on text ParseLinkModel refuses.
    std::string link_model;
    // Serve HTTP (/metrics; on the rendezvous also the ring page) on free
    // ports; see metrics_address().
    bool metrics = false;
    // Transport security (see common/security.h). When any of these is set
    // it becomes this process's security configuration, with job_id, before
    // anything starts: TLS with tls_cert/tls_key (PEM files), mutual TLS
    // with tls_ca as well, and job_token on every call and checked by every
    // server. All empty: plaintext on loopback, no token, and the process's
    // configuration is left as it is.
    std::string tls_cert;
    std::string tls_key;
    std::string tls_ca;
    std::string job_token;
  };

  // Starts everything and waits until the ring has formed.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(Options options);
  ~LocalCluster();

  int size() const { return static_cast<int>(workers_.size()); }
  const std::string& rendezvous_address() const;
  // The worker whose rank is `rank`.
  const std::string& worker_address(int rank) const;
  // host:port of the HTTP server of rank's worker, or of the rendezvous
  // (rank -1); "" without Options::metrics.
  std::string metrics_address(int rank) const;
  absl::StatusOr<std::unique_ptr<Client>> Connect(
      int rank, Client::Options options = Client::Options()) const;

  // Stops rank's worker abruptly (no Leave): its peers see broken links.
  void KillWorker(int rank);
  // For tests and the leak check.
  WorkerNode* worker(int rank) const;
  ParameterServerNode* ps(int shard) const;
  // Stops a parameter-server shard abruptly.
  void KillPs(int shard);

 private:
  LocalCluster() = default;
  std::unique_ptr<RendezvousServer> rendezvous_;
  std::vector<std::unique_ptr<WorkerNode>> workers_;  // by rank
  std::vector<std::unique_ptr<ParameterServerNode>> ps_;  // by shard
};

}  // namespace halka

#endif  // HALKA_CLIENT_LOCAL_CLUSTER_H_
