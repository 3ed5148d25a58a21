// The two kinds of link halka-grpc-ring-floor compares
// (grpc_ring_floor.cc): a plain loopback TCP connection per edge, and one
// gRPC bidirectional stream per edge set up as halka's GrpcTransport; each
// delivers whole chunks to its rank's Inbox. Also the idle gRPC calls of
// --pollers.
#ifndef HALKA_BENCH_GRPC_FLOOR_FLOOR_LINKS_H_
#define HALKA_BENCH_GRPC_FLOOR_FLOOR_LINKS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace halka::floor {

inline constexpr char kMethod[] = "/halka.floor.Ring/Link";
// A call that the server never answers (--pollers).
inline constexpr char kIdleMethod[] = "/halka.floor.Ring/Idle";

// Also from gRPC's threads: no static destructors run under them.
[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "halka-grpc-ring-floor: %s\n", what.c_str());
  std::fflush(stderr);
  _exit(1);
}

// A received chunk: contiguous (tcp) or gRPC's slices.
struct Chunk {
  // tcp: received straight into memory of its own, not zero-filled first
  // (the gRPC side's slices are not either).
  std::unique_ptr<uint8_t[]> bytes;
  size_t length = 0;
  std::vector<grpc::Slice> slices;  // grpc
  // Calls f(pointer, length) over the bytes in order.
  template <typename F>
  void ForEach(F&& f) const {
    if (slices.empty()) {
      f(bytes.get(), length);
      return;
    }
    for (const auto& s : slices) f(s.begin(), s.size());
  }
};

// What a rank's links deliver to its op thread, in arrival order.
class Inbox {
 public:
  void Put(Chunk c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(c));
    }
    cv_.notify_one();
  }
  Chunk Take() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(30),
                      [&] { return !q_.empty(); })) {
      Die("no chunk came in 30 s");
    }
    Chunk c = std::move(q_.front());
    q_.pop_front();
    return c;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> q_;
};

// One edge's sending end.
class Link {
 public:
  virtual ~Link() = default;
  // The bytes stay valid until Drain returns.
  virtual void Send(const uint8_t* data, size_t len) = 0;
  // Returns once every Send's bytes are written.
  virtual void Drain() = 0;
};

// ---- tcp ----

inline int Listen(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      listen(fd, 16) != 0) {
    Die(std::string("listen: ") + std::strerror(errno));
  }
  socklen_t n = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  *port = ntohs(a.sin_port);
  return fd;
}

inline void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

inline bool ReadAll(int fd, void* p, size_t len) {
  auto* b = static_cast<uint8_t*>(p);
  while (len > 0) {
    ssize_t n = recv(fd, b, len, 0);
    if (n <= 0) return false;
    b += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

class TcpLink : public Link {
 public:
  explicit TcpLink(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      Die(std::string("connect: ") + std::strerror(errno));
    }
    NoDelay(fd_);
  }
  ~TcpLink() override { close(fd_); }
  void Send(const uint8_t* data, size_t len) override {
    const uint32_t n = static_cast<uint32_t>(len);
    msghdr m{};
    iovec iov[2] = {{const_cast<uint32_t*>(&n), 4},
                    {const_cast<uint8_t*>(data), len}};
    size_t left = 4 + len;
    size_t at = 0;
    while (left > 0) {
      // Skip what was written already.
      iovec v[2];
      int k = 0;
      size_t skip = at;
      for (const iovec& i : iov) {
        if (skip >= i.iov_len) {
          skip -= i.iov_len;
          continue;
        }
        v[k].iov_base = static_cast<uint8_t*>(i.iov_base) + skip;
        v[k].iov_len = i.iov_len - skip;
        skip = 0;
        ++k;
      }
      m.msg_iov = v;
      m.msg_iovlen = static_cast<size_t>(k);
      ssize_t w = sendmsg(fd_, &m, MSG_NOSIGNAL);
      if (w <= 0) Die(std::string("send: ") + std::strerror(errno));
      at += static_cast<size_t>(w);
      left -= static_cast<size_t>(w);
    }
  }
  void Drain() override {}

 private:
  int fd_ = -1;
};

// A rank's receiving end over TCP: a reader thread per accepted connection.
class TcpReceiver {
 public:
  explicit TcpReceiver(Inbox* inbox) : inbox_(inbox) { lfd_ = Listen(&port_); }
  ~TcpReceiver() {
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
    if (reader_.joinable()) reader_.join();
    if (fd_ >= 0) close(fd_);
    close(lfd_);
  }
  int port() const { return port_; }
  void Accept() {
    fd_ = accept(lfd_, nullptr, nullptr);
    if (fd_ < 0) Die(std::string("accept: ") + std::strerror(errno));
    NoDelay(fd_);
    reader_ = std::thread([this] {
      for (;;) {
        uint32_t n = 0;
        if (!ReadAll(fd_, &n, 4)) return;
        Chunk c;
        c.bytes.reset(new uint8_t[n]);
        c.length = n;
        if (!ReadAll(fd_, c.bytes.get(), n)) return;
        inbox_->Put(std::move(c));
      }
    });
  }

 private:
  Inbox* const inbox_;
  int lfd_ = -1, fd_ = -1, port_ = 0;
  std::thread reader_;
};

// ---- grpc ----

// The serving end of one stream: every message to the rank's inbox.
class InStream : public grpc::ServerGenericBidiReactor {
 public:
  explicit InStream(Inbox* inbox) : inbox_(inbox) { StartRead(&buf_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    Chunk c;
    if (!buf_.Dump(&c.slices).ok()) Die("unreadable message");
    buf_.Clear();
    inbox_->Put(std::move(c));
    StartRead(&buf_);
  }
  void OnDone() override { delete this; }

 private:
  Inbox* const inbox_;
  grpc::ByteBuffer buf_;
};

// The serving end of an idle call: reads until the caller cancels.
class IdleStream : public grpc::ServerGenericBidiReactor {
 public:
  IdleStream() { StartRead(&buf_); }
  void OnReadDone(bool) override { Finish(grpc::Status::OK); }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer buf_;
};

class RingService : public grpc::CallbackGenericService {
 public:
  explicit RingService(Inbox* inbox) : inbox_(inbox) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* ctx) override {
    if (ctx->method() == kIdleMethod) return new IdleStream;
    if (ctx->method() != kMethod) {
      return CallbackGenericService::CreateReactor(ctx);
    }
    return new InStream(inbox_);
  }

 private:
  Inbox* const inbox_;
};

// The dialling end: one write in flight, the rest queued (as
// GrpcTransport::OutLink).
class GrpcLink : public Link,
                 public grpc::ClientBidiReactor<grpc::ByteBuffer,
                                                grpc::ByteBuffer> {
 public:
  explicit GrpcLink(std::shared_ptr<grpc::Channel> channel)
      : stub_(std::move(channel)) {
    stub_.PrepareBidiStreamingCall(&ctx_, kMethod, grpc::StubOptions(), this);
    AddHold();
    StartCall();
  }
  ~GrpcLink() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      if (!writing_) StartWritesDone();
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return done_; })) {
      ctx_.TryCancel();
      cv_.wait(lock, [&] { return done_; });
    }
  }
  void Send(const uint8_t* data, size_t len) override {
    grpc::Slice s(const_cast<uint8_t*>(data), len, grpc::Slice::STATIC_SLICE);
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(&s, 1);
    ++pending_;
    if (!writing_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }
  void Drain() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(30),
                      [&] { return pending_ == 0; })) {
      Die("a gRPC write did not complete in 30 s");
    }
  }
  void OnWriteDone(bool ok) override {
    if (!ok) Die("a gRPC write failed");
    std::lock_guard<std::mutex> lock(mu_);
    queue_.pop_front();
    --pending_;
    if (!queue_.empty()) {
      StartWrite(&queue_.front());
    } else {
      writing_ = false;
      if (closing_) {
        StartWritesDone();
      }
    }
    cv_.notify_all();
  }
  void OnWritesDoneDone(bool) override { RemoveHold(); }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

 private:
  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<grpc::ByteBuffer> queue_;
  size_t pending_ = 0;
  bool writing_ = false, closing_ = false, done_ = false;
};

// A thread blocked in a completion queue of its own on a call that is never
// answered, as a synchronous gRPC call's thread waits (a watch stream, a
// synchronous server's threads): gRPC may make any such thread the one
// that polls every socket of the process.
class Poller {
 public:
  explicit Poller(std::shared_ptr<grpc::Channel> channel) : stub_(channel) {
    call_ = stub_.PrepareCall(&ctx_, kIdleMethod, &cq_);
    call_->StartCall(reinterpret_cast<void*>(1));
    thread_ = std::thread([this] {
      void* tag;
      bool ok;
      bool reading = false;
      while (cq_.Next(&tag, &ok)) {
        if (tag == reinterpret_cast<void*>(1) && ok && !reading) {
          reading = true;
          call_->Read(&buf_, reinterpret_cast<void*>(2));
        } else if (tag == reinterpret_cast<void*>(1) ||
                   tag == reinterpret_cast<void*>(2)) {
          // The call ended (cancelled before or while it was read).
          call_->Finish(&status_, reinterpret_cast<void*>(3));
        } else if (tag == reinterpret_cast<void*>(3)) {
          cq_.Shutdown();
        }
      }
    });
  }
  ~Poller() {
    ctx_.TryCancel();
    thread_.join();
  }

 private:
  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  grpc::ByteBuffer buf_;
  grpc::Status status_;
  std::thread thread_;
};

}  // namespace halka::floor

#endif  // HALKA_BENCH_GRPC_FLOOR_FLOOR_LINKS_H_
