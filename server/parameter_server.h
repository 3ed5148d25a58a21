// halka-ps: a central parameter server (one shard of it), for comparing the
// ring with the obvious design on the same wire, frames and reducers.
//
// Every worker streams its part of the buffer for this shard in; once every
// rank's chunk at an offset is in, the server reduces the G copies in rank
// order (so results are deterministic), divides for AVG, and streams the
// result chunk back to every worker. The algorithm and its errors live in
// PsState (server/ps_state.h); the service below only checks each stream's
// metadata, decodes frames, feeds them to the state and writes what it
// returns.
// Thread-safety: the service is driven by gRPC's callback threads; one
// mutex guards the state and the stream table, and frames are queued on the
// streams under it, so every rank sees them in the order the state made
// them. Lock order: the service's mutex, then a stream's.
#ifndef HALKA_SERVER_PARAMETER_SERVER_H_
#define HALKA_SERVER_PARAMETER_SERVER_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_util.h"
#include "grpcpp/grpcpp.h"
#include "halka/v1/ps.grpc.pb.h"
#include "halka/v1/rendezvous.grpc.pb.h"
#include "server/ps_state.h"
#include "core/frame.h"

namespace halka {

class ParameterServerService final
    : public v1::ParameterServer::WithRawCallbackMethod_Reduce<
          v1::ParameterServer::Service> {
 public:
  ParameterServerService(std::string job_id, int shard, int shards);
  ~ParameterServerService() override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Reduce(
      grpc::CallbackServerContext* context) override;

  PsStats stats() const;

 private:
  class Stream;

  void OnFrame(int rank, int world, InFrame frame);
  void OnStreamClosed(int rank, Stream* stream);
  // Hands each frame the state returned to its ranks' streams, in order.
  void Dispatch(const std::vector<PsSend>& sends)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_id_;
  mutable absl::Mutex mu_;
  std::map<int, Stream*> streams_ ABSL_GUARDED_BY(mu_);  // by rank
  // One stream per worker of the job (a newer one replaces an older one).
  StreamLimiter limiter_{"parameter-server", 64, 4096};
  PsState state_ ABSL_GUARDED_BY(mu_);
};

struct PsOptions {
  std::string job_id = "default";
  std::string server_id;  // default: ps-<shard>
  int shard = 0;
  int shards = 1;
  std::string listen = "127.0.0.1:0";
  std::string advertise;
  std::string rendezvous;
  absl::Duration register_interval = absl::Seconds(2);
};

// A running shard: serves, and (re-)registers with the rendezvous.
class ParameterServerNode {
 public:
  static absl::StatusOr<std::unique_ptr<ParameterServerNode>> Start(
      PsOptions options);
  ~ParameterServerNode();
  // Stops serving; in-flight streams get `grace` to finish (zero: cancelled
  // at once, as if the process died).
  void Shutdown(absl::Duration grace = absl::Milliseconds(300));
  void Wait() { server_->Wait(); }
  const std::string& address() const { return address_; }
  PsStats stats() const { return service_->stats(); }

 private:
  ParameterServerNode() = default;
  void RegisterLoop();
  PsOptions options_;
  std::string address_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Rendezvous::Stub> rendezvous_;
  absl::Notification stop_;
  std::thread registrar_;
  bool shut_down_ = false;
};

}  // namespace halka

#endif  // HALKA_SERVER_PARAMETER_SERVER_H_
