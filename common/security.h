// Transport security and job tokens for every halka channel and server.
//
// One process-wide SecurityConfig, set once by each main from the shared
// flags below (or by LocalCluster / tests), decides (each function below
// also takes a configuration of its own instead: a worker captures the
// process's when it is created, WorkerOptions::security, and uses that copy
// for its servers, channels and wire links from then on, so that workers
// sharing a process keep theirs):
//   - channels (MakeChannel): TLS to TCP targets when a CA or a client
//     certificate is configured, plaintext otherwise and always to "unix:"
//     targets; every call carries the job id ("halka-job") and the job token
//     ("halka-token") as metadata, on TLS and plaintext channels alike.
//   - servers (ServerCredentialsFor): TLS (mutual TLS when a CA is given:
//     the client must present a certificate signed by it) when a certificate
//     is configured; plaintext only on loopback and Unix sockets, or anywhere
//     with --insecure (logged as a warning); an error otherwise. Every call
//     is checked for the job token before any handler runs; a wrong or
//     missing one gets UNAUTHENTICATED "unauthenticated", never saying which
//     part was wrong.
// Certificates and keys are re-read from their files every
// --tls_reload_interval, so rotating them needs no restart (replace the
// files atomically: write elsewhere, then rename). Tokens are never logged.
//
// What a refused caller sees:
//   plaintext to a TLS port, no client certificate under mutual TLS, a
//   certificate from another CA, or a server certificate the client does
//   not trust: the TLS handshake fails and gRPC reports UNAVAILABLE (the
//   call never reaches the server's code);
//   a missing or wrong token, or another job's: UNAUTHENTICATED with the
//   message "unauthenticated", whatever was wrong.
// The standard grpc.health.v1 service needs no token (probes carry none),
// but under mutual TLS still the certificate.
//
// Flags (each also HALKA_<NAME>, see common/flags_env.h):
//   --tls_cert, --tls_key   this process's certificate chain and key (PEM)
//   --tls_ca                the job's CA (PEM): verifies peers; on servers
//                           it makes client certificates mandatory (mTLS)
//   --tls_server_name       expected name in server certificates (default:
//                           the host of the target)
//   --tls_reload_interval   how often the files are re-read (default 10s)
//   --insecure              allow plaintext on non-loopback listen addresses
//   --job_token_file        file holding this job's secret token (the
//                           variable HALKA_JOB_TOKEN may hold it instead)
//   --job_tokens_file       rendezvous: "JOB TOKEN" per line; only listed
//                           jobs may call. Without it the first call for a
//                           job fixes its token (trust on first use).
//   --require_job_tokens    rendezvous: refuse jobs without a token
#ifndef HALKA_COMMON_SECURITY_H_
#define HALKA_COMMON_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace halka {

// Metadata keys every halka call carries.
inline constexpr char kTokenMetadata[] = "halka-token";
inline constexpr char kJobMetadata[] = "halka-job";

struct SecurityConfig {
  std::string tls_cert;  // PEM certificate chain file
  std::string tls_key;   // PEM private key file
  std::string tls_ca;    // PEM CA file; mTLS on servers when set
  std::string tls_server_name;
  absl::Duration tls_reload_interval = absl::Seconds(10);
  bool insecure = false;
  std::string job_id;     // the job this process speaks for ("" = none)
  std::string job_token;  // secret; "" = no token
  std::string job_tokens_file;  // rendezvous only
  bool require_job_tokens = false;  // rendezvous only

  // TLS on TCP channels (clients) / listening ports (servers).
  bool client_tls() const { return !tls_ca.empty() || !tls_cert.empty(); }
  bool server_tls() const { return !tls_cert.empty(); }
};

// Replaces the process-wide configuration; channels and servers made after
// the call use it. Also resets the rendezvous token registry. A process
// that never calls it (a trainer using the SDK) gets its configuration from
// HALKA_TLS_CERT, HALKA_TLS_KEY, HALKA_TLS_CA, HALKA_TLS_SERVER_NAME,
// HALKA_JOB, HALKA_JOB_TOKEN and HALKA_JOB_TOKEN_FILE.
void SetSecurityConfig(SecurityConfig config);
SecurityConfig GetSecurityConfig();

// Fills a SecurityConfig from the flags above (call after parsing them) and
// the given job id; reads the token file. Errors: INVALID_ARGUMENT naming the
// flag and the file (never its content).
absl::StatusOr<SecurityConfig> SecurityConfigFromFlags(absl::string_view job_id);

// SecurityConfigFromFlags + SetSecurityConfig: what every main calls right
// after parsing its flags (an error ends the process with it).
absl::Status InitSecurityFromFlags(absl::string_view job_id);

// Which calls a server accepts.
enum class ServerRole {
  // One job: every call must carry this process's job token (when it has
  // one) and, when it names a job, this process's job id.
  kSingleJob,
  // The rendezvous: many jobs, each with its own token (tokens file or
  // trust on first use); handlers bind the request's job with CheckCallJob.
  kMultiJob,
};

// Credentials for a listening port, per the rules above. Errors:
// FAILED_PRECONDITION for plaintext on a non-loopback address without
// --insecure; INVALID_ARGUMENT for a certificate without a key.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const std::string& listen, ServerRole role = ServerRole::kSingleJob);
// The same under `config` (whatever the process's configuration is).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const std::string& listen, ServerRole role, const SecurityConfig& config);

// Rendezvous handlers: OK when the call is entitled to act for
// `request_job` (its metadata names that job, or none, and its token is the
// job's); UNAUTHENTICATED "unauthenticated" otherwise.
absl::Status CheckCallJob(const grpc::ServerContextBase& ctx,
                          absl::string_view request_job);
grpc::Status CheckCallJobGrpc(const grpc::ServerContextBase& ctx,
                              absl::string_view request_job);

// Channel credentials for `target` per the configuration (the process's,
// or `config`), and the channel arguments TLS needs (server name
// override); used by MakeChannel.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    const std::string& target);
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    const std::string& target, const SecurityConfig& config);
void ApplySecurityChannelArgs(const std::string& target,
                              grpc::ChannelArguments& args);
void ApplySecurityChannelArgs(const std::string& target,
                              grpc::ChannelArguments& args,
                              const SecurityConfig& config);
// Creates the channel with the token-carrying interceptor when the
// configuration has a job or a token.
std::shared_ptr<grpc::Channel> CreateSecureChannel(
    const std::string& target, grpc::ChannelArguments args);
std::shared_ptr<grpc::Channel> CreateSecureChannel(
    const std::string& target, grpc::ChannelArguments args,
    const SecurityConfig& config);

// Equal strings in time that depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace halka

#endif  // HALKA_COMMON_SECURITY_H_
