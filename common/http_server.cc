#include "common/http_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace halka {

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& host, int port,
    std::map<std::string, HttpHandler> handlers) {
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->server_ = std::make_unique<httplib::Server>();
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
