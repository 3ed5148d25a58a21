// Throughput of the CUDA reducers (core/cuda/cuda_reduce.h) next to a
// device-to-device cudaMemcpy of the same buffer, timed with CUDA events.
//
//   halka_cuda_reduce_bench [--min_mib=1] [--max_mib=1024] [--factor=4]
//                           [--dtypes=float32,bfloat16,...] [--ops=sum,...]
//                           [--target_ms=20] [--device=0] [--no_finalize]
//                           [--finalize_divisor=3]
//
// Bandwidth counts the bytes read and written: a reduce reads dst and src
// and writes dst (3 x buffer bytes), a copy or CudaFinalizeAvg reads and
// writes once (2 x buffer bytes). GB/s is 1e9 bytes per second. Each cell is
// the best of three timed batches; a batch repeats the call enough times to
// run about --target_ms (at least 3 calls), after warm-up calls.
//
// Not a test: it checks no results (the tests in tests/cuda do) and the
// buffer contents drift as the same dst is reduced into again and again,
// which costs the GPU nothing extra (no slow paths for inf, NaN or
// subnormals).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/cuda/cuda_reduce.h"
#include "core/dtype.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;

#define CHECK_CUDA(expr)                                                     \
  do {                                                                       \
    const cudaError_t err_ = (expr);                                         \
    if (err_ != cudaSuccess) {                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,     \
                   cudaGetErrorString(err_));                                \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

void CheckOk(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

struct Options {
  size_t min_mib = 1;
  size_t max_mib = 1024;
  size_t factor = 4;
  double target_ms = 20;
  int device = 0;
  bool finalize = true;
  // -1 keeps float data from drifting toward zero over the repeated calls
  // (x / -1 alternates the sign) and costs a float the same instructions as
  // any other divisor; integers negate instead of dividing.
  int finalize_divisor = 3;
  std::vector<halka::DType> dtypes;
  std::vector<halka::ReduceOp> ops;
};

std::vector<std::string> Split(const std::string& list) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    if (end > begin) parts.push_back(list.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--min_mib=1] [--max_mib=1024] [--factor=4] "
               "[--dtypes=a,b] [--ops=a,b] [--target_ms=20] [--device=0] "
               "[--no_finalize] [--finalize_divisor=3]\n",
               argv0);
  std::exit(2);
}

Options ParseArgs(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--min_mib") {
      options.min_mib = std::strtoull(value.c_str(), nullptr, 10);
    } else if (key == "--max_mib") {
      options.max_mib = std::strtoull(value.c_str(), nullptr, 10);
    } else if (key == "--factor") {
      options.factor = std::strtoull(value.c_str(), nullptr, 10);
    } else if (key == "--target_ms") {
      options.target_ms = std::strtod(value.c_str(), nullptr);
    } else if (key == "--device") {
      options.device = std::atoi(value.c_str());
    } else if (key == "--no_finalize") {
      options.finalize = false;
    } else if (key == "--finalize_divisor") {
      options.finalize_divisor = std::atoi(value.c_str());
    } else if (key == "--dtypes") {
      for (const std::string& name : Split(value)) {
        auto dtype = halka::ParseDType(name);
        if (!dtype.ok()) Usage(argv[0]);
        options.dtypes.push_back(*dtype);
      }
    } else if (key == "--ops") {
      for (const std::string& name : Split(value)) {
        auto op = halka::ParseReduceOp(name);
        if (!op.ok()) Usage(argv[0]);
        options.ops.push_back(*op);
      }
    } else {
      Usage(argv[0]);
    }
  }
  if (options.finalize_divisor == 0 || options.finalize_divisor == 1) {
    Usage(argv[0]);  // CudaFinalizeAvg leaves the buffer alone: nothing to time
  }
  if (options.min_mib == 0 || options.max_mib < options.min_mib ||
      options.factor < 2 || options.target_ms <= 0) {
    Usage(argv[0]);
  }
  if (options.dtypes.empty()) {
    options.dtypes.assign(std::begin(halka::kAllDTypes),
                          std::end(halka::kAllDTypes));
  }
  if (options.ops.empty()) {
    options.ops.assign(std::begin(halka::kAllReduceOps),
                       std::end(halka::kAllReduceOps));
  }
  return options;
}

// Runs `call` (which enqueues one operation on `stream`) and returns the
// best mean milliseconds per call over three batches.
template <typename Call>
double TimeMs(cudaStream_t stream, double target_ms, Call call) {
  cudaEvent_t start;
  cudaEvent_t stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  // Warm up, and estimate one call's time to size the batches.
  call();
  CHECK_CUDA(cudaEventRecord(start, stream));
  call();
  call();
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  const double estimate = std::max(1e-3, ms / 2.0);
  const int iters = static_cast<int>(
      std::min(1000.0, std::max(3.0, target_ms / estimate)));
  double best = 1e30;
  for (int batch = 0; batch < 3; ++batch) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) call();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, static_cast<double>(ms) / iters);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return best;
}

double GBps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

std::string SizeName(size_t bytes) {
  char text[32];
  if (bytes >= 1024 * kMiB && bytes % (1024 * kMiB) == 0) {
    std::snprintf(text, sizeof(text), "%zu GiB", bytes / (1024 * kMiB));
  } else {
    std::snprintf(text, sizeof(text), "%zu MiB", bytes / kMiB);
  }
  return text;
}

// One timed kernel: a dtype's reduction or finalize_avg at one size.
struct Row {
  size_t bytes;
  std::string dtype, op;
  double gbps, copy_gbps;
};

// Times the copy, then every dtype's reductions (and finalize_avg), on
// `bytes` of dst and src; prints each and adds it to rows.
void TimeSize(cudaStream_t stream, const Options& options, void* dst,
              void* src, size_t bytes, std::vector<Row>& rows) {
  const double copy_ms = TimeMs(stream, options.target_ms, [&] {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                               stream));
  });
  const double copy_gbps = GBps(2.0 * bytes, copy_ms);
  std::printf("%-9s %-9s %-13s %12.2f %10.1f %7.0f%%\n",
              SizeName(bytes).c_str(), "-", "memcpy d2d", copy_ms * 1e3,
              copy_gbps, 100.0);
  for (halka::DType dtype : options.dtypes) {
    const size_t n = bytes / halka::DTypeSize(dtype);
    for (halka::ReduceOp op : options.ops) {
      const double ms = TimeMs(stream, options.target_ms, [&] {
        CheckOk(halka::CudaReduceInto(dtype, op, dst, src, n, stream),
                "CudaReduceInto");
      });
      const double gbps = GBps(3.0 * bytes, ms);
      std::printf("%-9s %-9s %-13s %12.2f %10.1f %7.0f%%\n",
                  SizeName(bytes).c_str(),
                  std::string(halka::DTypeName(dtype)).c_str(),
                  std::string(halka::ReduceOpName(op)).c_str(), ms * 1e3,
                  gbps, 100.0 * gbps / copy_gbps);
      rows.push_back({bytes, std::string(halka::DTypeName(dtype)),
                      std::string(halka::ReduceOpName(op)), gbps,
                      copy_gbps});
    }
    if (options.finalize) {
      // Fresh operands: the reductions above leave dst at infinities or
      // zeros, which would time the slow or the trivial cases. (Repeated
      // division still drifts toward zero within the batches.)
      CHECK_CUDA(cudaMemsetAsync(dst, 0x3c, bytes, stream));
      const double ms = TimeMs(stream, options.target_ms, [&] {
        CheckOk(halka::CudaFinalizeAvg(dtype, dst, n,
                                       options.finalize_divisor, stream),
                "CudaFinalizeAvg");
      });
      const double gbps = GBps(2.0 * bytes, ms);
      std::printf("%-9s %-9s %-13s %12.2f %10.1f %7.0f%%\n",
                  SizeName(bytes).c_str(),
                  std::string(halka::DTypeName(dtype)).c_str(),
                  "finalize_avg", ms * 1e3, gbps, 100.0 * gbps / copy_gbps);
      rows.push_back({bytes, std::string(halka::DTypeName(dtype)),
                      "finalize_avg", gbps, copy_gbps});
    }
  }
}

// Summary: the largest size, as a fraction of the copy bandwidth.
void PrintSummary(const std::vector<Row>& rows) {
  if (!rows.empty()) {
    const size_t largest = rows.back().bytes;
    std::printf("\nsummary at %s (memcpy d2d %.1f GB/s):\n",
                SizeName(largest).c_str(), rows.back().copy_gbps);
    for (const Row& row : rows) {
      if (row.bytes != largest) continue;
      std::printf("  %-9s %-13s %8.1f GB/s %5.0f%%\n", row.dtype.c_str(),
                  row.op.c_str(), row.gbps, 100.0 * row.gbps / row.copy_gbps);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = ParseArgs(argc, argv);
  auto count = halka::CudaDeviceCount();
  if (!count.ok()) {
    std::fprintf(stderr, "%s\n", count.status().ToString().c_str());
    return 1;
  }
  CHECK_CUDA(cudaSetDevice(options.device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, options.device));
  std::printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB\n",
              options.device, prop.name, prop.major, prop.minor,
              prop.multiProcessorCount,
              prop.totalGlobalMem / double(1024 * kMiB),
              prop.l2CacheSize / double(kMiB));
  std::printf("bandwidth counts bytes read + written: reduce 3x, copy and "
              "finalize_avg 2x the buffer; GB/s = 1e9 B/s; best of 3 "
              "batches\n\n");

  const size_t max_bytes = options.max_mib * kMiB;
  void* dst = nullptr;
  void* src = nullptr;
  CHECK_CUDA(cudaMalloc(&dst, max_bytes));
  CHECK_CUDA(cudaMalloc(&src, max_bytes));
  // Small positive values in every dtype (0x3c / 0x3b bytes).
  CHECK_CUDA(cudaMemset(dst, 0x3c, max_bytes));
  CHECK_CUDA(cudaMemset(src, 0x3b, max_bytes));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::printf("%-9s %-9s %-13s %12s %10s %8s\n", "size", "dtype", "op",
              "us/call", "GB/s", "vs copy");
  std::vector<Row> rows;
  for (size_t mib = options.min_mib; mib <= options.max_mib;
       mib *= options.factor) {
    TimeSize(stream, options, dst, src, mib * kMiB, rows);
    std::fflush(stdout);
    if (mib > options.max_mib / options.factor) break;  // no overflow
  }
  CheckOk(halka::CudaSynchronize(stream), "CudaSynchronize");

  PrintSummary(rows);
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaFree(dst));
  CHECK_CUDA(cudaFree(src));
  return 0;
}
