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
//
// The links are in floor_links.h.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/grpc_floor/floor_links.h"
#include "common/grpc_util.h"

namespace {

using namespace halka::floor;  // NOLINT: this program's own links

constexpr size_t kTagBytes = 16;

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
