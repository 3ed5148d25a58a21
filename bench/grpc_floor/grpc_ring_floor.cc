// halka-grpc-ring-floor: what the gRPC stream path could do at best, with
// no halka in it. G ranks in one process (as `halkactl bench` runs its
// embedded workers) move a ring all-reduce's bytes: 2(G-1) steps, in each
// of which every rank sends its successor one segment (S/G bytes, in chunks
// of --chunk, the last with the remainder) and takes one from its
// predecessor, adding each
// received chunk into a float accumulator (the reduce's memory traffic).
// A chunk of step s leaves once the same chunk of step s-1 came in, so
// chunks pipeline as in halka's ring.
//
// The same pattern runs over two links, one after the other, same sizes:
//   tcp   a plain loopback TCP connection per edge; the op thread writes
//         each chunk with blocking send(2) (a 4-byte length, then the
//         bytes), and a reader thread per rank receives whole chunks into
//         a buffer of their own and hands them to the op thread;
//   grpc  one long-lived gRPC bidirectional stream per edge, as halka's
//         GrpcTransport: a callback reactor, one write in flight and the
//         rest queued, each chunk a zero-copy slice over the sender's
//         buffer, received as gRPC's own slices, and halka's channel and
//         server arguments (common/grpc_util.h: 1 MiB HTTP/2 frames, a
//         16 MiB stream window, 64 MiB messages).
// Neither does anything else: no fingerprints, no frame headers, no
// deadlines, no telemetry. So the ratio grpc/tcp in the same run is what
// the gRPC stream's own machinery costs against a plain socket, the
// ceiling for halka's gRPC path against its wire path.
//
// Every received chunk is checked (its length, and its first 16 bytes,
// which name the sender, the step, the chunk and the operation), and the
// run fails on the first wrong one. Times: per operation the slowest rank's (a barrier
// before each), the median of --iters after --warmup.
//
// Usage: halka-grpc-ring-floor [--world G] [--min SIZE] [--max SIZE]
//          [--iters N] [--warmup N] [--chunk BYTES] [--links "tcp grpc"]
//          [--pollers N]
// --pollers N adds N threads to the grpc run, each blocked in a completion
// queue of its own on a call its server never answers, as the threads of
// synchronous gRPC calls and servers wait (the Poller class says why that
// matters).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/grpc_util.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace {

constexpr char kMethod[] = "/halka.floor.Ring/Link";
// A call that the server never answers (--pollers).
constexpr char kIdleMethod[] = "/halka.floor.Ring/Idle";
constexpr size_t kTagBytes = 16;

// Also from gRPC's threads: no static destructors run under them.
[[noreturn]] void Die(const std::string& what) {
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

int Listen(int* port) {
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

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool ReadAll(int fd, void* p, size_t len) {
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

// ---- the pattern ----

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int waiting_ = 0;
  uint64_t gen_ = 0;
};

struct Rank {
  Inbox inbox;
  std::unique_ptr<Link> out;
  std::vector<uint8_t> send;  // one segment per step
  std::vector<float> acc;
};

void Tag(uint8_t* p, uint32_t from, uint32_t step,
         uint32_t chunk, uint32_t op) {
  const uint32_t t[4] = {from, step, chunk, op};
  std::memcpy(p, t, kTagBytes);
}

// One operation on rank r; returns its time in us.
double RunOp(Rank& me, int r, int g, size_t seg, size_t chunk, uint32_t op) {
  const int steps = 2 * (g - 1);
  // Whole chunks; the last takes the remainder too, so that no chunk is
  // shorter than `chunk` (at least the tag).
  const size_t chunks = std::max<size_t>(1, seg / chunk);
  auto length = [&](size_t c) {
    return c + 1 < chunks ? chunk : seg - c * chunk;
  };
  const uint32_t from = static_cast<uint32_t>((r + g - 1) % g);
  auto piece = [&](int step, size_t c) {
    uint8_t* p = me.send.data() + static_cast<size_t>(step) * seg + c * chunk;
    const size_t len = length(c);
    Tag(p, static_cast<uint32_t>(r), static_cast<uint32_t>(step),
        static_cast<uint32_t>(c), op);
    me.out->Send(p, len);
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t c = 0; c < chunks; ++c) piece(0, c);
  for (int step = 0; step < steps; ++step) {
    for (size_t c = 0; c < chunks; ++c) {
      Chunk in = me.inbox.Take();
      const size_t len = length(c);
      uint8_t head[kTagBytes];
      size_t got = 0;
      float* acc = me.acc.data() + c * chunk / sizeof(float);
      // Add the floats in (the reduce's memory traffic) and keep the head.
      size_t f = 0;
      in.ForEach([&](const uint8_t* p, size_t n) {
        if (got < kTagBytes) {
          std::memcpy(head + got, p, std::min(n, kTagBytes - got));
        }
        got += n;
        const size_t whole = n / sizeof(float);
        for (size_t i = 0; i < whole; ++i) {
          float v;
          std::memcpy(&v, p + i * sizeof(float), sizeof v);
          acc[f++] += v;
        }
      });
      uint32_t t[4];
      std::memcpy(t, head, kTagBytes);
      if (got != len || t[0] != from || t[1] != static_cast<uint32_t>(step) ||
          t[2] != c || t[3] != op) {
        std::ostringstream e;
        e << "rank " << r << " op " << op << " step " << step << " chunk " << c
          << ": got " << got << " bytes tagged (" << t[0] << "," << t[1]
          << "," << t[2] << "," << t[3] << "), expected " << len
          << " bytes from rank " << from;
        Die(e.str());
      }
      if (step + 1 < steps) piece(step + 1, c);
    }
  }
  me.out->Drain();
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now() - t0)
      .count();
}

size_t ParseSize(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  const std::string unit(end);
  if (unit == "K") v *= 1 << 10;
  if (unit == "M") v *= 1 << 20;
  if (unit == "G") v *= 1 << 30;
  if (v <= 0) Die("bad size " + s);
  return static_cast<size_t>(v);
}

// Median time per operation (the slowest rank's) for each size.
std::vector<double> RunLink(const std::string& kind, int g,
                            const std::vector<size_t>& sizes, size_t chunk,
                            int iters, int warmup, int pollers) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < g; ++r) ranks.push_back(std::make_unique<Rank>());
  std::vector<std::unique_ptr<TcpReceiver>> tcp;
  std::vector<std::unique_ptr<RingService>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::vector<int> ports(static_cast<size_t>(g));
  if (kind == "tcp") {
    for (int r = 0; r < g; ++r) {
      tcp.push_back(std::make_unique<TcpReceiver>(&ranks[r]->inbox));
    }
    for (int r = 0; r < g; ++r) {
      const int to = (r + 1) % g;
      ranks[r]->out = std::make_unique<TcpLink>(tcp[to]->port());
      tcp[to]->Accept();
    }
  } else {
    for (int r = 0; r < g; ++r) {
      services.push_back(std::make_unique<RingService>(&ranks[r]->inbox));
      grpc::ServerBuilder b;
      halka::ConfigureServerBuilder(b);
      b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                         &ports[r]);
      b.RegisterCallbackGenericService(services.back().get());
      servers.push_back(b.BuildAndStart());
      if (!servers.back() || ports[r] == 0) Die("cannot start a gRPC server");
    }
    for (int r = 0; r < g; ++r) {
      const int to = (r + 1) % g;
      ranks[r]->out = std::make_unique<GrpcLink>(
          halka::MakeChannel("127.0.0.1:" + std::to_string(ports[to])));
    }
  }
  std::vector<std::unique_ptr<Poller>> idle;
  if (kind == "grpc") {
    for (int i = 0; i < pollers; ++i) {
      // Each on a connection of its own to a rank's server (ranks in turn).
      grpc::ChannelArguments args;
      args.SetInt("halka.floor.poller", i);
      idle.push_back(std::make_unique<Poller>(grpc::CreateCustomChannel(
          "127.0.0.1:" + std::to_string(ports[static_cast<size_t>(i % g)]),
          grpc::InsecureChannelCredentials(), args)));
    }
  }
  std::vector<double> medians;
  uint32_t op = 0;
  for (size_t size : sizes) {
    const size_t seg = std::max<size_t>(size / static_cast<size_t>(g), 64) /
                       sizeof(float) * sizeof(float);
    const size_t ck = std::max<size_t>(std::min(chunk, seg), kTagBytes + 8);
    for (auto& rk : ranks) {
      rk->send.assign(static_cast<size_t>(2 * (g - 1)) * seg, 1);
      rk->acc.assign(seg / sizeof(float) + 1, 0.0f);
    }
    Barrier barrier(g);
    std::vector<std::vector<double>> times(
        static_cast<size_t>(g), std::vector<double>(static_cast<size_t>(iters)));
    std::vector<std::thread> threads;
    const uint32_t base = op;
    for (int r = 0; r < g; ++r) {
      threads.emplace_back([&, r] {
        for (int i = 0; i < warmup + iters; ++i) {
          barrier.Wait();
          double t = RunOp(*ranks[r], r, g, seg, ck,
                           base + static_cast<uint32_t>(i));
          if (i >= warmup) times[r][static_cast<size_t>(i - warmup)] = t;
        }
      });
    }
    for (auto& t : threads) t.join();
    op = base + static_cast<uint32_t>(warmup + iters);
    std::vector<double> slowest(static_cast<size_t>(iters), 0);
    for (int i = 0; i < iters; ++i) {
      for (int r = 0; r < g; ++r) {
        slowest[i] = std::max(slowest[i], times[r][i]);
      }
    }
    std::sort(slowest.begin(), slowest.end());
    medians.push_back(slowest[slowest.size() / 2]);
  }
  idle.clear();
  for (auto& rk : ranks) rk->out.reset();  // streams end before servers
  for (auto& s : servers) s->Shutdown();
  return medians;
}

}  // namespace

int main(int argc, char** argv) {
  int g = 4, iters = 30, warmup = 10, pollers = 0;
  size_t min = 256 << 10, max = 16 << 20, chunk = 1 << 20;
  std::string links = "tcp grpc";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--world") g = std::atoi(next().c_str());
    else if (a == "--min") min = ParseSize(next());
    else if (a == "--max") max = ParseSize(next());
    else if (a == "--iters") iters = std::atoi(next().c_str());
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else if (a == "--chunk") chunk = ParseSize(next());
    else if (a == "--links") links = next();
    else if (a == "--pollers") pollers = std::atoi(next().c_str());
    else Die("unknown flag " + a + " (see the comment at the top of the source)");
  }
  if (g < 2 || g > 64 || iters < 1 || warmup < 0 || min > max) {
    Die("need 2 <= --world <= 64, --iters >= 1, --min <= --max");
  }
  halka::TuneProcessForStreaming();
  halka::KeepGrpcForTheProcess();
  std::vector<size_t> sizes;
  for (size_t s = min; s <= max; s *= 4) sizes.push_back(s);
  std::vector<std::string> kinds;
  std::istringstream ls(links);
  for (std::string k; ls >> k;) {
    if (k != "tcp" && k != "grpc") Die("--links takes tcp and grpc");
    kinds.push_back(k);
  }
  std::vector<std::vector<double>> t;
  for (const auto& k : kinds) {
    t.push_back(RunLink(k, g, sizes, chunk, iters, warmup, pollers));
  }
  std::printf("G=%d, chunk %zu B, median of %d ops after %d, us per op "
              "(the slowest rank's)\n",
              g, chunk, iters, warmup);
  std::printf("%12s", "size");
  for (const auto& k : kinds) std::printf(" %10s", k.c_str());
  // The second link's speed as a fraction of the first's.
  if (kinds.size() == 2) {
    std::printf(" %10s/%s", kinds[1].c_str(), kinds[0].c_str());
  }
  std::printf("\n");
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::printf("%12zu", sizes[i]);
    for (const auto& row : t) std::printf(" %10.1f", row[i]);
    if (kinds.size() == 2) std::printf(" %13.2fx", t[0][i] / t[1][i]);
    std::printf("\n");
  }
  return 0;
}
