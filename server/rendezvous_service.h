// halka-rendezvous as a gRPC service: a thin adapter over RendezvousState.
#ifndef HALKA_SERVER_RENDEZVOUS_SERVICE_H_
#define HALKA_SERVER_RENDEZVOUS_SERVICE_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_util.h"
#include "grpcpp/grpcpp.h"
#include "halka/v1/rendezvous.grpc.pb.h"
#include "common/http_server.h"
#include "server/rendezvous_state.h"

namespace halka {

class RendezvousService final : public v1::Rendezvous::Service {
 public:
  explicit RendezvousService(RendezvousOptions options);
  ~RendezvousService() override;

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                    v1::JoinReply* reply) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx,
                         const v1::HeartbeatRequest* req,
                         v1::HeartbeatReply* reply) override;
  grpc::Status Leave(grpc::ServerContext* ctx, const v1::LeaveRequest* req,
                     v1::LeaveReply* reply) override;
  grpc::Status GetRingHealth(grpc::ServerContext* ctx,
                             const v1::RingHealthRequest* req,
                             v1::RingHealth* reply) override;

  grpc::Status RegisterServer(grpc::ServerContext* ctx,
                              const v1::RegisterServerRequest* req,
                              v1::RegisterServerReply* reply) override;
  grpc::Status LookupServers(grpc::ServerContext* ctx,
                             const v1::LookupServersRequest* req,
                             v1::LookupServersReply* reply) override;
  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::Membership>* writer) override;
  grpc::Status ReportFailure(grpc::ServerContext* ctx,
                             const v1::ReportFailureRequest* req,
                             v1::ReportFailureReply* reply) override;

  // Wakes blocked joins and stops the sweeper; called before server
  // shutdown so that Shutdown never waits on a Join.
  void Stop();

  // GetRingHealth without a call (for /metrics and the ring page).
  grpc::Status BuildHealth(const v1::RingHealthRequest* req,
                           v1::RingHealth* reply);
  std::vector<std::string> JobIds();

 private:
  void SweepLoop();
  // Logs what the state changed and wakes watchers.
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A worker watches once; each Watch holds a server thread.
  StreamLimiter watches_{"watch", 8, 4096};
  absl::Mutex mu_;
  RendezvousState state_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // bumps on every change
  absl::Notification stop_;
  std::thread sweeper_;
};

// A running rendezvous server (used by the daemon and by LocalCluster).
class RendezvousServer {
 public:
  // `listen` like "0.0.0.0:7100" or "127.0.0.1:0" (port 0 picks one).
  // `metrics_port` > 0 also serves HTTP on the listen host (0.0.0.0 for
  // a wildcard): /metrics (Prometheus), / (the live ring page),
  // /api/jobs and /api/health?job=J (RingHealth as JSON); -1 picks a free
  // port; 0 serves none.
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(
      const std::string& listen, RendezvousOptions options = {},
      int metrics_port = 0);
  ~RendezvousServer();

  // host:port clients can dial (the picked port for port 0).
  const std::string& address() const { return address_; }
  void Shutdown();
  void Wait() { server_->Wait(); }
  // "host:port" of the HTTP server; "" when none.
  std::string metrics_address() const;

 private:
  RendezvousServer() = default;
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  std::string address_;
  bool shut_down_ = false;
};

}  // namespace halka

#endif  // HALKA_SERVER_RENDEZVOUS_SERVICE_H_
