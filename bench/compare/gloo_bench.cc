// Gloo's all-reduce, measured the way `halkactl bench` measures halka's,
// so that bench/compare/compare.sh can print the two side by side.
//
// Threads (the default): G ranks run as G threads of this process, each
// with its own Gloo context and TCP device on loopback (as halkactl bench
// runs G embedded workers in one process).
//
// Processes (--rank=R): this process is rank R of --world=G, rendezvous
// through a gloo FileStore in --store=DIR (a directory every rank can
// reach: processes in other network namespaces share the file system), its
// TCP device on --addr=IP (this host's address, which the other ranks
// connect to). bench/scaling/multihost_latency.sh runs it this way, one
// process per rank in each host's network namespace. Rank 0 prints.
//
// Per size: warm-up iterations, then timed iterations; each iteration
// starts together on every rank (a barrier), and its time is the slowest
// rank's. Output: one JSON object per size, with the same fields
// halkactl bench --json prints (time_us: the mean; busbw_gbs; wrong: every
// rank's wrong elements in thread mode, the most any rank had in process
// mode), and median_us, min_us and max_us of the timed iterations; in
// process mode also their spans on the wall clock, from the last rank's
// start to the last rank's end (span_median_us, span_min_us, span_max_us:
// what multihost_latency.sh compares with halka's; the slowest rank's time
// also holds its wait for a rank that left the barrier later).
//
//   gloo_bench --world=4 --min=1M --max=64M --factor=4 --iters=5 --warmup=1
//              [--algo=ring_chunked|ring|halving_doubling|allreduce]
//              [--rank=R --store=DIR [--addr=IP]]
//
// `allreduce` is gloo::allreduce (gloo/allreduce.h, its ring), the call
// torch.distributed's gloo backend makes for a dense CPU all-reduce.
//
// Each rank's float32 input is (i % 97) + rank (small integers, so every
// sum is exact and the reference is exact too); `wrong` counts elements of
// any rank that differ from the reference.
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"

namespace {

struct Flags : bench_args::SizeFlags {
  Flags() { world = 4; }
  std::string algo = "ring_chunked";
  int rank = -1;            // >= 0: process mode, this process's rank
  std::string store;        // process mode: the FileStore's directory
  std::string addr = "127.0.0.1";  // the TCP device's address
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "gloo_bench: %s\nusage: gloo_bench [--world=G] [--min=BYTES] "
               "[--max=BYTES] [--factor=F] [--iters=N] [--warmup=N] "
               "[--algo=ring_chunked|ring|halving_doubling|allreduce] "
               "[--rank=R --store=DIR [--addr=IP]]\n",
               why);
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    auto [key, value] = bench_args::SplitFlag(argv[i], Usage);
    if (bench_args::ParseSizeFlag(key, value, f, Usage)) continue;
    if (key == "algo") f.algo = value;
    else if (key == "rank") f.rank = bench_args::ParseInt(value, 0, Usage);
    else if (key == "store") f.store = value;
    else if (key == "addr") f.addr = value;
    else Usage(("unknown flag: --" + key).c_str());
  }
  if (f.algo != "ring_chunked" && f.algo != "ring" &&
      f.algo != "halving_doubling" && f.algo != "allreduce") {
    Usage(("unknown algorithm: " + f.algo).c_str());
  }
  if (f.min_bytes < 4 || f.min_bytes > f.max_bytes) Usage("bad size range");
  if (f.rank >= f.world) Usage("--rank must be below --world");
  if ((f.rank >= 0) != !f.store.empty()) {
    Usage("--rank and --store go together (process mode)");
  }
  return f;
}

// One all-reduce of `count` floats at `data` in place, over `ctx`.
using Runner = std::function<void()>;

Runner MakeAllreduce(const std::string& algo,
                     const std::shared_ptr<gloo::Context>& ctx, float* data,
                     int count) {
  if (algo == "allreduce") {
    return [ctx, data, count] {
      gloo::AllreduceOptions opts(ctx);
      opts.setOutput(data, static_cast<size_t>(count));
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
      opts.setReduceFunction(sum);
      gloo::allreduce(opts);
    };
  }
  std::vector<float*> ptrs{data};
  std::shared_ptr<gloo::Algorithm> a;
  if (algo == "ring") {
    a = std::make_shared<gloo::AllreduceRing<float>>(ctx, ptrs, count);
  } else if (algo == "halving_doubling") {
    a = std::make_shared<gloo::AllreduceHalvingDoubling<float>>(ctx, ptrs,
                                                                count);
  } else {
    a = std::make_shared<gloo::AllreduceRingChunked<float>>(ctx, ptrs, count);
  }
  return [a] { a->run(); };
}

std::shared_ptr<gloo::transport::Device> MakeDevice(const std::string& addr) {
  gloo::transport::tcp::attr attr(addr.c_str());
  return gloo::transport::tcp::CreateDevice(attr);
}

// One size's row from the slowest rank's seconds per iteration (warm-up
// first) and the wrong elements; `spans` (process mode): each timed
// iteration's, from the last rank's start to the last rank's end on the
// wall clock.
void PrintRow(const Flags& flags, size_t bytes, std::vector<double> slowest,
              size_t wrong, std::vector<double> spans = {}) {
  const int g = flags.world;
  slowest.erase(slowest.begin(), slowest.begin() + flags.warmup);
  double sum = 0;
  for (double s : slowest) sum += s;
  const double t = sum / static_cast<double>(slowest.size());
  const double median = bench_args::SortAndMedian(slowest);
  const double span = bench_args::SortAndMedian(spans);
  char span_fields[128] = "";
  if (!spans.empty()) {
    std::snprintf(span_fields, sizeof(span_fields),
                  "\"span_median_us\":%.3f,\"span_min_us\":%.3f,"
                  "\"span_max_us\":%.3f,",
                  span * 1e6, spans.front() * 1e6, spans.back() * 1e6);
  }
  const double algbw = static_cast<double>(bytes) / t / 1e9;
  const double busbw = algbw * 2.0 * (g - 1) / g;
  std::printf(
      "{\"size\":%zu,\"count\":%zu,\"type\":\"float32\",\"redop\":\"sum\","
      "\"algo\":\"gloo-%s\",\"world_size\":%d,\"time_us\":%.3f,"
      "\"median_us\":%.3f,\"min_us\":%.3f,\"max_us\":%.3f,%s"
      "\"algbw_gbs\":%.6f,\"busbw_gbs\":%.6f,\"wrong\":%zu,"
      "\"error\":\"\"}\n",
      bytes, bytes / sizeof(float), flags.algo.c_str(), g, t * 1e6,
      median * 1e6, slowest.front() * 1e6, slowest.back() * 1e6, span_fields,
      algbw, busbw, wrong);
  std::fflush(stdout);
}

void FillInput(std::vector<float>& buf, int rank) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = bench_args::Input(i, rank);
}

size_t CountWrong(const std::vector<float>& buf, int g) {
  size_t wrong = 0;
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != bench_args::Expected(i, g)) ++wrong;
  }
  return wrong;
}

// G ranks as threads of this process.
int RunThreads(const Flags& flags) {
  const int g = flags.world;
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::shared_ptr<gloo::Context>> contexts(g);
  {
    std::vector<std::thread> joiners;
    for (int r = 0; r < g; ++r) {
      joiners.emplace_back([&, r] {
        auto ctx = std::make_shared<gloo::rendezvous::Context>(r, g);
        ctx->setTimeout(std::chrono::seconds(120));
        auto dev = MakeDevice(flags.addr);
        ctx->connectFullMesh(*store, dev);
        contexts[r] = ctx;
      });
    }
    for (auto& t : joiners) t.join();
  }

  for (size_t bytes = flags.min_bytes; bytes <= flags.max_bytes;
       bytes *= static_cast<size_t>(flags.factor)) {
    const size_t count = bytes / sizeof(float);
    std::vector<std::vector<float>> bufs(g, std::vector<float>(count));
    std::vector<Runner> algos(g);
    for (int r = 0; r < g; ++r) {
      algos[r] = MakeAllreduce(flags.algo, contexts[r], bufs[r].data(),
                               static_cast<int>(count));
    }
    const int total = flags.warmup + flags.iters;
    // per iteration, per rank: seconds
    std::vector<std::vector<double>> secs(total, std::vector<double>(g));
    std::vector<size_t> wrong(g, 0);
    std::barrier sync(g);
    std::vector<std::thread> ranks;
    for (int r = 0; r < g; ++r) {
      ranks.emplace_back([&, r] {
        for (int it = 0; it < total; ++it) {
          FillInput(bufs[r], r);
          sync.arrive_and_wait();
          auto t0 = std::chrono::steady_clock::now();
          algos[r]();
          secs[it][r] = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
        }
        // Check the last iteration's result against the exact reference.
        wrong[r] = CountWrong(bufs[r], g);
      });
    }
    for (auto& t : ranks) t.join();
    std::vector<double> slowest(total);
    for (int it = 0; it < total; ++it) {
      slowest[it] = *std::max_element(secs[it].begin(), secs[it].end());
    }
    size_t nwrong = 0;
    for (size_t w : wrong) nwrong += w;
    PrintRow(flags, bytes, std::move(slowest), nwrong);
  }
  return 0;
}

// This process is rank flags.rank of flags.world.
int RunProcess(const Flags& flags) {
  const int g = flags.world;
  const int r = flags.rank;
  gloo::rendezvous::FileStore store(flags.store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(r, g);
  ctx->setTimeout(std::chrono::seconds(120));
  auto dev = MakeDevice(flags.addr);
  ctx->connectFullMesh(store, dev);
  for (size_t bytes = flags.min_bytes; bytes <= flags.max_bytes;
       bytes *= static_cast<size_t>(flags.factor)) {
    const size_t count = bytes / sizeof(float);
    std::vector<float> buf(count);
    Runner run = MakeAllreduce(flags.algo, ctx, buf.data(),
                               static_cast<int>(count));
    const int total = flags.warmup + flags.iters;
    const size_t t = static_cast<size_t>(total);
    // One all-reduce (max) of: the seconds of each iteration (the slowest
    // rank's), its start and end on the wall clock (the last rank's: its
    // span), and the wrong elements of the last one (the most any rank
    // had; a count below 2^53 is exact in a double).
    std::vector<double> v(3 * t + 1);
    double* secs = v.data();
    double* starts = v.data() + t;
    double* ends = v.data() + 2 * t;
    for (size_t it = 0; it < t; ++it) {
      FillInput(buf, r);
      gloo::BarrierAllToAll(ctx).run();
      starts[it] = bench_args::WallSeconds();
      auto t0 = std::chrono::steady_clock::now();
      run();
      secs[it] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count();
      ends[it] = bench_args::WallSeconds();
    }
    v.back() = static_cast<double>(CountWrong(buf, g));
    std::vector<double*> ptrs{v.data()};
    gloo::AllreduceRing<double>(ctx, ptrs, static_cast<int>(v.size()),
                                gloo::ReductionFunction<double>::max)
        .run();
    if (r == 0) {
      std::vector<double> spans;
      for (size_t it = static_cast<size_t>(flags.warmup); it < t; ++it) {
        spans.push_back(ends[it] - starts[it]);
      }
      PrintRow(flags, bytes, std::vector<double>(secs, secs + t),
               static_cast<size_t>(v.back()), std::move(spans));
    }
  }
  // Rank 0 lets the others go once it needs nothing more from them: a
  // rank that exits closes its connections, and Gloo fails a rank that
  // still waits on one of them ("Connection closed by peer").
  int done = 1;
  gloo::BroadcastOneToAll<int>(ctx, {&done}, 1, /*rootRank=*/0).run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  return flags.rank >= 0 ? RunProcess(flags) : RunThreads(flags);
}
