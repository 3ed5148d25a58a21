// gRPC glue shared by every halka binary: the one mapping between
// absl::Status and grpc::Status, addresses, channels (and, for its
// users, common/log.h).
#ifndef HALKA_COMMON_GRPC_UTIL_H_
#define HALKA_COMMON_GRPC_UTIL_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "grpcpp/grpcpp.h"

namespace halka {

// The codes are numerically identical in both libraries; these keep the
// code and the message and nothing else.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// True for "unix:...", "localhost:...", "127.x.x.x:..." and "[::1]:...".
bool IsLocalAddress(absl::string_view address);
// The host of "host:port", without the brackets of "[v6]:port".
std::string HostOf(const std::string& address);

// The address others dial for a server that listens on `listen` and got
// `port`: `advertise` when given, else the listen host (a wildcard host
// becomes 127.0.0.1) with the bound port.
std::string DialableAddress(const std::string& listen, int port,
                            const std::string& advertise);

// A channel with halka's channel arguments (message size limits,
// keepalive) and the process's security (common/security.h): TLS when
// configured, the job id and token on every call.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target);
// The same under `security` instead of the process's configuration (a
// worker's own, WorkerOptions::security).
struct SecurityConfig;
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const SecurityConfig& security);

// Applies halka's server arguments (message sizes, keepalive policy).
void ConfigureServerBuilder(grpc::ServerBuilder& builder);

// Largest message halka sends or accepts on any channel.
inline constexpr int kMaxMessageBytes = 64 << 20;
inline constexpr int kHttp2FrameBytes = 1 << 20;
// Streams one client connection may have open at once on a halka server.
inline constexpr int kMaxConcurrentStreams = 1024;
inline constexpr int kStreamWindowBytes = 16 << 20;

// Bounds the streams of one kind a server has open at once, per client
// connection (the peer address gRPC reports for the call) and in all. HTTP/2's
// own cap (kMaxConcurrentStreams) only makes a client queue its next
// stream; a stream past these bounds is refused at once with
// RESOURCE_EXHAUSTED, saying which bound.
class StreamLimiter {
 public:
  StreamLimiter(std::string what, int per_connection, int total);
  StreamLimiter(const StreamLimiter&) = delete;
  StreamLimiter& operator=(const StreamLimiter&) = delete;

  // Counts a stream of `peer` (ServerContext::peer()), or refuses it.
  absl::Status Acquire(const std::string& peer);
  // Forgets a stream Acquire counted.
  void Release(const std::string& peer);
  int open() const;

  // Acquire for the life of a handler that runs the whole stream.
  class Scoped {
   public:
    Scoped(StreamLimiter& limiter, std::string peer)
        : limiter_(limiter), peer_(std::move(peer)),
          status_(limiter.Acquire(peer_)) {}
    ~Scoped() {
      if (status_.ok()) limiter_.Release(peer_);
    }
    Scoped(const Scoped&) = delete;
    Scoped& operator=(const Scoped&) = delete;
    const absl::Status& status() const { return status_; }

   private:
    StreamLimiter& limiter_;
    const std::string peer_;
    const absl::Status status_;
  };

 private:
  const std::string what_;
  const int per_connection_;
  const int total_;
  mutable absl::Mutex mu_;
  std::map<std::string, int> per_peer_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;
};
// Sets the HTTP/2 arguments halka uses for bulk streams.
void ApplyStreamingArgs(const std::function<void(const char*, int)>& set);

// Keeps freed memory in the process instead of returning it to the kernel
// after every message: gRPC allocates and frees a receive buffer per read,
// and without this each one costs page faults and TLB shootdowns. Call once
// at start-up of a process that carries collectives.
//
// Also turns off Abseil's mutex deadlock detection (on in Debian's build of
// Abseil): it records every lock acquisition in a global graph under a
// global lock, which every data-path thread then contends for (about 2 % of
// a ring's CPU in `perf`, plus the hand-offs it serialises). Set
// HALKA_MUTEX_DEADLOCK_DETECTION=1 to keep it on while debugging.
void TuneProcessForStreaming();

// Holds one reference to gRPC's library for the rest of the process (one
// grpc_init, never shut down) and, on gRPC 1.51, one to its default
// EventEngine, so that destroying halka's last server or channel inside a
// process that goes on (an embedded worker or rendezvous: torch's process
// group) tears neither down while gRPC's own threads still run. On torch
// 2.6 about one process-group teardown in 500 crashed there: a SIGSEGV in
// grpc_completion_queue_next beside grpc_shutdown from ~Server, or a
// double free beside ~PosixEventEngine. And one reference to the queue
// that runs callback-API reactions, so that its last release never comes
// from one of its own threads (grpc_util.cc says how that crashed).
// Idempotent; any thread.
void KeepGrpcForTheProcess();

// Sets a deadline `timeout` from now on a client context.
void SetTimeout(grpc::ClientContext& ctx, absl::Duration timeout);

}  // namespace halka

#endif  // HALKA_COMMON_GRPC_UTIL_H_
