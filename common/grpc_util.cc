#include "common/grpc_util.h"

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/security.h"
#include "grpc/event_engine/event_engine.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/version_info.h"

#if GRPC_CPP_VERSION_MAJOR == 1 && GRPC_CPP_VERSION_MINOR == 51
// gRPC 1.51 exports this (src/core/lib/event_engine/default_event_engine.h)
// but installs no header that declares it.
namespace grpc_event_engine::experimental {
std::shared_ptr<EventEngine> GetDefaultEventEngine();
}  // namespace grpc_event_engine::experimental
#endif

namespace halka {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

bool IsLocalAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:") ||
      absl::StartsWith(address, "unix-abstract:") ||
      absl::StartsWith(address, "localhost:") ||
      absl::StartsWith(address, "[::1]:")) {
    return true;
  }
  absl::ConsumePrefix(&address, "ipv4:");
  if (!absl::StartsWith(address, "127.")) return false;
  // An IPv4 literal in 127.0.0.0/8, not a host name that starts with "127.".
  const size_t colon = address.find(':');
  if (colon == absl::string_view::npos) return false;
  for (char c : address.substr(0, colon)) {
    if (!(c == '.' || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

std::string HostOf(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

std::string DialableAddress(const std::string& listen, int port,
                            const std::string& advertise) {
  if (!advertise.empty()) return advertise;
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = "127.0.0.1";
  return absl::StrCat(host, ":", port);
}

namespace {
grpc::ChannelArguments ChannelArgs() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Peer links are separate channels so one slow edge never shares a
  // connection with another.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnect quickly to a daemon that restarted: gRPC's default backoff
  // grows to two minutes, longer than any operation's deadline. (Not
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: it is also the minimum connect
  // timeout, 20 s by default; at 100 ms a loaded host fails to connect.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  ApplyStreamingArgs([&](const char* key, int value) { args.SetInt(key, value); });
  return args;
}
}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target) {
  return CreateSecureChannel(target, ChannelArgs());
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const SecurityConfig& security) {
  return CreateSecureChannel(target, ChannelArgs(), security);
}

void ApplyStreamingArgs(const std::function<void(const char*, int)>& set) {
  // Bulk streams: large HTTP/2 frames (fewer headers and wake-ups) and a
  // large initial window, so a 1 MiB chunk is not paced by window updates.
  set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
}

void ConfigureServerBuilder(grpc::ServerBuilder& builder) {
  ApplyStreamingArgs([&](const char* key, int value) {
    builder.AddChannelArgument(key, value);
  });
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Hostile input: one connection cannot open unbounded streams (a ring
  // needs one per edge and generation, the SDK a few).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreams);
}

void KeepGrpcForTheProcess() {
  static const bool kept = [] {
    grpc_init();
#if GRPC_CPP_VERSION_MAJOR == 1 && GRPC_CPP_VERSION_MINOR == 51
    // And gRPC's default EventEngine, which its last server's or channel's
    // destruction otherwise destroys (stopping its thread pool) while
    // that pool may still run a callback: a double free about once in
    // 500 teardowns. Never freed.
    new std::shared_ptr<grpc_event_engine::experimental::EventEngine>(
        grpc_event_engine::experimental::GetDefaultEventEngine());
#endif
    // And one reference to the completion queue that runs callback-API
    // reactions where gRPC's poller does not run in the background (Linux,
    // gRPC 1.51: the "callback alternative" queue, shared by every channel
    // and server of the process, with threads of its own). Its last
    // release shuts it down, joins its threads and deletes it. When that
    // release came from one of those threads (a reaction dropping the last
    // reference to a channel: an outbound link's OnDone after its
    // transport was destroyed), the thread joined itself, and went on to
    // poll the deleted queue: "assertion failed: prior > 0" in
    // grpc_cq_internal_unref, or a double free, about once in a few
    // thousand process-group teardowns on torch 2.6. A started server with
    // a callback service and no port holds one reference; never freed, so
    // the count never reaches 0 again.
    static auto* const no_calls = new grpc::CallbackGenericService();
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(no_calls);
    if (builder.BuildAndStart().release() == nullptr) {
      std::fprintf(stderr,
                   "halka: could not start the server that keeps gRPC's "
                   "callback queue for the process\n");
    }
    return true;
  }();
  (void)kept;
}

void TuneProcessForStreaming() {
  const char* detect = std::getenv("HALKA_MUTEX_DEADLOCK_DETECTION");
  if (detect == nullptr || std::string(detect) != "1") {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_ARENA_MAX, 4);
}

StreamLimiter::StreamLimiter(std::string what, int per_connection, int total)
    : what_(std::move(what)), per_connection_(per_connection), total_(total) {}

absl::Status StreamLimiter::Acquire(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  if (open_ >= total_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many open ", what_, " streams on this server: ", open_,
        " (at most ", total_, "); refused the one from ", peer));
  }
  int& mine = per_peer_[peer];
  if (mine >= per_connection_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many open ", what_, " streams from ", peer, ": ", mine,
        " (at most ", per_connection_, " per connection)"));
  }
  ++mine;
  ++open_;
  return absl::OkStatus();
}

void StreamLimiter::Release(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto it = per_peer_.find(peer);
  if (it == per_peer_.end()) return;
  if (--it->second <= 0) per_peer_.erase(it);
  --open_;
}

int StreamLimiter::open() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

void SetTimeout(grpc::ClientContext& ctx, absl::Duration timeout) {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace halka
