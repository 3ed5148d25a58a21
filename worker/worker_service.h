// The SDK-facing gRPC API of a worker (halka.v1.Worker): Run (shared
// memory or a device tensor), RunInline (the tensor streamed in and out),
// GetInfo, GetRingHealth. A thin adapter over WorkerNode's public methods:
// it checks requests (op_request.h), moves bytes, and maps statuses.
//
// Threads: synchronous gRPC handlers; an operation blocks its handler
// thread, and WorkerNode serialises operations.
#ifndef HALKA_WORKER_WORKER_SERVICE_H_
#define HALKA_WORKER_WORKER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "halka/v1/worker.grpc.pb.h"
#include "worker/call_watchdog.h"
#include "core/shm_ring.h"
#include "worker/shm_cache.h"

namespace halka {

class WorkerNode;

// Bytes that inline uploads in flight hold, against a limit. Thread-safe.
class InlineBudget {
 public:
  explicit InlineBudget(uint64_t limit) : limit_(limit) {}
  // What one upload holds; released when it goes out of scope.
  class Charge {
   public:
    explicit Charge(InlineBudget& budget) : budget_(budget) {}
    ~Charge();
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;
    // RESOURCE_EXHAUSTED (and nothing charged) past the limit.
    absl::Status Add(uint64_t bytes);

   private:
    InlineBudget& budget_;
    uint64_t bytes_ = 0;
  };

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> in_use_{0};
};

class WorkerService final : public v1::Worker::Service {
 public:
  // `node` must outlive the service.
  WorkerService(WorkerNode* node, uint64_t max_inline_bytes)
      : node_(node), budget_(max_inline_bytes) {}

  grpc::Status Run(grpc::ServerContext* ctx, const v1::RunRequest* req,
                   v1::RunReply* reply) override;
  grpc::Status RunInline(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::InlineReply, v1::InlineRequest>* stream)
      override;
  // Runs a same-host client's session (proto/halka/v1/worker.proto) on
  // this handler's thread until the client ends it, the stream breaks or
  // StopSessions.
  grpc::Status Session(grpc::ServerContext* ctx, const v1::SessionOffer* offer,
                       grpc::ServerWriter<v1::SessionEvent>* writer) override;
  // Wakes every session and makes it end once its running operation (if
  // any) has answered; refuses new ones. Before the server shuts down.
  void StopSessions();
  // A same-process client's call (common/in_process.h): as Run, over
  // `data` (`bytes` long) instead of a shared-memory object; on the
  // caller's thread.
  absl::Status RunInProcess(const v1::RunRequest& req, void* data,
                            size_t bytes, v1::RunReply* reply);
  uint64_t in_process_calls() const { return in_process_calls_.load(); }
  int open_sessions() const { return sessions_.open(); }
  uint64_t session_calls() const { return session_calls_.load(); }
  grpc::Status GetInfo(grpc::ServerContext* ctx, const v1::InfoRequest* req,
                       v1::InfoReply* reply) override;
  grpc::Status GetRingHealth(grpc::ServerContext* ctx,
                             const v1::RingHealthRequest* req,
                             v1::RingHealth* reply) override;
  grpc::Status GetTimeline(grpc::ServerContext* ctx,
                           const v1::TimelineRequest* req,
                           v1::Timeline* reply) override;

 private:
  // Run's work, for Run and for session calls.
  grpc::Status RunOne(const v1::RunRequest& req, v1::RunReply* reply);
  // One session call: parses the record, runs it, answers on `replies`.
  // Errors (DATA_LOSS) end the session.
  absl::Status ServeSessionCall(const ShmRing::Record& rec,
                                ShmRing& requests, ShmRing& replies,
                                uint64_t* seq);

  // Reads an inline tensor: `msg` is the first message (already read).
  // The client half-closes after the last data message; data past
  // `bytes` in any message is INVALID_ARGUMENT; the upload ends by
  // `deadline` (DEADLINE_EXCEEDED naming what was missing; the client
  // sees its stream cancelled); memory is charged as data arrives.
  absl::StatusOr<std::vector<uint8_t>> Upload(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::InlineReply, v1::InlineRequest>* stream,
      v1::InlineRequest& msg, uint64_t bytes, bool may_be_empty,
      absl::Time deadline, InlineBudget::Charge& charge);

  WorkerNode* const node_;
  InlineBudget budget_;
  CallWatchdog watchdog_;
  // Each inline stream holds a whole tensor: bounded per connection and
  // in all.
  StreamLimiter inline_streams_{"inline operation", 16, 256};
  // Each session holds a handler thread for its life.
  StreamLimiter sessions_{"session", 16, 64};
  absl::Mutex sessions_mu_;
  std::set<std::shared_ptr<ShmRing>> session_rings_ ABSL_GUARDED_BY(sessions_mu_);
  std::atomic<uint64_t> session_calls_{0};
  std::atomic<uint64_t> in_process_calls_{0};
  // Set once, under sessions_mu_ (so no session registers after it);
  // read by every session before each request.
  std::atomic<bool> sessions_stopping_{false};
  ShmCache shm_;
};

}  // namespace halka

#endif  // HALKA_WORKER_WORKER_SERVICE_H_
