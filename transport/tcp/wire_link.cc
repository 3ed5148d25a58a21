#include "transport/tcp/wire_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "codec/frame_codec.h"
#include "transport/tcp/wire_record.h"

namespace halka {
namespace {

using wire_record::Errno;
using wire_record::GetU32;
using wire_record::kMaxRecordBytes;
using wire_record::PutU32;
using wire_record::Signal;

constexpr size_t kTokenBytes = 16;
constexpr size_t kMaxPending = 64;
constexpr absl::Duration kHandshakeTime = absl::Seconds(2);
constexpr absl::Duration kTokenLife = absl::Seconds(30);
// No Nagle; and a connection that stops answering (a black-holed path, a
// peer host gone) errors out in about 30 s instead of blocking a write or
// a read until the operation's deadline names nothing better.
void SetSocketOptions(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = 10, interval = 5, count = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  unsigned int user_timeout_ms = 30000;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms,
             sizeof(user_timeout_ms));
}

std::string CongestionOf(int fd) {
  char name[32] = {};
  socklen_t len = sizeof(name);
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, std::min<size_t>(len, sizeof(name))));
}

bool SetCongestion(int fd, const std::string& name) {
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                    static_cast<socklen_t>(name.size())) == 0;
}

// Logs each distinct outcome of ChooseCongestion once per process.
void NoteCongestionOnce(const std::string& note) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* seen = new std::set<std::string>();
  {
    absl::MutexLock lock(&mu);
    if (!seen->insert(note).second) return;
  }
  LogInfo(absl::StrCat("wire links: ", note));
}

// A handshaken connection as a link uses it: blocking, SetSocketOptions.
void MakeLinkSocket(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  SetSocketOptions(fd);
}

// A connection to the listener that has not shown its whole token yet.
struct PendingConn {
  int fd;
  absl::Time deadline;
  std::string got;
};

// Accepts every connection waiting on listen_fd into `pending` (`live` of
// them open); when full, the oldest silent one is closed and counted.
void AcceptPending(int listen_fd, std::vector<PendingConn>& pending,
                   size_t& live, std::atomic<uint64_t>& evicted) {
  for (;;) {
    const int c = accept4(listen_fd, nullptr, nullptr,
                          SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      // Out of descriptors: the connection stays in the backlog and
      // poll would report it at once again; do not spin on it.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        absl::SleepFor(absl::Milliseconds(100));
      }
      break;
    }
    // Full: the oldest connection that has not shown a token goes,
    // never the new one. A peer presents its token right after it
    // connects, so connections that sit silent (a flood of them, or
    // a scanner) cannot keep links off the wire: each one only
    // pushes the silent ones out.
    if (live >= kMaxPending) {
      for (PendingConn& old : pending) {
        if (old.fd < 0) continue;
        close(old.fd);
        old.fd = -1;
        --live;
        evicted.fetch_add(1, std::memory_order_relaxed);
        break;
      }
    }
    pending.push_back({c, halka::Now() + kHandshakeTime, ""});
    ++live;
  }
}

// Reads what p's connection sent of its token; false (p.fd closed) when
// the connection ended or failed.
bool ReadToken(PendingConn& p) {
  char buf[kTokenBytes];
  const ssize_t r = read(p.fd, buf, kTokenBytes - p.got.size());
  if (r <= 0 && !(r < 0 && (errno == EAGAIN || errno == EINTR))) {
    close(p.fd);
    return false;
  }
  if (r > 0) p.got.append(buf, static_cast<size_t>(r));
  return true;
}

// Waits for `events` on fd until the handshake's deadline: "" when they
// came, else why not.
std::string WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - halka::Now());
    if (ms <= 0) return "timed out after 2 s";
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(ms));
    if (r > 0) return "";
    if (r < 0 && errno != EINTR) return Errno("poll");
  }
}

// Connects the non-blocking fd to a's address by `deadline`: "" or why not.
std::string ConnectBy(int fd, const addrinfo* a, absl::Time deadline) {
  if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return "";
  if (errno != EINPROGRESS) return Errno("connect");
  std::string failed = WaitFor(fd, POLLOUT, deadline);
  if (!failed.empty()) return failed;
  int err = 0;
  socklen_t el = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
  return err != 0 ? absl::StrCat("connect: ", std::strerror(err)) : "";
}

// The token out on fd, the listener's ack back, by `deadline`: "" or why.
std::string PresentToken(int fd, const std::string& token,
                         absl::Time deadline) {
  if (send(fd, token.data(), token.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(token.size())) {
    return Errno("sending the link token");
  }
  std::string failed = WaitFor(fd, POLLIN, deadline);
  if (!failed.empty()) return failed;
  char ack = 0;
  const ssize_t r = read(fd, &ack, 1);
  return r == 1 && ack == 'k' ? ""
         : r == 0             ? "closed without an ack (token not taken)"
         : r < 0              ? Errno("reading the ack")
                              : "a wrong ack byte";
}

// A non-blocking TCP socket for `a` (close-on-exec), or -1 with *why set.
int StreamSocket(const addrinfo& a, std::string* why) {
  const int fd = socket(a.ai_family,
                        a.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        a.ai_protocol);
  if (fd < 0) *why = Errno("socket");
  return fd;
}

}  // namespace

std::string FormatWireAnswer(int port, const std::string& token) {
  return absl::StrCat("ok ", port, " ", token);
}

bool ParseWireAnswer(const std::string& answer, int* port,
                     std::string* token) {
  std::vector<std::string> parts = absl::StrSplit(answer, ' ');
  int p = 0;
  if (parts.size() != 3 || parts[0] != "ok" || !absl::SimpleAtoi(parts[1], &p) ||
      p <= 0 || p > 65535 || WireUnhex(parts[2]).size() != kTokenBytes) {
    return false;
  }
  *port = p;
  *token = parts[2];
  return true;
}

// ---- WireListener

absl::StatusOr<std::unique_ptr<WireListener>> WireListener::Start(
    const std::string& host, int port_wanted,
    std::shared_ptr<LinkCounters> counters) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (port_wanted < 0 || port_wanted > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("wire links: port ", port_wanted, " is not a TCP port"));
  }
  addrinfo* res = nullptr;
  std::string bare = host;  // without brackets (HostOf)
  if (bare == "0.0.0.0" || bare == "::") bare.clear();  // every address
  const int rc = getaddrinfo(bare.empty() ? nullptr : bare.c_str(),
                             absl::StrCat(port_wanted).c_str(), &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "wire links: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    if ((fd = StreamSocket(*a, &why)) < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      why = Errno("bind/listen");
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("wire links: cannot listen on '", host, "': ", why));
  }
  sockaddr_storage ss{};
  socklen_t sl = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl);
  const int port = ntohs(ss.ss_family == AF_INET6
                             ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                             : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(fd);
    return absl::UnavailableError(Errno("wire links: eventfd"));
  }
  if (counters == nullptr) counters = std::make_shared<LinkCounters>();
  return std::unique_ptr<WireListener>(
      new WireListener(fd, wake, port, std::move(counters)));
}

WireListener::WireListener(int fd, int wake_fd, int port,
                           std::shared_ptr<LinkCounters> counters)
    : fd_(fd), wake_fd_(wake_fd), port_(port), counters_(std::move(counters)) {
  loop_ = std::thread([this] { Loop(); });
}

WireListener::~WireListener() {
  Stop();
  close(fd_);
  close(wake_fd_);
}

void WireListener::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
    expected_.clear();
  }
  Signal(wake_fd_);
  if (loop_.joinable()) loop_.join();
  shutdown(fd_, SHUT_RDWR);  // new connections are refused from now on
}

std::string WireListener::Expect(OnConnected on_connected) {
  absl::StatusOr<std::string> token = WireRandomBytes(kTokenBytes);
  if (!token.ok()) return "";
  absl::MutexLock lock(&mu_);
  if (stop_) return "";
  expected_[*token] = Waiting{std::move(on_connected), halka::Now() + kTokenLife};
  return WireHex(*token);
}

void WireListener::Forget(const std::string& token) {
  absl::MutexLock lock(&mu_);
  expected_.erase(WireUnhex(token));
}

void WireListener::Loop() {
  std::vector<PendingConn> pending;
  size_t live = 0;  // pending entries still open
  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({fd_, POLLIN, 0});
    for (const PendingConn& p : pending) fds.push_back({p.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 200);
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
      const absl::Time now = halka::Now();
      for (auto it = expected_.begin(); it != expected_.end();) {
        it = it->second.expires < now ? expected_.erase(it) : std::next(it);
      }
    }
    if (fds[1].revents & POLLIN) {
      AcceptPending(fd_, pending, live, counters_->wire.evicted);
    }
    const absl::Time now = halka::Now();
    std::vector<PendingConn> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      PendingConn& p = pending[i];
      if (p.fd < 0) continue;  // evicted
      // fds[2 + i] is p's (pending did not change since the poll, apart
      // from new connections appended after it).
      if (i + 2 < fds.size() &&
          (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) &&
          !ReadToken(p)) {
        continue;
      }
      if (p.got.size() == kTokenBytes) {
        absl::MutexLock lock(&mu_);
        auto it = expected_.find(p.got);
        const char ack = 'k';
        if (it == expected_.end() || send(p.fd, &ack, 1, MSG_NOSIGNAL) != 1) {
          close(p.fd);
          continue;
        }
        OnConnected done = std::move(it->second.on_connected);
        expected_.erase(it);
        MakeLinkSocket(p.fd);
        done(p.fd);  // under the lock: Forget cannot pass it
        continue;
      }
      if (now > p.deadline) {
        close(p.fd);
        continue;
      }
      still.push_back(std::move(p));
    }
    pending = std::move(still);
    live = pending.size();
  }
  for (const PendingConn& p : pending) {
    if (p.fd >= 0) close(p.fd);
  }
}

std::string DefaultCongestion() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  std::string name = CongestionOf(fd);
  close(fd);
  return name;
}

bool ValidCongestionName(const std::string& name) {
  if (name.empty() || name.size() > 15) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::vector<std::string> CongestionTries(const std::string& host,
                                         const std::string& wanted,
                                         absl::Duration rtt) {
  if (wanted == "auto") {
    const bool bbr = absl::StartsWith(host, "bbr");  // bbr, bbr2, bbr3
    if (bbr && rtt > absl::ZeroDuration() && rtt < kAutoCongestionRtt) {
      return {"cubic", "reno"};
    }
    return {};
  }
  if (wanted == "system" || wanted == host) return {};
  return {wanted};
}

namespace {

// The smoothed round trip the kernel measured on connected TCP socket
// `fd` (TCP_INFO); zero when unknown.
absl::Duration RoundTripOf(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) {
    return absl::ZeroDuration();
  }
  return absl::Microseconds(info.tcpi_rtt);
}

}  // namespace

CongestionChoice ChooseCongestion(int fd, const std::string& wanted) {
  CongestionChoice c;
  c.host = c.in_use = CongestionOf(fd);
  c.rtt = RoundTripOf(fd);
  const std::vector<std::string> tries = CongestionTries(c.host, wanted, c.rtt);
  if (tries.empty()) return c;
  std::vector<std::string> refused;
  for (const std::string& name : tries) {
    if (SetCongestion(fd, name)) {
      const std::string now = CongestionOf(fd);
      c.in_use = now.empty() ? name : now;
      c.note = absl::StrCat(
          "TCP congestion control ", c.in_use, " in place of the host's ",
          c.host, " (--wire_congestion=", wanted,
          wanted == "auto" ? ": links with a round trip under 1 ms)" : ")");
      return c;
    }
    refused.push_back(absl::StrCat(name, " (", Errno("setsockopt"), ")"));
  }
  c.note = absl::StrCat("--wire_congestion=", wanted, ": the kernel refused ",
                        absl::StrJoin(refused, " and "),
                        "; the links keep the host's ", c.host);
  return c;
}

// ---- WireSender

WireSender::WireSender(std::string host, int port, std::string token,
                       std::string key,
                       std::function<void(const absl::Status&)> on_ready,
                       std::function<void(const absl::Status&)> on_failed,
                       std::string congestion,
                       std::shared_ptr<LinkCounters> counters)
    : host_(std::move(host)),
      port_(port),
      token_(WireUnhex(token)),
      seal_(key.empty() ? nullptr : std::make_unique<WireSeal>(std::move(key))),
      on_ready_(std::move(on_ready)),
      on_failed_(std::move(on_failed)),
      wanted_congestion_(std::move(congestion)),
      counters_(std::move(counters)) {
  thread_ = std::thread([this] { Loop(); });
}

WireSender::~WireSender() { Close(); }

absl::Status WireSender::Connect() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  const std::string& bare = host_;  // without brackets (HostOf)
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(bare.c_str(), absl::StrCat(port_).c_str(),
                             &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", host_, ": ", gai_strerror(rc)));
  }
  const absl::Time deadline = halka::Now() + kHandshakeTime;
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    if ((fd = StreamSocket(*a, &why)) < 0) continue;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) {
        close(fd);
        freeaddrinfo(res);
        return absl::CancelledError("closed");
      }
      fd_ = fd;  // Close can cut the waits below
    }
    if (std::string failed = ConnectBy(fd, a, deadline); !failed.empty()) {
      why = failed;
      absl::MutexLock lock(&mu_);
      close(fd);
      fd_ = fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", host_,
                                               ":", port_, ": ", why));
  }
  // The token out, the ack back, both within the handshake time.
  if (std::string failed = PresentToken(fd, token_, deadline);
      !failed.empty()) {
    absl::MutexLock lock(&mu_);
    close(fd);
    fd_ = -1;
    return absl::UnavailableError(absl::StrCat(
        "the peer did not take the link token on ", host_, ":", port_, ": ",
        failed));
  }
  MakeLinkSocket(fd);
  // Chosen once connected: the handshake and the token's ack measured the
  // round trip that auto reads, and a route's congctl (applied at connect)
  // is replaced, not the other way round. Only the link's data follows.
  const CongestionChoice cc = ChooseCongestion(fd, wanted_congestion_);
  if (!cc.note.empty()) NoteCongestionOnce(cc.note);
  if (counters_ != nullptr && cc.changed()) {
    counters_->wire.congestion_changed.fetch_add(1);
  } else if (counters_ != nullptr && cc.refused()) {
    counters_->wire.congestion_refused.fetch_add(1);
  }
  {
    absl::MutexLock lock(&mu_);
    congestion_ = cc;
  }
  return absl::OkStatus();
}

}  // namespace halka
