// Gloo's ring all-reduce, measured the way `halkactl bench` measures halka's,
// so that bench/compare/compare.sh can print the two side by side.
//
// G ranks run as G threads of this process, each with its own Gloo context
// and TCP device on loopback (as halkactl bench runs G embedded workers in
// one process). Per size: warm-up iterations, then timed iterations; each
// iteration starts together on every rank (a barrier), and its time is the
// slowest rank's. Output: one JSON object per size, with the same fields
// halkactl bench --json prints (time_us, algbw_gbs, busbw_gbs, wrong).
//
//   gloo_bench --world=4 --min=1M --max=64M --factor=4 --iters=5 --warmup=1
//              [--algo=ring_chunked|ring|halving_doubling]
//
// Each rank's float32 input is (i % 97) + rank (small integers, so every
// sum is exact and the reference is exact too); `wrong` counts elements of
// any rank that differ from the reference.
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"

namespace {

struct Flags : bench_args::SizeFlags {
  Flags() { world = 4; }
  std::string algo = "ring_chunked";
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "gloo_bench: %s\nusage: gloo_bench [--world=G] [--min=BYTES] "
               "[--max=BYTES] [--factor=F] [--iters=N] [--warmup=N] "
               "[--algo=ring_chunked|ring|halving_doubling]\n",
               why);
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    auto [key, value] = bench_args::SplitFlag(argv[i], Usage);
    if (bench_args::ParseSizeFlag(key, value, f, Usage)) continue;
    if (key == "algo") f.algo = value;
    else Usage(("unknown flag: --" + key).c_str());
  }
  if (f.algo != "ring_chunked" && f.algo != "ring" &&
      f.algo != "halving_doubling") {
    Usage(("unknown algorithm: " + f.algo).c_str());
  }
  if (f.min_bytes < 4 || f.min_bytes > f.max_bytes) Usage("bad size range");
  return f;
}

std::unique_ptr<gloo::Algorithm> MakeAllreduce(
    const std::string& algo, const std::shared_ptr<gloo::Context>& ctx,
    float* data, int count) {
  std::vector<float*> ptrs{data};
  if (algo == "ring") {
    return std::make_unique<gloo::AllreduceRing<float>>(ctx, ptrs, count);
  }
  if (algo == "halving_doubling") {
    return std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx, ptrs,
                                                                   count);
  }
  return std::make_unique<gloo::AllreduceRingChunked<float>>(ctx, ptrs, count);
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  const int g = flags.world;
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::shared_ptr<gloo::Context>> contexts(g);
  {
    std::vector<std::thread> joiners;
    for (int r = 0; r < g; ++r) {
      joiners.emplace_back([&, r] {
        gloo::transport::tcp::attr attr("127.0.0.1");
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(r, g);
        ctx->setTimeout(std::chrono::seconds(120));
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
    std::vector<std::unique_ptr<gloo::Algorithm>> algos(g);
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
          for (size_t i = 0; i < count; ++i) {
            bufs[r][i] = bench_args::Input(i, r);
          }
          sync.arrive_and_wait();
          auto t0 = std::chrono::steady_clock::now();
          algos[r]->run();
          secs[it][r] = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
        }
        // Check the last iteration's result against the exact reference.
        for (size_t i = 0; i < count; ++i) {
          if (bufs[r][i] != bench_args::Expected(i, g)) ++wrong[r];
        }
      });
    }
    for (auto& t : ranks) t.join();
    double sum = 0;
    for (int it = flags.warmup; it < total; ++it) {
      sum += *std::max_element(secs[it].begin(), secs[it].end());
    }
    const double t = sum / flags.iters;
    const double algbw = static_cast<double>(bytes) / t / 1e9;
    const double busbw = algbw * 2.0 * (g - 1) / g;
    size_t nwrong = 0;
    for (size_t w : wrong) nwrong += w;
    std::printf(
        "{\"size\":%zu,\"count\":%zu,\"type\":\"float32\",\"redop\":\"sum\","
        "\"algo\":\"gloo-%s\",\"world_size\":%d,\"time_us\":%.3f,"
        "\"algbw_gbs\":%.6f,\"busbw_gbs\":%.6f,\"wrong\":%zu,\"error\":\"\"}\n",
        bytes, count, flags.algo.c_str(), g, t * 1e6, algbw, busbw, nwrong);
    std::fflush(stdout);
  }
  return 0;
}
