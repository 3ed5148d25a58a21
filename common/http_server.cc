#include "common/http_server.h"

#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <filesystem>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "httplib.h"

namespace halka {
namespace {

// The HTTPS files, re-read when they change (looked at, at most once a
// second, when a client connects): each handshake uses the newest usable
// certificate, key and client CA, so certificates rotate without a restart,
// as on the gRPC ports. Files that cannot be used keep the last good ones.
class TlsFiles {
 public:
  explicit TlsFiles(HttpTls tls) : tls_(std::move(tls)) {}
  ~TlsFiles() { Clear(); }
  TlsFiles(const TlsFiles&) = delete;
  TlsFiles& operator=(const TlsFiles&) = delete;

  // SSL_CTX_set_cert_cb's callback: 1 to go on with the handshake.
  static int OnHandshake(SSL* ssl, void* self) {
    return static_cast<TlsFiles*>(self)->Apply(ssl) ? 1 : 0;
  }

 private:
  bool Apply(SSL* ssl) {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = absl::Now();
    if (now - checked_ >= absl::Seconds(1)) {
      checked_ = now;
      const std::string stamp = Stamp();
      if (stamp != stamp_) {
        if (Load()) stamp_ = stamp;  // else: retried at the next check
      }
    }
    if (cert_ == nullptr) return false;
    if (SSL_use_certificate(ssl, cert_) != 1 || SSL_set1_chain(ssl, chain_) != 1 ||
        SSL_use_PrivateKey(ssl, key_) != 1) {
      return false;
    }
    return store_ == nullptr || SSL_set1_verify_cert_store(ssl, store_) == 1;
  }

  // Modification times and sizes of the files.
  std::string Stamp() const {
    std::string out;
    for (const std::string& f : {tls_.cert, tls_.key, tls_.ca}) {
      if (f.empty()) continue;
      std::error_code ec;
      const auto t = std::filesystem::last_write_time(f, ec);
      const auto n = std::filesystem::file_size(f, ec);
      absl::StrAppend(&out, f, ":", t.time_since_epoch().count(), ":", n, ";");
    }
    return out;
  }

  bool Load() {
    X509* cert = nullptr;
    STACK_OF(X509)* chain = sk_X509_new_null();
    EVP_PKEY* key = nullptr;
    X509_STORE* store = nullptr;
    bool ok = chain != nullptr;
    if (BIO* in = BIO_new_file(tls_.cert.c_str(), "r"); in != nullptr) {
      cert = PEM_read_bio_X509(in, nullptr, nullptr, nullptr);
      while (X509* more = PEM_read_bio_X509(in, nullptr, nullptr, nullptr)) {
        if (chain == nullptr || sk_X509_push(chain, more) == 0) X509_free(more);
      }
      BIO_free(in);
    }
    if (BIO* in = BIO_new_file(tls_.key.c_str(), "r"); in != nullptr) {
      key = PEM_read_bio_PrivateKey(in, nullptr, nullptr, nullptr);
      BIO_free(in);
    }
    ok = ok && cert != nullptr && key != nullptr && X509_check_private_key(cert, key) == 1;
    if (ok && !tls_.ca.empty()) {
      store = X509_STORE_new();
      ok = store != nullptr &&
           X509_STORE_load_locations(store, tls_.ca.c_str(), nullptr) == 1;
    }
    if (!ok) {
      X509_free(cert);
      sk_X509_pop_free(chain, X509_free);
      EVP_PKEY_free(key);
      X509_STORE_free(store);
      return false;
    }
    Clear();
    cert_ = cert;
    chain_ = chain;
    key_ = key;
    store_ = store;
    return true;
  }

  void Clear() {
    X509_free(cert_);
    sk_X509_pop_free(chain_, X509_free);
    EVP_PKEY_free(key_);
    X509_STORE_free(store_);
    cert_ = nullptr;
    chain_ = nullptr;
    key_ = nullptr;
    store_ = nullptr;
  }

  const HttpTls tls_;
  std::mutex mu_;
  absl::Time checked_ = absl::InfinitePast();
  std::string stamp_;
  X509* cert_ = nullptr;
  STACK_OF(X509)* chain_ = nullptr;
  EVP_PKEY* key_ = nullptr;
  X509_STORE* store_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& host, int port,
    std::map<std::string, HttpHandler> handlers, const HttpTls& tls) {
  std::unique_ptr<HttpServer> s(new HttpServer());
  if (tls.cert.empty()) {
    s->server_ = std::make_unique<httplib::Server>();
  } else {
    // With a client CA, OpenSSL is told to require and verify a client
    // certificate (SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT).
    auto https = std::make_unique<httplib::SSLServer>(
        tls.cert.c_str(), tls.key.c_str(),
        tls.ca.empty() ? nullptr : tls.ca.c_str());
    if (!https->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "https: cannot use the certificate ", tls.cert, ", key ", tls.key,
          tls.ca.empty() ? "" : absl::StrCat(" or CA ", tls.ca)));
    }
    auto files = std::make_shared<TlsFiles>(tls);
    SSL_CTX_set_cert_cb(https->ssl_context(), &TlsFiles::OnHandshake, files.get());
    s->tls_files_ = files;
    s->server_ = std::move(https);
    s->https_ = true;
  }
  s->host_ = host;
  for (auto& [path, handler] : handlers) {
    s->server_->Get(path, [h = handler](const httplib::Request& req,
                                        httplib::Response& res) {
      std::map<std::string, std::string> params;
      for (const auto& [k, v] : req.params) params[k] = v;
      HttpResponse r = h(params);
      res.status = r.status;
      res.set_content(r.body, r.content_type.c_str());
    });
  }
  if (port < 0) {
    s->port_ = s->server_->bind_to_any_port(host.c_str());
    if (s->port_ <= 0) {
      return absl::UnavailableError(
          absl::StrCat("http: cannot bind a port on ", host));
    }
  } else {
    if (!s->server_->bind_to_port(host.c_str(), port)) {
      return absl::UnavailableError(
          absl::StrCat("http: cannot listen on ", host, ":", port));
    }
    s->port_ = port;
  }
  httplib::Server* raw = s->server_.get();
  s->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return s;
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartDaemonHttp(
    const std::string& what, const std::string& host, int port,
    std::map<std::string, HttpHandler> handlers) {
  return StartDaemonHttp(what, host, port, std::move(handlers),
                         GetSecurityConfig());
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartDaemonHttp(
    const std::string& what, const std::string& host, int port,
    std::map<std::string, HttpHandler> handlers, const SecurityConfig& sec) {
  HttpTls tls;
  if (!sec.tls_cert.empty()) tls = HttpTls{sec.tls_cert, sec.tls_key, sec.tls_ca};
  auto http = HttpServer::Start(host, port, std::move(handlers), tls);
  if (!http.ok()) {
    return absl::Status(http.status().code(),
                        absl::StrCat(what, ": ", http.status().message()));
  }
  const std::string at = (*http)->address();
  if ((*http)->https()) {
    LogInfo(absl::StrCat("HTTPS (/metrics) on ", at,
                         tls.ca.empty() ? ""
                                        : " with mutual TLS: clients need a "
                                          "certificate signed by the CA in " +
                                              tls.ca));
  } else if (IsLocalAddress(at)) {
    LogInfo(absl::StrCat("HTTP (/metrics) on ", at));
  } else {
    LogWarning(absl::StrCat(
        "plain HTTP (/metrics) on ", at,
        ", without authentication: anyone who reaches it reads what it "
        "serves; give the daemon --tls_cert/--tls_key (--tls_ca) for HTTPS"));
  }
  return http;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string HttpServer::address() const {
  return absl::StrCat(host_, ":", port_);
}

std::string PromEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace halka
