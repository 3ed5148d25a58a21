#include "common/http_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "httplib.h"

namespace halka {

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
  const SecurityConfig sec = GetSecurityConfig();
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
