// One halka worker: joins its job at the rendezvous, links to its ring
// peers, serves the SDK-facing Worker API and the Peer links on one gRPC
// server, and heartbeats with its telemetry.
#ifndef HALKA_WORKER_WORKER_NODE_H_
#define HALKA_WORKER_WORKER_NODE_H_

#include <map>
#include <memory>
#include <string>
#include <thread>

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
  void HeartbeatLoop(absl::Duration interval);
  // Looks up the job's parameter-server shards (waiting for them, bounded
  // by `deadline`) and hands them to the communicator and the transport.
  absl::Status EnsureServers(absl::Time deadline);
  v1::WorkerTelemetry CollectTelemetry();

  WorkerOptions options_;
  std::string address_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<PeerService> peer_service_;
  std::unique_ptr<Service> api_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<v1::Rendezvous::Stub> rendezvous_;

  mutable absl::Mutex mu_;
  v1::JoinReply joined_ ABSL_GUARDED_BY(mu_);
  bool is_joined_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<GrpcTransport> transport_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<DeviceContext> device_;  // null: host tensors only
  absl::StatusOr<OpResult> Run(const v1::OpSpec& spec, OpBuffer& buffer);
  absl::Mutex servers_mu_;
  bool have_servers_ ABSL_GUARDED_BY(servers_mu_) = false;

  absl::Notification stop_;
  std::thread heartbeat_;
  bool shut_down_ = false;
};

}  // namespace halka

#endif  // HALKA_WORKER_WORKER_NODE_H_
