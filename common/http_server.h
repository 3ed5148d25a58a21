// A small HTTP server for /metrics (Prometheus text format) and the
// rendezvous's ring page, on cpp-httplib (Debian libcpp-httplib-dev).
// GET only; handlers run on the server's threads and must be thread-safe.
#ifndef HALKA_COMMON_HTTP_SERVER_H_
#define HALKA_COMMON_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace halka {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};
// Query parameters of the request.
using HttpHandler =
    std::function<HttpResponse(const std::map<std::string, std::string>&)>;

// HTTPS for the server: a certificate and key (PEM files), and a CA whose
// certificates clients must present (mutual TLS) when `ca` is set. Empty
// cert: plain HTTP.
struct HttpTls {
  std::string cert;
  std::string key;
  std::string ca;
};

class HttpServer {
 public:
  // Serves `handlers` (by exact path) on host:port; port -1 picks a free
  // one. With `tls.cert`, HTTPS; changed files are picked up by the next
  // connection (checked at most once a second).
  // Errors: UNAVAILABLE (cannot bind), INVALID_ARGUMENT (unusable TLS
  // files).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& host, int port,
      std::map<std::string, HttpHandler> handlers, const HttpTls& tls = {});
  bool https() const { return https_; }
  ~HttpServer();
  int port() const { return port_; }
  // "host:port".
  std::string address() const;
  void Stop();

 private:
  HttpServer() = default;
  // Outlives server_ (declared first): its handshakes use it.
  std::shared_ptr<void> tls_files_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
  bool https_ = false;
};

// Starts the HTTP port of a daemon (`what`: "rendezvous", "worker w0"):
// HTTPS with the process's TLS files (common/security.h) when it has them,
// requiring a client certificate from its CA when it has one; plain HTTP
// otherwise, with a warning when the host is not loopback. Logs the choice.
absl::StatusOr<std::unique_ptr<HttpServer>> StartDaemonHttp(
    const std::string& what, const std::string& host, int port,
    std::map<std::string, HttpHandler> handlers);
// The same with the TLS files of `security` (a worker's own,
// WorkerOptions::security) instead of the process's.
struct SecurityConfig;
absl::StatusOr<std::unique_ptr<HttpServer>> StartDaemonHttp(
    const std::string& what, const std::string& host, int port,
    std::map<std::string, HttpHandler> handlers,
    const SecurityConfig& security);

// Prometheus label value escaping (\\, \", \n).
std::string PromEscape(const std::string& s);

}  // namespace halka

#endif  // HALKA_COMMON_HTTP_SERVER_H_
