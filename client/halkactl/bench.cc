#include "client/halkactl/bench.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/cuda/cuda_reduce.h"
#include "core/dtype.h"
#include "core/frame.h"
#include "core/testing/reference.h"

namespace halka {
namespace {

// A reusable barrier for the rank threads of one case.
class CyclicBarrier {
 public:
  explicit CyclicBarrier(int n) : n_(n) {}
  void Wait() {
    absl::MutexLock lock(&mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      return;
    }
    auto passed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return generation_ != gen;
    };
    mu_.Await(absl::Condition(&passed));
  }

 private:
  const int n_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

double BusBandwidthFactor(OpKind kind, int world_size) {
  const double g = world_size;
  switch (kind) {
    case OpKind::kAllReduce:
      return 2.0 * (g - 1) / g;
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
      return (g - 1) / g;
    case OpKind::kBroadcast:
      return 1.0;
    case OpKind::kBarrier:
      break;
  }
  return 0;
}

absl::StatusOr<OpKind> ParseCollective(const std::string& name) {
  if (name == "allreduce") return OpKind::kAllReduce;
  if (name == "allgather") return OpKind::kAllGather;
  if (name == "reducescatter") return OpKind::kReduceScatter;
  if (name == "broadcast") return OpKind::kBroadcast;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown collective '", name,
      "' (expected allreduce, allgather, reducescatter or broadcast)"));
}

namespace {

// Elements of `got` (count of them) that differ in any bit from `want`.
size_t BitwiseDifferences(const uint8_t* got, const uint8_t* want,
                          size_t count, size_t es) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(got + i * es, want + i * es, es) != 0) ++wrong;
  }
  return wrong;
}

}  // namespace

BenchRow RunBenchCase(const std::vector<Client*>& clients, const BenchCase& c,
                      const BenchOptions& options) {
  const int g = static_cast<int>(clients.size());
  const size_t es = DTypeSize(c.dtype);
  const bool sliced =
      c.kind == OpKind::kAllGather || c.kind == OpKind::kReduceScatter;
  BenchRow row;
  row.c = c;
  row.algorithm = std::string(AlgorithmName(c.algorithm));
  // An all-gather's or reduce-scatter's buffer is G equal slices.
  const size_t slice = sliced ? c.bytes / es / static_cast<size_t>(g) : 0;
  row.count = sliced ? slice * static_cast<size_t>(g) : c.bytes / es;
  const size_t bytes = row.count * es;
  const size_t slice_bytes = slice * es;
  // Each rank's input: an all-gather's slice, otherwise the whole buffer.
  const size_t input_count = c.kind == OpKind::kAllGather ? slice : row.count;
  std::vector<std::vector<uint8_t>> inputs(static_cast<size_t>(g));
  std::vector<HostBuffer> shared(static_cast<size_t>(g));
  std::vector<std::vector<uint8_t>> plain(static_cast<size_t>(g));
  std::vector<uint8_t*> bufs(static_cast<size_t>(g));
  // A reduce-scatter's result (one slice), apart from its input.
  std::vector<std::vector<uint8_t>> outs(static_cast<size_t>(g));
  std::vector<CudaBuffer> device(static_cast<size_t>(g));
  std::vector<CudaBuffer> device_out(static_cast<size_t>(g));
  for (int r = 0; r < g; ++r) {
    inputs[r] = MakeRankData(c.dtype, c.op, input_count, r, options.seed);
    if (c.kind == OpKind::kReduceScatter) {
      outs[r].resize(std::max<size_t>(slice_bytes, 1));
    }
    if (options.device && bytes > 0) {
      auto d = CudaBuffer::Allocate(bytes);
      auto o = CudaBuffer::Allocate(std::max<size_t>(slice_bytes, 1));
      if (!d.ok() || !o.ok()) {
        row.error = (d.ok() ? o.status() : d.status()).ToString();
        return row;
      }
      device[r] = std::move(*d);
      device_out[r] = std::move(*o);
    }
    bool have_shared = false;
    if (options.zero_copy && bytes > 0) {
      auto hb = clients[r]->AllocateHostBuffer(bytes);
      if (hb.ok()) {
        shared[r] = std::move(*hb);
        bufs[r] = static_cast<uint8_t*>(shared[r].data());
        have_shared = true;
      }
    }
    if (!have_shared) {
      plain[r].resize(std::max<size_t>(bytes, 1));
      bufs[r] = plain[r].data();
    }
  }
  // One operation of rank r on its buffer (host or device); an all-gather
  // runs in place (the input already in slice r).
  auto run_once = [&](int r, const OpOptions& oo) -> absl::StatusOr<OpInfo> {
    Client& cl = *clients[r];
    uint8_t* buf = options.device ? static_cast<uint8_t*>(device[r].data())
                                  : bufs[r];
    uint8_t* out = options.device
                       ? static_cast<uint8_t*>(device_out[r].data())
                       : outs[r].data();
    switch (c.kind) {
      case OpKind::kAllGather: {
        const uint8_t* send = buf + static_cast<size_t>(r) * slice_bytes;
        return options.device
                   ? cl.AllGatherDevice(send, slice, buf, row.count, c.dtype, oo)
                   : cl.AllGather(send, slice, buf, row.count, c.dtype, oo);
      }
      case OpKind::kReduceScatter:
        return options.device ? cl.ReduceScatterDevice(buf, row.count, out,
                                                       slice, c.dtype, c.op, oo)
                              : cl.ReduceScatter(buf, row.count, out, slice,
                                                 c.dtype, c.op, oo);
      case OpKind::kBroadcast:
        return options.device
                   ? cl.BroadcastDevice(buf, row.count, c.dtype, 0, oo)
                   : cl.Broadcast(buf, row.count, c.dtype, 0, oo);
      default:
        return options.device
                   ? cl.AllReduceDevice(buf, row.count, c.dtype, c.op, oo)
                   : cl.AllReduce(buf, row.count, c.dtype, c.op, oo);
    }
  };
  const int total = options.warmup + options.iterations;
  std::vector<std::vector<double>> times(static_cast<size_t>(g),
                                         std::vector<double>(total, 0));
  std::vector<std::string> errors(static_cast<size_t>(g));
  std::vector<OpInfo> infos(static_cast<size_t>(g));
  CyclicBarrier barrier(g);
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    threads.emplace_back([&, r] {
      bool failed = false;
      auto fail = [&](const absl::Status& s) {
        if (!s.ok() && !failed) {
          errors[r] = s.ToString();
          failed = true;
        }
      };
      // An all-gather's input goes to slice r (in place).
      const size_t at = c.kind == OpKind::kAllGather
                            ? static_cast<size_t>(r) * slice_bytes
                            : 0;
      for (int i = 0; i < total; ++i) {
        // Fresh inputs every time (outside the timed region) so that values
        // never drift out of range and the last result can be checked.
        if (bytes > 0) std::memcpy(bufs[r] + at, inputs[r].data(), inputs[r].size());
        if (options.device && bytes > 0 && !failed) {
          fail(CudaCopyToDevice(device[r].data(), bufs[r], bytes));
        }
        // One barrier per operation, before it, as gloo_bench does: every
        // rank starts together and the operation's time is the slowest
        // rank's. (None after it: a rank's buffer is its own again once
        // its call returned, so the next copy needs no wait.)
        barrier.Wait();
        const absl::Time t0 = absl::Now();
        if (!failed) {
          OpOptions oo;
          oo.timeout = options.timeout;
          oo.algorithm = c.algorithm;
          absl::StatusOr<OpInfo> res = run_once(r, oo);
          fail(res.status());
          if (res.ok()) infos[r] = *res;
        }
        times[r][i] = absl::ToDoubleMicroseconds(absl::Now() - t0);
        if (options.device && bytes > 0 && !failed && i + 1 == total) {
          fail(c.kind == OpKind::kReduceScatter
                   ? CudaCopyToHost(outs[r].data(), device_out[r].data(),
                                    slice_bytes)
                   : CudaCopyToHost(bufs[r], device[r].data(), bytes));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < g; ++r) {
    if (!errors[r].empty()) {
      row.error = absl::StrCat("rank ", r, ": ", errors[r]);
      row.wrong = row.count;
      return row;
    }
  }
  double sum = 0;
  for (int i = options.warmup; i < total; ++i) {
    double slowest = 0;
    for (int r = 0; r < g; ++r) slowest = std::max(slowest, times[r][i]);
    sum += slowest;
  }
  row.time_us = options.iterations > 0 ? sum / options.iterations : 0;
  row.algorithm = infos[0].algorithm.empty()
                      ? std::string(AlgorithmName(c.algorithm))
                      : infos[0].algorithm;
  row.bytes_sent = infos[0].bytes_sent;
  row.bytes_received = infos[0].bytes_received;
  if (row.time_us > 0) {
    row.algbw_gbs = static_cast<double>(bytes) / (row.time_us * 1e3);
    row.busbw_gbs = row.algbw_gbs * BusBandwidthFactor(c.kind, g);
  }
  if (options.check) {
    for (int r = 0; r < g; ++r) {
      switch (c.kind) {
        case OpKind::kAllGather:
          row.wrong += CheckAllGather(c.dtype, inputs, bufs[r], slice).wrong;
          break;
        case OpKind::kReduceScatter:
          row.wrong += CheckReduceScatter(c.dtype, c.op, inputs,
                                          outs[r].data(), r, slice)
                           .wrong;
          break;
        case OpKind::kBroadcast:
          row.wrong += BitwiseDifferences(bufs[r], inputs[0].data(),
                                          row.count, es);
          break;
        default:
          // Rank 0 against the reference, every other rank against rank 0.
          row.wrong += r == 0 ? CheckAllReduce(c.dtype, c.op, inputs, bufs[0],
                                               row.count)
                                    .wrong
                              : BitwiseDifferences(bufs[r], bufs[0],
                                                   row.count, es);
          break;
      }
    }
  }
  return row;
}

std::string BenchHeader() {
  return absl::StrFormat("%12s %12s %9s %6s %6s %12s %9s %9s %7s", "size",
                         "count", "type", "redop", "algo", "time(us)",
                         "algbw", "busbw", "#wrong");
}

namespace {

// The redop column: "none" where the collective reduces nothing.
absl::string_view RedopName(const BenchCase& c) {
  return c.kind == OpKind::kAllReduce || c.kind == OpKind::kReduceScatter
             ? ReduceOpName(c.op)
             : "none";
}

}  // namespace

std::string FormatBenchRow(const BenchRow& row) {
  if (!row.error.empty()) {
    return absl::StrFormat("%12d %12d %9s %6s %6s  FAILED: %s", row.c.bytes,
                           row.count, DTypeName(row.c.dtype),
                           RedopName(row.c), row.algorithm, row.error);
  }
  return absl::StrFormat("%12d %12d %9s %6s %6s %12.1f %9.3f %9.3f %7d",
                         row.count * DTypeSize(row.c.dtype), row.count,
                         DTypeName(row.c.dtype), RedopName(row.c),
                         row.algorithm, row.time_us, row.algbw_gbs,
                         row.busbw_gbs, row.wrong);
}

std::string BenchRowJson(const BenchRow& row, int world_size) {
  return absl::StrFormat(
      "{\"coll\":\"%s\",\"size\":%d,\"count\":%d,\"type\":\"%s\","
      "\"redop\":\"%s\","
      "\"algo\":\"%s\",\"world_size\":%d,\"time_us\":%.3f,\"algbw_gbs\":%.6f,"
      "\"busbw_gbs\":%.6f,\"wrong\":%d,\"bytes_sent_rank0\":%d,"
      "\"error\":\"%s\"}",
      absl::StrReplaceAll(OpKindName(row.c.kind), {{"_", ""}}),
      row.count * DTypeSize(row.c.dtype), row.count, DTypeName(row.c.dtype),
      RedopName(row.c), row.algorithm, world_size, row.time_us,
      row.algbw_gbs, row.busbw_gbs, row.wrong, row.bytes_sent,
      absl::StrReplaceAll(row.error, {{"\\", "\\\\"}, {"\"", "\\\""}}));
}

absl::StatusOr<size_t> ParseBytes(const std::string& text) {
  std::string t = absl::AsciiStrToUpper(text);
  size_t mult = 1;
  if (!t.empty() && (t.back() == 'B')) t.pop_back();
  if (!t.empty()) {
    switch (t.back()) {
      case 'K':
        mult = size_t{1} << 10;
        break;
      case 'M':
        mult = size_t{1} << 20;
        break;
      case 'G':
        mult = size_t{1} << 30;
        break;
      default:
        break;
    }
    if (mult != 1) t.pop_back();
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(t, &n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not a byte count (examples: 8, 4K, 64M, 1G)"));
  }
  return static_cast<size_t>(n * mult);
}

}  // namespace halka
