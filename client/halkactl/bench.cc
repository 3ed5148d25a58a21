#include "client/halkactl/bench.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
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
  // The last to arrive releases the others, who poll (yielding their core
  // to whatever else may run) for up to kPoll and only then sleep: ranks
  // leave within microseconds of each other, as MPI_Barrier's polling
  // ranks do, so an operation's time is not the barrier's wake-ups.
  void Wait() {
    const uint64_t gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      {
        absl::MutexLock lock(&mu_);
        generation_.store(gen + 1, std::memory_order_release);
      }
      return;
    }
    const absl::Time until = halka::Now() + kPoll;
    while (generation_.load(std::memory_order_acquire) == gen) {
      if (halka::Now() >= until) {
        absl::MutexLock lock(&mu_);
        auto passed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return generation_.load(std::memory_order_acquire) != gen;
        };
        mu_.Await(absl::Condition(&passed));
        return;
      }
      sched_yield();
    }
  }

 private:
  static constexpr absl::Duration kPoll = absl::Milliseconds(2);
  const int n_;
  absl::Mutex mu_;
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
};

}  // namespace

double BusBandwidthFactor(OpKind kind, int world_size) {
  const double g = world_size;
  switch (kind) {
    case OpKind::kAllReduce:
      return 2.0 * (g - 1) / g;
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAllToAll:
      return (g - 1) / g;
    case OpKind::kBroadcast:
    case OpKind::kReduce:
    case OpKind::kSend:  // sendrecv
      return 1.0;
    case OpKind::kBarrier:
    case OpKind::kRecv:
      break;
  }
  return 0;
}

std::string CollectiveName(OpKind kind) {
  if (kind == OpKind::kSend) return "sendrecv";
  return absl::StrReplaceAll(OpKindName(kind), {{"_", ""}});
}

absl::StatusOr<OpKind> ParseCollective(const std::string& name) {
  if (name == "allreduce") return OpKind::kAllReduce;
  if (name == "allgather") return OpKind::kAllGather;
  if (name == "reducescatter") return OpKind::kReduceScatter;
  if (name == "broadcast") return OpKind::kBroadcast;
  if (name == "sendrecv") return OpKind::kSend;
  if (name == "reduce") return OpKind::kReduce;
  if (name == "gather") return OpKind::kGather;
  if (name == "scatter") return OpKind::kScatter;
  if (name == "alltoall") return OpKind::kAllToAll;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown collective '", name,
      "' (expected allreduce, allgather, reducescatter, broadcast, "
      "sendrecv, reduce, gather, scatter or alltoall)"));
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

// One case's buffers, by rank, and the sizes they are cut in.
struct CaseBuffers {
  size_t count = 0;        // elements of the whole buffer
  size_t slice = 0;        // elements of one slice (all-gather, reduce-scatter)
  size_t bytes = 0;
  size_t slice_bytes = 0;
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<HostBuffer> shared;
  std::vector<std::vector<uint8_t>> plain;
  std::vector<uint8_t*> bufs;
  // A reduce-scatter's result (one slice), apart from its input.
  std::vector<std::vector<uint8_t>> outs;
  // sendrecv: what a rank sends (a copy of its input; shared memory under
  // zero_copy, where it gives some), apart from where it receives.
  std::vector<HostBuffer> send_shared;
  std::vector<uint8_t*> sends;
  std::vector<CudaBuffer> device;
  std::vector<CudaBuffer> device_out;

  explicit CaseBuffers(int g)
      : inputs(static_cast<size_t>(g)),
        shared(static_cast<size_t>(g)),
        plain(static_cast<size_t>(g)),
        bufs(static_cast<size_t>(g)),
        outs(static_cast<size_t>(g)),
        send_shared(static_cast<size_t>(g)),
        sends(static_cast<size_t>(g)),
        device(static_cast<size_t>(g)),
        device_out(static_cast<size_t>(g)) {}
};

// Rank r's input (input_count elements), host buffer (the worker's shared
// memory under zero_copy, where it gives some) and device buffers; the
// first allocation that failed.
absl::Status AllocateRank(Client& client, const BenchCase& c,
                          const BenchOptions& options, size_t input_count,
                          int r, CaseBuffers& b) {
  const size_t bytes = b.bytes;
  b.inputs[r] = MakeRankData(c.dtype, c.op, input_count, r, options.seed);
  if (c.kind == OpKind::kReduceScatter || c.kind == OpKind::kScatter) {
    b.outs[r].resize(std::max<size_t>(b.slice_bytes, 1));
  }
  if (c.kind == OpKind::kReduce) b.outs[r].resize(std::max<size_t>(bytes, 1));
  if (c.kind == OpKind::kSend) {
    absl::StatusOr<HostBuffer> hb =
        options.zero_copy && bytes > 0 ? client.AllocateHostBuffer(bytes)
                                       : absl::StatusOr<HostBuffer>(
                                             absl::UnavailableError("plain"));
    if (hb.ok()) {
      b.send_shared[r] = std::move(*hb);
      b.sends[r] = static_cast<uint8_t*>(b.send_shared[r].data());
      std::memcpy(b.sends[r], b.inputs[r].data(), bytes);
    } else {
      b.sends[r] = b.inputs[r].data();
    }
  }
  if (options.device && bytes > 0) {
    auto d = CudaBuffer::Allocate(bytes);
    auto o = CudaBuffer::Allocate(std::max<size_t>(b.slice_bytes, 1));
    if (!d.ok() || !o.ok()) return d.ok() ? o.status() : d.status();
    b.device[r] = std::move(*d);
    b.device_out[r] = std::move(*o);
  }
  bool have_shared = false;
  if (options.zero_copy && bytes > 0) {
    auto hb = client.AllocateHostBuffer(bytes);
    if (hb.ok()) {
      b.shared[r] = std::move(*hb);
      b.bufs[r] = static_cast<uint8_t*>(b.shared[r].data());
      have_shared = true;
    }
  }
  if (!have_shared) {
    b.plain[r].resize(std::max<size_t>(bytes, 1));
    b.bufs[r] = b.plain[r].data();
  }
  return absl::OkStatus();
}

// One operation of rank r on its buffer (host or device); an all-gather
// runs in place (the input already in slice r).
absl::StatusOr<OpInfo> RunOnce(Client& cl, const BenchCase& c,
                               const BenchOptions& options, CaseBuffers& b,
                               int r, const OpOptions& oo) {
  const size_t count = b.count;
  const size_t slice = b.slice;
  uint8_t* buf = options.device ? static_cast<uint8_t*>(b.device[r].data())
                                : b.bufs[r];
  uint8_t* out = options.device
                     ? static_cast<uint8_t*>(b.device_out[r].data())
                     : b.outs[r].data();
  switch (c.kind) {
    case OpKind::kAllGather: {
      const uint8_t* send = buf + static_cast<size_t>(r) * b.slice_bytes;
      return options.device
                 ? cl.AllGatherDevice(send, slice, buf, count, c.dtype, oo)
                 : cl.AllGather(send, slice, buf, count, c.dtype, oo);
    }
    case OpKind::kReduceScatter:
      return options.device ? cl.ReduceScatterDevice(buf, count, out, slice,
                                                     c.dtype, c.op, oo)
                            : cl.ReduceScatter(buf, count, out, slice,
                                               c.dtype, c.op, oo);
    case OpKind::kBroadcast:
      return options.device ? cl.BroadcastDevice(buf, count, c.dtype, 0, oo)
                            : cl.Broadcast(buf, count, c.dtype, 0, oo);
    case OpKind::kReduce:
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAllToAll:
      if (options.device) {
        return absl::UnimplementedError(absl::StrCat(
            CollectiveName(c.kind),
            ": host memory only (the SDK has no device variant of it)"));
      }
      // Rooted at rank 0; a gather in place (the input in slice r), an
      // all-to-all in place.
      if (c.kind == OpKind::kReduce) {
        return cl.Reduce(buf, out, count, c.dtype, c.op, 0, oo);
      }
      if (c.kind == OpKind::kGather) {
        return cl.Gather(buf + static_cast<size_t>(r) * b.slice_bytes, slice,
                         buf, count, c.dtype, 0, oo);
      }
      if (c.kind == OpKind::kScatter) {
        return cl.Scatter(buf, count, out, slice, c.dtype, 0, oo);
      }
      return cl.AllToAll(buf, buf, count, c.dtype, oo);
    case OpKind::kSend: {  // sendrecv: to the next rank, from the previous
      if (options.device) {
        return absl::UnimplementedError(
            "sendrecv: host memory only (halka's send/recv take no device "
            "tensors)");
      }
      const int g = static_cast<int>(b.inputs.size());
      absl::StatusOr<OpInfo> sent =
          cl.Send(b.sends[r], count, c.dtype, (r + 1) % g, 0, oo);
      if (!sent.ok()) return sent.status();
      absl::StatusOr<OpInfo> got =
          cl.Recv(buf, count, c.dtype, (r + g - 1) % g, 0, oo);
      if (got.ok()) got->bytes_sent = sent->bytes_sent;
      return got;
    }
    default:
      return options.device
                 ? cl.AllReduceDevice(buf, count, c.dtype, c.op, oo)
                 : cl.AllReduce(buf, count, c.dtype, c.op, oo);
  }
}

// Rank r's thread: every operation of the case, its time in times[i] and
// the last one's info; the first error ("" when none).
std::string TimeRank(Client& cl, const BenchCase& c,
                     const BenchOptions& options, CaseBuffers& b, int r,
                     CyclicBarrier& barrier, std::vector<double>& times,
                     OpInfo& info) {
  const size_t bytes = b.bytes;
  const int total = options.warmup + options.iterations;
  std::string error;
  bool failed = false;
  auto fail = [&](const absl::Status& s) {
    if (!s.ok() && !failed) {
      error = s.ToString();
      failed = true;
    }
  };
  // An all-gather's or gather's input goes to slice r (in place).
  const size_t at =
      c.kind == OpKind::kAllGather || c.kind == OpKind::kGather
          ? static_cast<size_t>(r) * b.slice_bytes
          : 0;
  for (int i = 0; i < total; ++i) {
    // Fresh inputs every time (outside the timed region) so that values
    // never drift out of range and the last result can be checked.
    if (bytes > 0) {
      std::memcpy(b.bufs[r] + at, b.inputs[r].data(), b.inputs[r].size());
    }
    if (options.device && bytes > 0 && !failed) {
      fail(CudaCopyToDevice(b.device[r].data(), b.bufs[r], bytes));
    }
    // One barrier per operation, before it, as gloo_bench does: every
    // rank starts together and the operation's time is the slowest
    // rank's. (None after it: a rank's buffer is its own again once
    // its call returned, so the next copy needs no wait.)
    barrier.Wait();
    const absl::Time t0 = halka::Now();
    if (!failed) {
      OpOptions oo;
      oo.timeout = options.timeout;
      oo.algorithm = c.algorithm;
      absl::StatusOr<OpInfo> res = RunOnce(cl, c, options, b, r, oo);
      fail(res.status());
      if (res.ok()) info = *res;
    }
    times[i] = absl::ToDoubleMicroseconds(halka::Now() - t0);
    if (options.device && bytes > 0 && !failed && i + 1 == total) {
      fail(c.kind == OpKind::kReduceScatter
               ? CudaCopyToHost(b.outs[r].data(), b.device_out[r].data(),
                                b.slice_bytes)
               : CudaCopyToHost(b.bufs[r], b.device[r].data(), bytes));
    }
  }
  return error;
}

// Elements of the ranks' results, summed over the ranks, that are not what
// case c should have left there.
size_t CountWrong(const BenchCase& c, const CaseBuffers& b, int g,
                  size_t es) {
  size_t wrong = 0;
  for (int r = 0; r < g; ++r) {
    switch (c.kind) {
      case OpKind::kAllGather:
        wrong += CheckAllGather(c.dtype, b.inputs, b.bufs[r], b.slice).wrong;
        break;
      case OpKind::kReduceScatter:
        wrong += CheckReduceScatter(c.dtype, c.op, b.inputs,
                                    b.outs[r].data(), r, b.slice)
                     .wrong;
        break;
      case OpKind::kBroadcast:
        wrong += BitwiseDifferences(b.bufs[r], b.inputs[0].data(), b.count,
                                    es);
        break;
      case OpKind::kSend:  // sendrecv: the previous rank's input
        wrong += BitwiseDifferences(b.bufs[r], b.inputs[(r + g - 1) % g].data(),
                                    b.count, es);
        break;
      case OpKind::kReduce:  // the root's result; the others get none
        if (r == 0) {
          wrong += CheckAllReduce(c.dtype, c.op, b.inputs, b.outs[0].data(),
                                  b.count)
                       .wrong;
        }
        break;
      case OpKind::kGather:
        if (r == 0) {
          wrong += CheckAllGather(c.dtype, b.inputs, b.bufs[0], b.slice).wrong;
        }
        break;
      case OpKind::kScatter:  // rank 0's slice r
        wrong += BitwiseDifferences(
            b.outs[r].data(), b.inputs[0].data() + r * b.slice_bytes, b.slice,
            es);
        break;
      case OpKind::kAllToAll:  // slice k: rank k's slice r
        for (int k = 0; k < g; ++k) {
          wrong += BitwiseDifferences(b.bufs[r] + k * b.slice_bytes,
                                      b.inputs[k].data() + r * b.slice_bytes,
                                      b.slice, es);
        }
        break;
      default:
        // Rank 0 against the reference, every other rank against rank 0.
        wrong += r == 0 ? CheckAllReduce(c.dtype, c.op, b.inputs, b.bufs[0],
                                         b.count)
                              .wrong
                        : BitwiseDifferences(b.bufs[r], b.bufs[0], b.count,
                                             es);
        break;
    }
  }
  return wrong;
}

}  // namespace

BenchRow RunBenchCase(const std::vector<Client*>& clients, const BenchCase& c,
                      const BenchOptions& options) {
  const int g = static_cast<int>(clients.size());
  const size_t es = DTypeSize(c.dtype);
  const bool sliced =
      c.kind == OpKind::kAllGather || c.kind == OpKind::kReduceScatter ||
      c.kind == OpKind::kGather || c.kind == OpKind::kScatter ||
      c.kind == OpKind::kAllToAll;
  BenchRow row;
  row.c = c;
  row.algorithm = std::string(AlgorithmName(c.algorithm));
  CaseBuffers b(g);
  // A sliced collective's buffer is G equal slices.
  b.slice = sliced ? c.bytes / es / static_cast<size_t>(g) : 0;
  row.count = sliced ? b.slice * static_cast<size_t>(g) : c.bytes / es;
  b.count = row.count;
  b.bytes = row.count * es;
  b.slice_bytes = b.slice * es;
  // Each rank's input: an all-gather's or gather's slice, otherwise the
  // whole buffer.
  const size_t input_count =
      c.kind == OpKind::kAllGather || c.kind == OpKind::kGather ? b.slice
                                                              : row.count;
  for (int r = 0; r < g; ++r) {
    absl::Status s = AllocateRank(*clients[r], c, options, input_count, r, b);
    if (!s.ok()) {
      row.error = s.ToString();
      return row;
    }
  }
  const int total = options.warmup + options.iterations;
  std::vector<std::vector<double>> times(static_cast<size_t>(g),
                                         std::vector<double>(total, 0));
  std::vector<std::string> errors(static_cast<size_t>(g));
  std::vector<OpInfo> infos(static_cast<size_t>(g));
  CyclicBarrier barrier(g);
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    threads.emplace_back([&, r] {
      errors[r] = TimeRank(*clients[r], c, options, b, r, barrier, times[r],
                           infos[r]);
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
    row.algbw_gbs = static_cast<double>(b.bytes) / (row.time_us * 1e3);
    row.busbw_gbs = row.algbw_gbs * BusBandwidthFactor(c.kind, g);
  }
  if (options.check) row.wrong += CountWrong(c, b, g, es);
  return row;
}

std::string BenchHeader(bool with_model) {
  std::string h = absl::StrFormat("%12s %12s %9s %6s %6s %12s %9s %9s %7s",
                                  "size", "count", "type", "redop", "algo",
                                  "time(us)", "algbw", "busbw", "#wrong");
  if (with_model) {
    absl::StrAppend(&h, absl::StrFormat("  %10s %8s  %-18s %10s", "model(us)",
                                        "meas/mod", "model_best",
                                        "best(us)"));
  }
  return h;
}

absl::StatusOr<BenchModel> ProbeBenchModel(const std::vector<Client*>& clients,
                                           const BenchOptions& options) {
  BenchModel m;
  auto info = clients.at(0)->Info();
  if (!info.ok()) return info.status();
  m.shape.world = info->world_size;
  std::vector<std::string> hosts;
  for (const Member& member : info->members) {
    if (member.host.empty()) {
      hosts.clear();
      m.shape.host_sizes.clear();
      break;
    }
    auto at = std::find(hosts.begin(), hosts.end(), member.host);
    if (at == hosts.end()) {
      hosts.push_back(member.host);
      m.shape.host_sizes.push_back(1);
    } else {
      ++m.shape.host_sizes[static_cast<size_t>(at - hosts.begin())];
    }
  }
  // alpha: an 8-byte sendrecv (every rank to the next at once: the slowest
  // edge); B: 4 MiB less alpha.
  BenchOptions probe = options;
  probe.check = true;
  const size_t big = size_t{4} << 20;
  double t[2] = {0, 0};
  const size_t sizes[2] = {8, big};
  for (int i = 0; i < 2; ++i) {
    probe.iterations = i == 0 ? 20 : 5;
    probe.warmup = i == 0 ? 3 : 1;
    BenchCase c{sizes[i], DType::kFloat32, ReduceOp::kSum, Algorithm::kAuto,
                OpKind::kSend};
    BenchRow row = RunBenchCase(clients, c, probe);
    if (!row.error.empty() || row.wrong > 0) {
      return absl::InternalError(absl::StrCat(
          "the model's sendrecv probe of ", sizes[i], " bytes failed: ",
          row.error.empty() ? absl::StrCat(row.wrong, " wrong") : row.error));
    }
    t[i] = row.time_us * 1e-6;
  }
  if (t[1] <= t[0]) {
    return absl::InternalError(absl::StrFormat(
        "the model's probe is not usable: 4 MiB took %.1f us, 8 B %.1f us",
        t[1] * 1e6, t[0] * 1e6));
  }
  m.links.net.alpha_s = t[0];
  m.links.net.bytes_per_s = static_cast<double>(big) / (t[1] - t[0]);
  m.links.local = m.links.net;
  m.how = absl::StrCat(
      "model: ", m.shape.world, " ranks",
      m.shape.host_sizes.empty()
          ? std::string(", hosts not known")
          : absl::StrCat(" on ", m.shape.hosts(), " host",
                         m.shape.hosts() == 1 ? "" : "s"),
      "; one level probed by sendrecv around the ring (8 B: alpha, 4 MiB: B), "
      "used for links inside and between hosts: ",
      DescribeLevel(m.links.net));
  return m;
}

void ApplyModel(const BenchModel& model, int world_size, BenchRow& row) {
  RingShape shape = model.shape;
  shape.world = world_size;
  const double bytes =
      static_cast<double>(row.count * DTypeSize(row.c.dtype));
  absl::StatusOr<Algorithm> ran = ParseAlgorithm(row.algorithm);
  if (ran.ok()) {
    if (auto t = PredictSeconds(shape, row.c.kind, *ran, bytes, model.links)) {
      row.model_us = *t * 1e6;
    }
  }
  if (auto best = BestByModel(shape, row.c.kind, bytes, model.links)) {
    row.model_best = std::string(AlgorithmName(best->algorithm));
    row.model_best_us = best->seconds * 1e6;
  }
}

namespace {

// The redop column: "none" where the collective reduces nothing.
absl::string_view RedopName(const BenchCase& c) {
  return c.kind == OpKind::kAllReduce || c.kind == OpKind::kReduceScatter ||
                 c.kind == OpKind::kReduce
             ? ReduceOpName(c.op)
             : "none";
}

}  // namespace

std::string FormatBenchRow(const BenchRow& row, bool with_model) {
  if (!row.error.empty()) {
    return absl::StrFormat("%12d %12d %9s %6s %6s  FAILED: %s", row.c.bytes,
                           row.count, DTypeName(row.c.dtype),
                           RedopName(row.c), row.algorithm, row.error);
  }
  std::string line = absl::StrFormat(
      "%12d %12d %9s %6s %6s %12.1f %9.3f %9.3f %7d",
      row.count * DTypeSize(row.c.dtype), row.count, DTypeName(row.c.dtype),
      RedopName(row.c), row.algorithm, row.time_us, row.algbw_gbs,
      row.busbw_gbs, row.wrong);
  if (with_model) {
    const bool predicted = row.model_us > 0;
    absl::StrAppend(
        &line,
        absl::StrFormat(
            "  %10s %8s  %-18s %10s",
            predicted ? absl::StrFormat("%.1f", row.model_us) : "-",
            predicted ? absl::StrFormat("%.2f", row.time_us / row.model_us)
                      : "-",
            row.model_best.empty() ? "-" : row.model_best,
            row.model_best_us >= 0 ? absl::StrFormat("%.1f", row.model_best_us)
                                   : "-"));
  }
  return line;
}

std::string BenchRowJson(const BenchRow& row, int world_size) {
  return absl::StrFormat(
      "{\"coll\":\"%s\",\"size\":%d,\"count\":%d,\"type\":\"%s\","
      "\"redop\":\"%s\","
      "\"algo\":\"%s\",\"world_size\":%d,\"time_us\":%.3f,\"algbw_gbs\":%.6f,"
      "\"busbw_gbs\":%.6f,\"wrong\":%d,\"bytes_sent_rank0\":%d,"
      "\"model_us\":%.3f,\"model_best\":\"%s\",\"model_best_us\":%.3f,"
      "\"error\":\"%s\"}",
      CollectiveName(row.c.kind),
      row.count * DTypeSize(row.c.dtype), row.count, DTypeName(row.c.dtype),
      RedopName(row.c), row.algorithm, world_size, row.time_us,
      row.algbw_gbs, row.busbw_gbs, row.wrong, row.bytes_sent, row.model_us,
      row.model_best, row.model_best_us,
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
