// Open MPI's MPI_Allreduce (or, with --coll, MPI_Bcast, MPI_Reduce,
// MPI_Gather, MPI_Scatter or MPI_Alltoall, rooted at rank 0), measured the way
// gloo_bench.cc measures Gloo's and `halkactl bench --coll` measures
// halka's, so that bench/compare/compare.sh can print them side by side.
// The size is the whole buffer, as in nccl-tests (a gather's result, a
// scatter's input, an all-to-all's buffer); busbw uses nccl-tests' factors
// (all-reduce 2(G-1)/G, reduce 1, the others (G-1)/G).
//
// G ranks are G processes started by mpirun (on one host; the transport is
// mpirun's choice: compare.sh runs it once with `--mca btl tcp,self` over
// loopback and once with `--mca btl vader,self`, shared memory). The
// all-reduce is MPI_Allreduce(MPI_IN_PLACE, ..., MPI_FLOAT, MPI_SUM) with
// Open MPI's own default algorithm choice (coll/tuned's decision rules; no
// tuning flags). Per size: warm-up iterations, then timed iterations; each
// iteration refills the input, starts together on every rank (MPI_Barrier),
// and its time is the slowest rank's. Output (rank 0): one JSON object per
// size with the fields gloo_bench and halkactl bench --json print (time_us,
// algbw_gbs, busbw_gbs = algbw · 2(G-1)/G, wrong), and the iterations'
// spans on the wall clock, from the last rank's start to the last rank's
// end (span_median_us, span_min_us, span_max_us: what
// bench/scaling/multihost_latency.sh compares with halka's, whose ranks
// share one kernel's clock; the slowest rank's time also holds its wait
// for a rank that left the barrier later, up to one hop); --table prints
// halkactl bench's table instead.
//
//   mpirun -np 4 mpi_bench --min=1M --max=64M --factor=4 --iters=5 --warmup=1
//              [--label=tcp] [--world=4] [--coll=allreduce] [--table]
//
// --label names the run in the algo field ("mpi-tcp"); --world, when given,
// must equal the number of ranks mpirun started (a check, not a setting).
// Each rank's float32 input is (i % 97) + rank (small integers, so every
// sum is exact and the reference is exact too); `wrong` counts elements of
// any rank that differ from the reference.
// The C API only (Open MPI's C++ bindings warn under -Wextra).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_args.h"

namespace {

struct Flags : bench_args::SizeFlags {  // world 0: whatever mpirun started
  std::string label = "default";
  std::string coll = "allreduce";
  bool table = false;
};

[[noreturn]] void Usage(const char* why) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::fprintf(stderr,
                 "mpi_bench: %s\nusage: mpirun -np G mpi_bench [--world=G] "
                 "[--min=BYTES] [--max=BYTES] [--factor=F] [--iters=N] "
                 "[--warmup=N] [--label=NAME] [--coll=C] [--table]\n",
                 why);
  }
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--table") {
      f.table = true;
      continue;
    }
    auto [key, value] = bench_args::SplitFlag(arg, Usage);
    if (bench_args::ParseSizeFlag(key, value, f, Usage)) continue;
    if (key == "label") f.label = value;
    else if (key == "coll") f.coll = value;
    else Usage(("unknown flag: --" + key).c_str());
  }
  if (f.min_bytes < 4 || f.min_bytes > f.max_bytes) Usage("bad size range");
  if (f.coll != "allreduce" && f.coll != "broadcast" && f.coll != "reduce" &&
      f.coll != "gather" && f.coll != "scatter" && f.coll != "alltoall") {
    Usage("--coll is allreduce, broadcast, reduce, gather, scatter or alltoall");
  }
  // One MPI_Allreduce call takes an int count.
  if (f.max_bytes / sizeof(float) > static_cast<size_t>(2147483647)) {
    Usage("--max is past 2^31 floats");
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, g = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g);
  const Flags flags = ParseFlags(argc, argv);
  if (flags.world != 0 && flags.world != g) {
    Usage(("--world=" + std::to_string(flags.world) + " but mpirun started " +
           std::to_string(g) + " ranks")
              .c_str());
  }
  const std::string algo = "mpi-" + flags.label;
  if (rank == 0 && flags.table) {
    std::printf("%12s %12s %9s %6s %6s %12s %9s %9s %7s\n", "size", "count",
                "type", "redop", "algo", "time(us)", "algbw", "busbw",
                "#wrong");
    std::fflush(stdout);
  }

  const std::string& coll = flags.coll;
  const bool sliced = coll == "gather" || coll == "scatter" || coll == "alltoall";
  for (size_t bytes = flags.min_bytes; bytes <= flags.max_bytes;
       bytes *= static_cast<size_t>(flags.factor)) {
    // The size is the whole buffer (nccl-tests'): a gather's result, a
    // scatter's input, an all-to-all's buffer, G slices of `slice`.
    const size_t slice = sliced ? bytes / sizeof(float) / static_cast<size_t>(g) : 0;
    const size_t count = sliced ? slice * static_cast<size_t>(g) : bytes / sizeof(float);
    std::vector<float> buf(count), out(count);
    const int total = flags.warmup + flags.iters;
    std::vector<double> secs(total), slowest(total);
    // Each iteration's start and end on the wall clock (one clock where
    // the ranks share a kernel: network namespaces), for its span.
    std::vector<double> wall(2 * static_cast<size_t>(total)),
        last(2 * static_cast<size_t>(total));
    std::string error;
    for (int it = 0; it < total; ++it) {
      for (size_t i = 0; i < count; ++i) {
        buf[i] = bench_args::Input(i, coll == "scatter" ? 0 : rank);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      wall[2 * static_cast<size_t>(it)] = bench_args::WallSeconds();
      const int n = static_cast<int>(count), s = static_cast<int>(slice);
      int rc;
      if (coll == "broadcast") {  // rank 0's buffer into every rank's
        rc = MPI_Bcast(buf.data(), n, MPI_FLOAT, 0, MPI_COMM_WORLD);
      } else if (coll == "reduce") {
        rc = MPI_Reduce(buf.data(), out.data(), n, MPI_FLOAT, MPI_SUM, 0,
                        MPI_COMM_WORLD);
      } else if (coll == "gather") {  // each rank's first slice to rank 0
        rc = MPI_Gather(buf.data(), s, MPI_FLOAT, out.data(), s, MPI_FLOAT, 0,
                        MPI_COMM_WORLD);
      } else if (coll == "scatter") {
        rc = MPI_Scatter(buf.data(), s, MPI_FLOAT, out.data(), s, MPI_FLOAT,
                         0, MPI_COMM_WORLD);
      } else if (coll == "alltoall") {
        rc = MPI_Alltoall(buf.data(), s, MPI_FLOAT, out.data(), s, MPI_FLOAT,
                          MPI_COMM_WORLD);
      } else {
        rc = MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM,
                           MPI_COMM_WORLD);
      }
      secs[it] = MPI_Wtime() - t0;
      wall[2 * static_cast<size_t>(it) + 1] = bench_args::WallSeconds();
      if (rc != MPI_SUCCESS && error.empty()) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        error.assign(text, static_cast<size_t>(len));
      }
    }
    // Check the last iteration's result against the exact reference.
    unsigned long long wrong = 0, nwrong = 0;
    const size_t r = static_cast<size_t>(rank);
    for (size_t i = 0; i < count; ++i) {
      const size_t k = sliced ? i / slice : 0, j = sliced ? i % slice : i;
      if (coll == "allreduce") {
        if (buf[i] != bench_args::Expected(i, g)) ++wrong;
      } else if (coll == "broadcast") {  // rank 0's input everywhere
        if (buf[i] != bench_args::Input(i, 0)) ++wrong;
      } else if (coll == "reduce") {
        if (rank == 0 && out[i] != bench_args::Expected(i, g)) ++wrong;
      } else if (coll == "gather") {  // slice k: rank k's first slice
        if (rank == 0 && out[i] != bench_args::Input(j, static_cast<int>(k))) ++wrong;
      } else if (coll == "scatter") {  // rank r: slice r of rank 0's
        if (i < slice && out[i] != bench_args::Input(r * slice + i, 0)) ++wrong;
      } else {  // alltoall, slice k: rank k's slice r
        if (out[i] != bench_args::Input(r * slice + j, static_cast<int>(k))) ++wrong;
      }
    }
    MPI_Reduce(secs.data(), slowest.data(), total, MPI_DOUBLE, MPI_MAX, 0,
               MPI_COMM_WORLD);
    MPI_Reduce(wall.data(), last.data(), 2 * total, MPI_DOUBLE, MPI_MAX, 0,
               MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &nwrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0,
               MPI_COMM_WORLD);
    if (rank != 0) continue;
    double sum = 0;
    for (int it = flags.warmup; it < total; ++it) sum += slowest[it];
    const double t = sum / flags.iters;
    // The span of each timed iteration: from the last rank's start to the
    // last rank's end (what halka's multi-host cells measure); a rank that
    // left the barrier early does not count its wait for the others.
    std::vector<double> spans;
    for (int it = flags.warmup; it < total; ++it) {
      spans.push_back(last[2 * static_cast<size_t>(it) + 1] -
                      last[2 * static_cast<size_t>(it)]);
    }
    const double span_median = bench_args::SortAndMedian(spans);
    const double algbw = static_cast<double>(count * sizeof(float)) / t / 1e9;
    // nccl-tests' bus-bandwidth factors.
    const double factor = coll == "allreduce" ? 2.0 * (g - 1) / g
                          : coll == "reduce" || coll == "broadcast"
                              ? 1.0
                                              : static_cast<double>(g - 1) / g;
    const double busbw = algbw * factor;
    if (flags.table) {
      std::printf("%12zu %12zu %9s %6s %6s %12.1f %9.3f %9.3f %7llu%s%s\n",
                  count * sizeof(float), count, "float32",
                  sliced || coll == "broadcast" ? "none" : "sum",
                  algo.c_str(), t * 1e6,
                  algbw, busbw, nwrong, error.empty() ? "" : "  FAILED: ",
                  error.c_str());
    } else {
      for (char& c : error) {
        if (c == '"' || c == '\\') c = '\'';
      }
      std::printf(
          "{\"coll\":\"%s\",\"size\":%zu,\"count\":%zu,\"type\":\"float32\","
          "\"redop\":\"%s\",\"algo\":\"%s\",\"world_size\":%d,"
          "\"time_us\":%.3f,\"span_median_us\":%.3f,\"span_min_us\":%.3f,"
          "\"span_max_us\":%.3f,\"algbw_gbs\":%.6f,\"busbw_gbs\":%.6f,"
          "\"wrong\":%llu,\"error\":\"%s\"}\n",
          coll.c_str(), count * sizeof(float), count,
          sliced || coll == "broadcast" ? "none" : "sum",
          algo.c_str(), g, t * 1e6, span_median * 1e6, spans.front() * 1e6,
          spans.back() * 1e6, algbw, busbw, nwrong, error.c_str());
    }
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
