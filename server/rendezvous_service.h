// halka-rendezvous as a gRPC service: a thin adapter over RendezvousState.
#ifndef HALKA_SERVER_RENDEZVOUS_SERVICE_H_
#define HALKA_SERVER_RENDEZVOUS_SERVICE_H_

#include <deque>
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
#include "halka/v1/rendezvous.grpc.pb.h"
#include "common/http_server.h"
#include "server/rendezvous_state.h"

namespace halka {

// Join, Watch and Heartbeat use gRPC's callback API: a Join blocked until
// its ring forms, and a Watch between two changes, hold no thread (a job of
// 4,096 members has 4,096 of each). They are raw methods so that one
// serialised view per generation is shared by every reply that carries it. The other
// methods are synchronous (short, or a probe that blocks for a second).
using RendezvousBase = v1::Rendezvous::WithRawCallbackMethod_Join<
    v1::Rendezvous::WithRawCallbackMethod_Watch<
        v1::Rendezvous::WithRawCallbackMethod_Heartbeat<
            v1::Rendezvous::Service>>>;

class RendezvousService final : public RendezvousBase {
 public:
  explicit RendezvousService(RendezvousOptions options);
  ~RendezvousService() override;

  // Request: a JoinRequest; reply: a JoinReply.
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* reply) override;
  // Request: a HeartbeatRequest; reply: a HeartbeatReply.
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* reply) override;
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
  // Request: a WatchRequest; messages: Membership.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Watch(
      grpc::CallbackServerContext* ctx,
      const grpc::ByteBuffer* request) override;
  grpc::Status ReportFailure(grpc::ServerContext* ctx,
                             const v1::ReportFailureRequest* req,
                             v1::ReportFailureReply* reply) override;

  // Answers blocked joins and ends watches (UNAVAILABLE) and stops the
  // sweeper; called before server shutdown so that Shutdown never waits on
  // a Join.
  void Stop();

  // GetRingHealth without a call (for /metrics and the ring page).
  grpc::Status BuildHealth(const v1::RingHealthRequest* req,
                           v1::RingHealth* reply);
  std::vector<std::string> JobIds();

 private:
  class JoinCall;
  class WatchCall;
  // What a change owes the calls that wait on it, handed over outside the
  // lock (a reactor's Finish or StartWrite may run its callbacks inline).
  struct Outbox {
    struct Answer {
      JoinCall* call;
      grpc::Status status;
      grpc::Slice reply;  // the generation's JoinReply, shared
      int rank = -1;
    };
    struct Update {
      std::shared_ptr<WatchCall> call;
      uint64_t generation = 0;
      grpc::Slice membership;  // whole, shared
      uint64_t base = 0;       // `delta` is against this generation
      grpc::Slice delta;       // shared by the watchers at `base`; may be empty
    };
    struct End {
      std::shared_ptr<WatchCall> call;
      grpc::Status status;
    };
    std::vector<Answer> answers;
    std::vector<Update> updates;
    std::vector<End> ends;
  };

  void SweepLoop();
  // Logs what the state changed, and queues the answers and watch updates
  // it owes; Deliver() (without the lock) hands them over.
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver() ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the paced Join answers that the window has room for (all when
  // stopping) into `answers`.
  void ReleasePacedLocked(absl::Time now, std::vector<Outbox::Answer>* answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The JoinReply of the job's running ring without a rank (one per
  // generation, cached); `compact`: with membership_deflate instead of
  // membership.
  grpc::Slice JoinReplyOf(const std::string& job_id, const MembershipView& v,
                          bool compact) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's Membership as a watcher receives it (one per generation,
  // cached; ages as of the change).
  grpc::Slice MembershipOf(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps the membership of a generation the job's members were handed
  // (the last few), for the deltas against it.
  void Remember(const std::string& job_id, const v1::Membership& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's current Membership as a delta against generation `base`
  // (serialised once per base and generation); empty when `base` is no
  // longer kept.
  grpc::Slice DeltaOf(const std::string& job_id, uint64_t base)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The update of the job's current generation for one watcher: the whole
  // membership and, for a watcher that takes deltas, the delta against
  // the generation it holds.
  Outbox::Update UpdateFor(const std::string& job_id,
                           const std::shared_ptr<WatchCall>& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker has a Watch stream of the job that was handed `generation`.
  bool WatchHas(const std::string& job_id, const std::string& worker_id,
                uint64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins whose wait ran out.
  void ExpireJoins(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A blocked Join's call was cancelled: withdraw it.
  void CancelJoin(JoinCall* call) ABSL_LOCKS_EXCLUDED(mu_);
  void DropWatch(WatchCall* call) ABSL_LOCKS_EXCLUDED(mu_);
  // A Join's answer was sent (its call completed).
  void JoinReturned(const JoinArgs& args) ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status HeartbeatLocked(const v1::HeartbeatRequest& req,
                               const std::string& telemetry,
                               v1::HeartbeatReply* reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A worker watches once; each Watch is a stream (no thread).
  StreamLimiter watches_{"watch", 8, 4096};
  absl::Mutex mu_;
  RendezvousState state_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // bumps on every change
  // Blocked Joins and open Watches, by job; the generation they were last
  // told about; the cached JoinReply and Membership per job (dropped with
  // the job's last listener; a Join answered at once caches too, so the
  // cache is keyed by the job's epoch as well).
  std::map<std::string, std::vector<JoinCall*>> joins_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::shared_ptr<WatchCall>>> watchers_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> published_ ABSL_GUARDED_BY(mu_);
  // Open Watch streams by (job, worker id).
  std::map<std::pair<std::string, std::string>, int> watching_
      ABSL_GUARDED_BY(mu_);
  struct Cached {
    uint64_t epoch = 0;  // RendezvousState::JobEpoch
    uint64_t generation = 0;
    grpc::Slice bytes;
  };
  std::map<std::string, Cached> join_replies_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Cached> compact_join_replies_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Cached> memberships_ ABSL_GUARDED_BY(mu_);
  // Per job, the memberships of its last generations (newest last) and
  // the current generation's deltas by base generation.
  struct History {
    uint64_t epoch = 0;
    std::vector<v1::Membership> kept;
    uint64_t deltas_of = 0;  // the generation `deltas` lead to
    std::map<uint64_t, grpc::Slice> deltas;
  };
  std::map<std::string, History> history_ ABSL_GUARDED_BY(mu_);
  Outbox outbox_ ABSL_GUARDED_BY(mu_);
  // Join answers waiting for room in the window (options
  // join_answer_window), and the members answered but not yet heard from,
  // by (job, worker id), with when they were answered.
  std::deque<Outbox::Answer> paced_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, absl::Time> unacked_
      ABSL_GUARDED_BY(mu_);
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
