// A Client's session with a worker on its own host (Worker.Session in
// proto/halka/v1/worker.proto): its Run requests travel through two
// shared-memory rings (core/shm_ring.h), a futex wake-up each way,
// instead of one gRPC call each.
//
// Why: a unary call costs a client thread, the worker's poller and a
// handler thread hand-offs both ways; for small tensors that round trip is
// most of an operation (4 KiB at G = 4 on two cores: about 400 of 700 us,
// docs/performance.md). A session's thread on the worker sleeps on the
// requests ring and runs each request as Run would, then writes what Run
// would have answered (SessionResult) on the replies ring.
//
// Liveness: the session's gRPC stream stays open without messages. When
// it ends (the worker stops or dies, the connection breaks), the reader
// thread closes both rings, which wakes a call waiting for its answer: the
// call fails with the stream's status, never hangs. Closing the rings ends
// the session on the worker's side at once.
//
// Thread-safety: Run from one thread at a time (the Client holds a lock);
// the destructor from any thread once Run has returned.
#ifndef HALKA_CLIENT_SHM_SESSION_H_
#define HALKA_CLIENT_SHM_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "halka/v1/worker.grpc.pb.h"
#include "core/shm_ring.h"

namespace halka {

class ShmSession {
 public:
  // Creates the rings, offers them and waits up to `timeout` for the
  // worker's answer. Errors: what the worker said (UNIMPLEMENTED: a worker
  // without sessions; FAILED_PRECONDITION or NOT_FOUND: it cannot map the
  // rings; RESOURCE_EXHAUSTED: too many sessions), UNAVAILABLE (not
  // reachable now), DEADLINE_EXCEEDED (no answer in time), or the ring's
  // creation error. `spin`: how long Run polls the replies ring before it
  // sleeps (ShmRing::set_spin_before_sleep).
  static absl::StatusOr<std::unique_ptr<ShmSession>> Open(
      v1::Worker::Stub& stub, absl::Duration timeout,
      absl::Duration spin = absl::ZeroDuration());
  // Ends the session: closes the rings, cancels the stream, joins.
  ~ShmSession();
  ShmSession(const ShmSession&) = delete;
  ShmSession& operator=(const ShmSession&) = delete;

  // Runs `req` as Worker.Run would, waiting for the answer until
  // `deadline`. `*sent` is false when the request never reached the worker
  // (the caller may then call Run instead). The operation's own errors come
  // back as Run's; any other error (the session ended, no answer by the
  // deadline, a corrupt reply) also makes usable() false.
  absl::StatusOr<v1::RunReply> Run(const v1::RunRequest& req,
                                   absl::Time deadline, bool* sent);
  bool usable() const { return !broken_; }

 private:
  ShmSession() = default;
  void ReadLoop();
  // Why the session ended (waits briefly for the reader to know).
  absl::Status EndStatus();

  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::SessionEvent>> stream_;
  std::shared_ptr<ShmRing> requests_;
  std::shared_ptr<ShmRing> replies_;
  std::thread reader_;
  uint64_t seq_ = 0;
  bool broken_ = false;

  absl::Mutex mu_;
  bool opened_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_ ABSL_GUARDED_BY(mu_);
};

// A Client's one session: opened at the first call that can use it; a
// broken one is dropped and the next call opens another. Thread-safe.
class SessionSlot {
 public:
  // How long opening may take (at most the call's deadline), and how soon
  // a worker that was not up or was busy is asked again (one that refused
  // for good, e.g. UNIMPLEMENTED or another /dev/shm, never is).
  static constexpr absl::Duration kOpenTimeout = absl::Seconds(5);
  static constexpr absl::Duration kRetryAfter = absl::Seconds(10);

  // `spin`: the client's Options::shm_spin, for every session it opens.
  explicit SessionSlot(absl::Duration spin = absl::ZeroDuration())
      : spin_(spin) {}

  // Runs `req` through the session when one can take it now; nullopt when
  // the request was not sent (the caller uses Worker.Run). `ended`, if
  // given, is set when the session had ended before the request went (its
  // stream closed: the worker stopped or died), so that the caller does
  // not wait for that worker to come back.
  std::optional<absl::StatusOr<v1::RunReply>> TryRun(
      grpc::Channel& channel, v1::Worker::Stub& stub,
      const v1::RunRequest& req, absl::Time deadline,
      bool* ended = nullptr);

 private:
  const absl::Duration spin_;
  absl::Mutex mu_;  // held for a whole call through the session
  std::unique_ptr<ShmSession> session_ ABSL_GUARDED_BY(mu_);
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace halka

#endif  // HALKA_CLIENT_SHM_SESSION_H_
