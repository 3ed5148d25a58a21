#include "common/security.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/client_interceptor.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this process; enables TLS on its "
          "servers (env HALKA_TLS_CERT)");
ABSL_FLAG(std::string, tls_key, "",
          "PEM private key for --tls_cert (env HALKA_TLS_KEY)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA of the job: verifies servers, and on servers makes client "
          "certificates signed by it mandatory (env HALKA_TLS_CA)");
ABSL_FLAG(std::string, tls_server_name, "",
          "name expected in server certificates; default: the target host "
          "(env HALKA_TLS_SERVER_NAME)");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(10),
          "how often certificate and key files are re-read "
          "(env HALKA_TLS_RELOAD_INTERVAL)");
ABSL_FLAG(bool, insecure, false,
          "allow plaintext on a non-loopback listen address (logged as a "
          "warning) (env HALKA_INSECURE)");
ABSL_FLAG(std::string, job_token_file, "",
          "file holding the job's secret token; the variable HALKA_JOB_TOKEN "
          "may hold the token itself (env HALKA_JOB_TOKEN_FILE)");
ABSL_FLAG(std::string, job_tokens_file, "",
          "rendezvous: lines 'JOB TOKEN'; only listed jobs may call. Default: "
          "a job's first call fixes its token (env HALKA_JOB_TOKENS_FILE)");
ABSL_FLAG(bool, require_job_tokens, false,
          "rendezvous: refuse calls for jobs without a token "
          "(env HALKA_REQUIRE_JOB_TOKENS)");

namespace halka {
namespace {

constexpr char kUnauthenticated[] = "unauthenticated";

absl::Mutex config_mu;
bool config_set ABSL_GUARDED_BY(config_mu) = false;
SecurityConfig& Config() {
  static SecurityConfig* config = new SecurityConfig();
  return *config;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(absl::StripAsciiWhitespace(v));
}

// A process that never set a configuration (an SDK user's trainer) takes
// it from the same HALKA_* variables the daemons read.
SecurityConfig ConfigFromEnv() {
  SecurityConfig c;
  c.tls_cert = Env("HALKA_TLS_CERT");
  c.tls_key = Env("HALKA_TLS_KEY");
  c.tls_ca = Env("HALKA_TLS_CA");
  c.tls_server_name = Env("HALKA_TLS_SERVER_NAME");
  c.job_id = Env("HALKA_JOB");
  c.job_token = Env("HALKA_JOB_TOKEN");
  const std::string file = Env("HALKA_JOB_TOKEN_FILE");
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    c.job_token = std::string(absl::StripAsciiWhitespace(ss.str()));
    if (!in) LogError(absl::StrCat("HALKA_JOB_TOKEN_FILE=", file, ": cannot read"));
  }
  return c;
}

// The rendezvous' job -> token table: from --job_tokens_file, or filled by
// the first call of each job. Tokens stay in memory only.
class JobTokenRegistry {
 public:
  static JobTokenRegistry& Get() {
    static JobTokenRegistry* r = new JobTokenRegistry();
    return *r;
  }

  void Reset(std::map<std::string, std::string> fixed, bool use_fixed,
             bool require) {
    absl::MutexLock lock(&mu_);
    tokens_ = std::move(fixed);
    fixed_ = use_fixed;
    require_ = require;
  }

  bool Verify(absl::string_view job, absl::string_view token) {
    if (job.empty()) return false;
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(std::string(job));
    if (it == tokens_.end()) {
      if (fixed_ || (require_ && token.empty())) return false;
      tokens_.emplace(std::string(job), std::string(token));  // first use
      return true;
    }
    if (require_ && it->second.empty()) return false;
    return ConstantTimeEquals(it->second, token);
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> tokens_ ABSL_GUARDED_BY(mu_);
  bool fixed_ ABSL_GUARDED_BY(mu_) = false;
  bool require_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::string> ReadFileTrimmed(const std::string& path,
                                            absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": cannot read the file"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

absl::StatusOr<std::map<std::string, std::string>> ReadTokensFile(
    const std::string& path) {
  auto text = ReadFileTrimmed(path, "job_tokens_file");
  if (!text.ok()) return text.status();
  std::map<std::string, std::string> tokens;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job_tokens_file=", path, ": line ", line_no,
                       " is not 'JOB TOKEN'"));
    }
    tokens[std::string(parts[0])] = std::string(parts[1]);
  }
  return tokens;
}

// Metadata as both the processor and ServerContext::client_metadata see it.
absl::string_view Find(const std::multimap<grpc::string_ref, grpc::string_ref>& md,
                       absl::string_view key) {
  auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) return {};
  return absl::string_view(it->second.data(), it->second.size());
}

// Checks the token of every call before a handler sees it. The standard
// health service stays open (Kubernetes and Compose probes carry no token;
// it says SERVING and nothing else); with mutual TLS a probe still needs a
// certificate.
class TokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  TokenProcessor(ServerRole role, std::string job, std::string token)
      : role_(role), job_(std::move(job)), token_(std::move(token)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& md, grpc::AuthContext*,
                       OutputMetadata*, OutputMetadata*) override {
    if (absl::StartsWith(Find(md, ":path"), "/grpc.health.v1.Health/")) {
      return grpc::Status::OK;
    }
    const absl::string_view job = Find(md, kJobMetadata);
    const absl::string_view token = Find(md, kTokenMetadata);
    bool ok = false;
    if (role_ == ServerRole::kSingleJob) {
      ok = (job.empty() || job == job_ || job_.empty()) &&
           ConstantTimeEquals(token, token_);
    } else {
      // A call that names no job is checked by CheckCallJob against the
      // job in its request.
      ok = job.empty() || JobTokenRegistry::Get().Verify(job, token);
    }
    if (!ok) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kUnauthenticated);
    return grpc::Status::OK;
  }

 private:
  const ServerRole role_;
  const std::string job_;
  const std::string token_;
};

// Adds the job id and token to every call that does not carry them yet.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  TokenInterceptor(const std::string* job, const std::string* token)
      : job_(job), token_(token) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      std::multimap<std::string, std::string>* md =
          methods->GetSendInitialMetadata();
      if (!job_->empty() && md->find(kJobMetadata) == md->end()) {
        md->emplace(kJobMetadata, *job_);
      }
      if (!token_->empty() && md->find(kTokenMetadata) == md->end()) {
        md->emplace(kTokenMetadata, *token_);
      }
    }
    methods->Proceed();
  }

 private:
  const std::string* job_;
  const std::string* token_;
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  TokenInterceptorFactory(std::string job, std::string token)
      : job_(std::move(job)), token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&job_, &token_);
  }

 private:
  const std::string job_;
  const std::string token_;
};

bool IsUnixTarget(absl::string_view target) {
  return absl::StartsWith(target, "unix:") ||
         absl::StartsWith(target, "unix-abstract:");
}

// One file watcher (one refresh thread) per set of files, shared by every
// channel and server that uses them: peer links are a channel each.
std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider>
MakeProvider(const SecurityConfig& c, bool identity) {
  const auto seconds = static_cast<unsigned int>(
      std::max<int64_t>(1, absl::ToInt64Seconds(c.tls_reload_interval)));
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache = new std::map<
      std::string, std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider>>();
  const std::string key =
      absl::StrCat(identity, "\n", c.tls_key, "\n", c.tls_cert, "\n", c.tls_ca,
                   "\n", seconds);
  absl::MutexLock lock(&mu);
  auto& provider = (*cache)[key];
  if (provider != nullptr) return provider;
  if (identity && !c.tls_ca.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        c.tls_key, c.tls_cert, c.tls_ca, seconds);
  } else if (identity) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        c.tls_key, c.tls_cert, seconds);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        c.tls_ca, seconds);
  }
  return provider;
}

absl::Status CheckTlsFiles(const SecurityConfig& c) {
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key must be given together");
  }
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string*>{"tls_cert", &c.tls_cert},
        {"tls_key", &c.tls_key},
        {"tls_ca", &c.tls_ca}}) {
    if (path->empty()) continue;
    std::ifstream in(*path);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", *path, ": cannot read the file"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

void SetSecurityConfig(SecurityConfig config) {
  std::map<std::string, std::string> fixed;
  bool use_fixed = false;
  if (!config.job_tokens_file.empty()) {
    auto tokens = ReadTokensFile(config.job_tokens_file);
    if (tokens.ok()) {
      fixed = std::move(*tokens);
    } else {
      LogError(tokens.status().ToString());  // no job may call then
    }
    use_fixed = true;
  }
  JobTokenRegistry::Get().Reset(std::move(fixed), use_fixed,
                                config.require_job_tokens);
  absl::MutexLock lock(&config_mu);
  Config() = std::move(config);
  config_set = true;
}

SecurityConfig GetSecurityConfig() {
  absl::MutexLock lock(&config_mu);
  if (!config_set) {
    Config() = ConfigFromEnv();
    config_set = true;
  }
  return Config();
}

absl::StatusOr<SecurityConfig> SecurityConfigFromFlags(absl::string_view job_id) {
  // Tools that do not map every HALKA_* variable onto their flags
  // (halkactl) still take the security ones from the environment, where a
  // flag was not given.
  for (const char* name : {"tls_cert", "tls_key", "tls_ca", "tls_server_name",
                           "tls_reload_interval", "insecure", "job_token_file",
                           "job_tokens_file", "require_job_tokens"}) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    const std::string var = absl::StrCat("HALKA_", absl::AsciiStrToUpper(name));
    const char* value = std::getenv(var.c_str());
    if (flag == nullptr || value == nullptr ||
        flag->CurrentValue() != flag->DefaultValue()) {
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(var, ": ", error));
    }
  }
  SecurityConfig c;
  c.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  c.tls_key = absl::GetFlag(FLAGS_tls_key);
  c.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  c.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  c.tls_reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  c.insecure = absl::GetFlag(FLAGS_insecure);
  c.job_id = std::string(job_id);
  c.job_tokens_file = absl::GetFlag(FLAGS_job_tokens_file);
  c.require_job_tokens = absl::GetFlag(FLAGS_require_job_tokens);
  if (absl::Status s = CheckTlsFiles(c); !s.ok()) return s;
  const std::string token_file = absl::GetFlag(FLAGS_job_token_file);
  if (!token_file.empty()) {
    auto token = ReadFileTrimmed(token_file, "job_token_file");
    if (!token.ok()) return token.status();
    if (token->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job_token_file=", token_file, ": the file is empty"));
    }
    c.job_token = std::move(*token);
  } else if (const char* env = std::getenv("HALKA_JOB_TOKEN"); env != nullptr) {
    c.job_token = std::string(absl::StripAsciiWhitespace(env));
  }
  if (!c.job_tokens_file.empty()) {
    auto tokens = ReadTokensFile(c.job_tokens_file);
    if (!tokens.ok()) return tokens.status();
  }
  return c;
}

absl::Status InitSecurityFromFlags(absl::string_view job_id) {
  absl::StatusOr<SecurityConfig> c = SecurityConfigFromFlags(job_id);
  if (!c.ok()) return c.status();
  SetSecurityConfig(std::move(*c));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const std::string& listen, ServerRole role) {
  return ServerCredentialsFor(listen, role, GetSecurityConfig());
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const std::string& listen, ServerRole role, const SecurityConfig& c) {
  std::shared_ptr<grpc::ServerCredentials> creds;
  const bool unix_socket = IsUnixTarget(listen);
  if (c.server_tls() && !unix_socket) {
    if (absl::Status s = CheckTlsFiles(c); !s.ok()) return s;
    grpc::experimental::TlsServerCredentialsOptions options(
        MakeProvider(c, /*identity=*/true));
    options.watch_identity_key_cert_pairs();
    if (!c.tls_ca.empty()) {
      options.watch_root_certs();
      options.set_cert_request_type(
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    } else {
      options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    }
    creds = grpc::experimental::TlsServerCredentials(options);
    LogInfo(absl::StrCat(
        "serving TLS on ", listen,
        c.tls_ca.empty() ? " (clients need no certificate)"
                         : " with mutual TLS: clients need a certificate "
                           "signed by the CA in " + c.tls_ca));
  } else {
    if (!unix_socket && !IsLocalAddress(listen)) {
      if (!c.insecure) {
        return absl::FailedPreconditionError(absl::StrCat(
            "refusing to serve plaintext on ", listen,
            ": give --tls_cert/--tls_key (and --tls_ca for mutual TLS), "
            "listen on loopback, or pass --insecure"));
      }
      LogWarning(absl::StrCat("serving PLAINTEXT on ", listen,
                              " (--insecure): anyone on the network can read "
                              "and forge this traffic"));
    }
    // The only plaintext server credentials of gRPC 1.51 that take an
    // AuthMetadataProcessor (InsecureServerCredentials aborts on it): with a
    // plain ServerBuilder the xDS credentials are their fallback, as is.
    creds = grpc::XdsServerCredentials(grpc::InsecureServerCredentials());
  }
  creds->SetAuthMetadataProcessor(
      std::make_shared<TokenProcessor>(role, c.job_id, c.job_token));
  return creds;
}

absl::Status CheckCallJob(const grpc::ServerContextBase& ctx,
                          absl::string_view request_job) {
  // No job, nothing to act on: the handler refuses the request itself
  // (INVALID_ARGUMENT), and it must not tell a bad token from a bad request.
  if (request_job.empty()) return absl::OkStatus();
  const auto& md = ctx.client_metadata();
  const absl::string_view job = Find(md, kJobMetadata);
  bool ok;
  if (!job.empty()) {
    // The processor verified this job's token already; the request must be
    // for the same job.
    ok = job == request_job;
  } else {
    ok = JobTokenRegistry::Get().Verify(request_job, Find(md, kTokenMetadata));
  }
  if (!ok) return absl::UnauthenticatedError(kUnauthenticated);
  return absl::OkStatus();
}

grpc::Status CheckCallJobGrpc(const grpc::ServerContextBase& ctx,
                              absl::string_view request_job) {
  return ToGrpcStatus(CheckCallJob(ctx, request_job));
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    const std::string& target) {
  return ChannelCredentialsFor(target, GetSecurityConfig());
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    const std::string& target, const SecurityConfig& c) {
  if (!c.client_tls() || IsUnixTarget(target)) {
    return grpc::InsecureChannelCredentials();
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  if (!c.tls_cert.empty() || !c.tls_ca.empty()) {
    options.set_certificate_provider(MakeProvider(c, !c.tls_cert.empty()));
  }
  if (!c.tls_ca.empty()) options.watch_root_certs();
  if (!c.tls_cert.empty()) options.watch_identity_key_cert_pairs();
  return grpc::experimental::TlsCredentials(options);
}

void ApplySecurityChannelArgs(const std::string& target,
                              grpc::ChannelArguments& args) {
  ApplySecurityChannelArgs(target, args, GetSecurityConfig());
}

void ApplySecurityChannelArgs(const std::string& target,
                              grpc::ChannelArguments& args,
                              const SecurityConfig& c) {
  if (c.client_tls() && !IsUnixTarget(target) && !c.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(c.tls_server_name);
  }
}

std::shared_ptr<grpc::Channel> CreateSecureChannel(const std::string& target,
                                                   grpc::ChannelArguments args) {
  return CreateSecureChannel(target, std::move(args), GetSecurityConfig());
}

std::shared_ptr<grpc::Channel> CreateSecureChannel(const std::string& target,
                                                   grpc::ChannelArguments args,
                                                   const SecurityConfig& c) {
  ApplySecurityChannelArgs(target, args, c);
  std::shared_ptr<grpc::ChannelCredentials> creds =
      ChannelCredentialsFor(target, c);
  if (c.job_id.empty() && c.job_token.empty()) {
    return grpc::CreateCustomChannel(target, creds, args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<TokenInterceptorFactory>(c.job_id, c.job_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, creds, args, std::move(interceptors));
}

}  // namespace halka
