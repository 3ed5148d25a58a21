// gRPC glue shared by every halka binary: the one mapping between
// absl::Status and grpc::Status, logging, addresses, channels.
#ifndef HALKA_COMMON_GRPC_UTIL_H_
#define HALKA_COMMON_GRPC_UTIL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace halka {

// The codes are numerically identical in both libraries; these keep the
// code and the message and nothing else.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// One line to stderr: "I 20:31:05.123 [tag] message".
void LogInfo(absl::string_view message);
void LogWarning(absl::string_view message);
void LogError(absl::string_view message);
void SetLogTag(absl::string_view tag);

// True for "unix:...", "localhost:...", "127.x.x.x:..." and "[::1]:...".
bool IsLocalAddress(absl::string_view address);

// The address others dial for a server that listens on `listen` and got
// `port`: `advertise` when given, else the listen host (a wildcard host
// becomes 127.0.0.1) with the bound port.
std::string DialableAddress(const std::string& listen, int port,
                            const std::string& advertise);

// A channel with halka's channel arguments (message size limits,
// keepalive) and the process's security (common/security.h): TLS when
// configured, the job id and token on every call.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target);

// Applies halka's server arguments (message sizes, keepalive policy).
void ConfigureServerBuilder(grpc::ServerBuilder& builder);

// Largest message halka sends or accepts on any channel.
inline constexpr int kMaxMessageBytes = 64 << 20;
inline constexpr int kHttp2FrameBytes = 1 << 20;
// Streams one client connection may have open at once on a halka server.
inline constexpr int kMaxConcurrentStreams = 1024;
inline constexpr int kStreamWindowBytes = 16 << 20;
// Sets the HTTP/2 arguments halka uses for bulk streams.
void ApplyStreamingArgs(const std::function<void(const char*, int)>& set);

// Keeps freed memory in the process instead of returning it to the kernel
// after every message: gRPC allocates and frees a receive buffer per read,
// and without this each one costs page faults and TLB shootdowns. Call once
// at start-up of a process that carries collectives.
void TuneAllocatorForStreaming();

// Sets a deadline `timeout` from now on a client context.
void SetTimeout(grpc::ClientContext& ctx, absl::Duration timeout);

}  // namespace halka

#endif  // HALKA_COMMON_GRPC_UTIL_H_
