// One halka worker: joins its job at the rendezvous, links to its ring
// peers, serves the SDK-facing Worker API and the Peer links on one gRPC
// server, and heartbeats with its telemetry.
#ifndef HALKA_WORKER_WORKER_NODE_H_
#define HALKA_WORKER_WORKER_NODE_H_

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "halka/v1/rendezvous.grpc.pb.h"
#include "halka/v1/worker.grpc.pb.h"
#include "common/http_server.h"
#include "worker/core/communicator.h"

namespace halka {

class GrpcTransport;
class PeerService;
class ShmCache;
class DeviceContext;
class OpBuffer;

struct WorkerOptions {
  std::string job_id = "default";
  std::string worker_id;          // default: hostname-pid
  int world_size = 1;
  // Elastic jobs: the ring runs with any size in [min, max] and re-forms
  // without the lost member. Both 0: a fixed job of world_size.
  int min_world_size = 0;
  int max_world_size = 0;
  int requested_rank = -1;        // -1: assigned by the rendezvous
  std::string rendezvous;         // host:port
  std::string listen = "127.0.0.1:0";  // peer links and TCP API
  std::string advertise;          // host:port peers dial; default from listen
  std::string unix_socket;        // optional extra API endpoint
  size_t chunk_bytes = size_t{1} << 20;
  absl::Duration op_timeout = absl::Seconds(60);
  absl::Duration join_timeout = absl::Seconds(120);
  uint64_t max_op_bytes = uint64_t{16} << 30;
  std::string device = "cpu";   // reported to the rendezvous
  // CUDA device for device tensors: -1 picks device 0 when one is usable
  // (and falls back to the CPU with one log line when not); >= 0 demands it.
  int cuda_device = -1;
  // What an all-reduce that asks for AUTO runs.
  Algorithm default_algorithm = Algorithm::kAuto;
  // FOR TESTS ONLY: sleep this long per received data chunk while reducing,
  // to make this rank a straggler on purpose.
  absl::Duration test_reduce_delay = absl::ZeroDuration();
  // > 0: serve Prometheus /metrics over HTTP on this port (on the listen
  // host) once joined; -1 picks a free port; 0: off.
  int metrics_port = 0;
};

class WorkerNode {
 public:
  // Starts the server, then joins (blocking until the job forms or
  // join_timeout passes). Errors: UNAVAILABLE (cannot listen or reach the
  // rendezvous), DEADLINE_EXCEEDED (the job did not form; names who is
  // missing), and the rendezvous's join errors.
  static absl::StatusOr<std::unique_ptr<WorkerNode>> Start(WorkerOptions options);

  // Two phases, for callers that must learn the address before joining
  // (LocalCluster): Create binds and serves; Join joins.
  static absl::StatusOr<std::unique_ptr<WorkerNode>> Create(
      WorkerOptions options);
  absl::Status Join();

  ~WorkerNode();

  // Leaves the job (best effort, bounded) and stops serving; well under a
  // second. leave=false skips the Leave, as if the process had died.
  void Shutdown(bool leave = true);
  void Wait();

  // Runs one collective on `data` (host memory). Thread-safe; operations
  // are serialised.
  absl::StatusOr<OpResult> Execute(const v1::OpSpec& spec, void* data);
  // The same on a client's CUDA tensor. FAILED_PRECONDITION without a GPU.
  absl::StatusOr<OpResult> ExecuteOnDevice(const v1::OpSpec& spec,
                                           const v1::DeviceTensor& tensor);

  const std::string& address() const { return address_; }
  int rank() const;
  int world_size() const;
  Communicator* communicator();
  const WorkerOptions& options() const { return options_; }
  int open_peer_streams() const;
  // "host:port" of /metrics; "" when off.
  std::string metrics_address() const;
  // The Prometheus text this worker serves at /metrics.
  std::string MetricsText();

 private:
  explicit WorkerNode(WorkerOptions options);
  class Service;
  // One generation of the ring: its members, inbox, links and engine.
  struct Ring {
    uint64_t generation = 0;
    int rank = 0;
    int world = 1;
    std::vector<PeerInfo> members;
    std::shared_ptr<Inbox> inbox;
    std::unique_ptr<GrpcTransport> transport;
    std::unique_ptr<Communicator> comm;
    // This worker entered the ring new, taking the others' numbering:
    // calls made before that moment belong to no operation of this ring.
    bool adopted = false;
    uint64_t epoch = 0;          // epoch_ when the ring was built
    absl::Time built;            // when this worker learned it was admitted
    ~Ring();
  };
  struct Report {
    uint64_t generation;
    std::string suspect;
    std::string reason;
  };

  // Joins (or joins again), retrying while the rendezvous is unreachable
  // or still holds this worker's previous process, until `deadline`.
  absl::Status JoinOnce(absl::Time deadline, v1::JoinReply* reply);
  // A newer membership (from Join, Watch or a heartbeat): records it and
  // aborts the running operation when it cannot finish (a member was lost)
  // or has not started moving data (it is then run again on the new ring).
  void OnMembership(const v1::Membership& m);
  // Fetches the membership at once when a peer already opened links of a
  // newer generation than the newest update this worker received.
  void CatchUp();
  // The ring for the newest membership, built on first use after a change
  // (between operations, never during one). `retry_seq` > 0: the first
  // operation of a new ring re-runs that sequence number. Errors:
  // UNAVAILABLE when the job is below its minimum or this worker is not in
  // the ring (it is joining again).
  // `epoch` and `issued` describe the call (the epoch_ at its arrival,
  // when its caller issued it); a call older than a ring this worker
  // re-joined fails with ABORTED.
  // `seq`: the number the call will run as on a ring this worker continues
  // on (ignored where it adopts the others' numbering); `retry`: the call
  // runs again after the membership changed under it; `numbered`: the
  // generation of the caller's current ring if that ring holds a call
  // number, else 0 (read by the caller: a communicator's lock is never
  // taken under mu_).
  absl::StatusOr<std::shared_ptr<Ring>> AcquireRing(uint64_t seq, bool retry,
                                                    uint64_t epoch,
                                                    absl::Time issued,
                                                    uint64_t numbered);
  std::shared_ptr<Ring> CurrentRing() const;
  absl::StatusOr<std::shared_ptr<Inbox>> InboxFor(uint64_t generation);
  void OnLinkFailed(uint64_t generation, int peer, const absl::Status& status);
  absl::StatusOr<OpResult> RunOn(Ring& ring, const v1::OpSpec& spec,
                                 OpBuffer& buffer, absl::Duration timeout);
  absl::StatusOr<OpResult> Run(const v1::OpSpec& spec, OpBuffer& buffer);

  void HeartbeatLoop(absl::Duration interval);
  void WatchLoop();
  // Sends broken-link reports and joins again after this worker was lost.
  void BackgroundLoop();
  // Looks up the job's parameter-server shards (waiting for them, bounded
  // by `deadline`) and hands them to the ring.
  absl::Status EnsureServers(absl::Time deadline);
  v1::WorkerTelemetry CollectTelemetry();
  // Registers a call so that Shutdown can cancel it; false when stopping.
  bool Track(grpc::ClientContext* ctx);
  void Untrack(grpc::ClientContext* ctx);

  WorkerOptions options_;
  const uint64_t incarnation_;
  std::string address_;
  std::unique_ptr<PeerService> peer_service_;
  std::unique_ptr<Service> api_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<v1::Rendezvous::Stub> rendezvous_;
  std::unique_ptr<DeviceContext> device_;  // null: host tensors only

  mutable absl::Mutex mu_;
  bool is_joined_ ABSL_GUARDED_BY(mu_) = false;
  v1::Membership latest_ ABSL_GUARDED_BY(mu_);  // the newest generation
  std::shared_ptr<Ring> ring_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Ring>> retired_ ABSL_GUARDED_BY(mu_);
  // Inboxes of generations peers switched to before this worker did.
  std::map<uint64_t, std::shared_ptr<Inbox>> early_ ABSL_GUARDED_BY(mu_);
  bool rejoin_ ABSL_GUARDED_BY(mu_) = false;
  bool claim_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Report> reports_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, int>> reported_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<PeerInfo> servers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Bumped whenever this worker learns it is not in the newest ring.
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // When this worker learned it was admitted (new) into the newest ring.
  absl::Time admitted_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  absl::Mutex run_mu_;  // one operation at a time, across generations
  // The caller's calls are numbered one by one, failed or not, so that
  // every rank numbers the i-th call alike (0: adopt the ring's number).
  uint64_t next_seq_ ABSL_GUARDED_BY(run_mu_) = 1;
  absl::Mutex servers_mu_;
  bool have_servers_ ABSL_GUARDED_BY(servers_mu_) = false;

  absl::Notification stop_;
  std::thread heartbeat_;
  std::thread watch_;
  std::thread background_;
  bool shut_down_ = false;
};

}  // namespace halka

#endif  // HALKA_WORKER_WORKER_NODE_H_
