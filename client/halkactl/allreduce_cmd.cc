#include "client/halkactl/allreduce_cmd.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/halkactl/bench.h"
#include "client/halkactl/health_cmd.h"
#include "core/cuda/cuda_reduce.h"
#include "core/dtype.h"
#include "core/frame.h"
#include "core/testing/reference.h"

ABSL_DECLARE_FLAG(std::string, worker);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(std::string, op);
ABSL_DECLARE_FLAG(int64_t, count);
ABSL_DECLARE_FLAG(std::string, algo);
ABSL_DECLARE_FLAG(std::string, coll);
ABSL_DECLARE_FLAG(bool, device);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(int, repeat);
ABSL_DECLARE_FLAG(bool, check);

namespace halka {
namespace {

// allreduce's line for one operation: what ran, how, how long, what moved
// and how many elements came out wrong.
void PrintAllReduce(int rank, int g, OpKind kind, const OpInfo& info,
                    DType dtype, ReduceOp op, int64_t count, double ms,
                    absl::Time t1, size_t wrong) {
  // model_ms only where the job has a link model: what it predicted.
  const std::string model =
      info.model_seconds > 0
          ? absl::StrFormat(" model_ms=%.3f", info.model_seconds * 1e3)
          : "";
  std::printf("rank %d/%d: %s #%llu %s x %lld %s algo=%s via %s in "
              "%.2f ms (worker_ms=%.2f%s end_unix_ms=%.3f), sent %llu B, "
              "received %llu B, "
              "#wrong %zu\n",
              rank, g, std::string(OpKindName(kind)).c_str(),
              static_cast<unsigned long long>(info.op_seq),
              std::string(DTypeName(dtype)).c_str(),
              static_cast<long long>(count),
              std::string(ReduceOpName(op)).c_str(), info.algorithm.c_str(),
              (info.transfer + (info.session ? "+session" : "")).c_str(),
              ms, info.seconds * 1e3, model.c_str(),
              // Wall clock when the result came back (before the check):
              // with worker_ms it places every rank's operation on one
              // time line (netns_scaling.sh: time from the last rank's
              // start to the last rank's end).
              static_cast<double>(absl::ToUnixMicros(t1)) / 1e3,
              static_cast<unsigned long long>(info.bytes_sent),
              static_cast<unsigned long long>(info.bytes_received), wrong);
}

}  // namespace

int AllReduceCommand(const Client::Options& client_options) {
  const std::string worker = absl::GetFlag(FLAGS_worker);
  if (worker.empty()) {
    return Fail(absl::InvalidArgumentError("allreduce needs --worker=ADDR"));
  }
  auto dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return Fail(dtype.status());
  auto op = ParseReduceOp(absl::GetFlag(FLAGS_op));
  if (!op.ok()) return Fail(op.status());
  const int64_t count = absl::GetFlag(FLAGS_count);
  if (count < 0) return Fail(absl::InvalidArgumentError("--count must be >= 0"));
  auto algo = ParseAlgorithm(absl::GetFlag(FLAGS_algo));
  if (!algo.ok()) return Fail(algo.status());
  auto kind = ParseCollective(absl::GetFlag(FLAGS_coll));
  if (!kind.ok()) return Fail(kind.status());
  if (*kind != OpKind::kAllReduce && *kind != OpKind::kReduceScatter &&
      *kind != OpKind::kAllGather) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "allreduce runs --coll=allreduce, reducescatter or allgather, not ",
        absl::GetFlag(FLAGS_coll))));
  }
  const bool on_device = absl::GetFlag(FLAGS_device);
  if (on_device && *kind != OpKind::kAllReduce) {
    return Fail(absl::InvalidArgumentError(
        "allreduce --device runs --coll=allreduce only"));
  }
  auto client = Client::Connect(worker, client_options);
  if (!client.ok()) return Fail(client.status());
  auto info = (*client)->Info();
  if (!info.ok()) return Fail(info.status());
  const int g = info->world_size;
  const int rank = info->rank;
  const size_t n = static_cast<size_t>(count);
  if (*kind == OpKind::kReduceScatter && n % static_cast<size_t>(g) != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "reducescatter: --count=", n, " must be a multiple of the world (", g,
        ")")));
  }
  // Every rank makes every rank's input, so that each checks its result on
  // its own. An all-reduce keeps only its own and, once before its first
  // operation, what the result must be (AllReduceReference: 8 ranks' 256
  // MiB inputs would take 2 GiB in each caller, and making them again per
  // operation took the cores its peers' operations run on).
  constexpr uint64_t kSeed = 99;
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < g; ++r) {
    const bool needed = *kind != OpKind::kAllReduce || r == rank;
    const ReduceOp made = *kind == OpKind::kAllGather ? ReduceOp::kSum : *op;
    inputs.push_back(needed ? MakeRankData(*dtype, made, n, r, kSeed)
                            : std::vector<uint8_t>());
  }
  std::optional<AllReduceReference> reference;
  if (*kind == OpKind::kAllReduce && absl::GetFlag(FLAGS_check)) {
    reference.emplace(*dtype, *op, g, kSeed, n);
  }
  OpOptions oo;
  oo.timeout = absl::GetFlag(FLAGS_timeout);
  oo.algorithm = *algo;
  const int repeat = std::max(1, absl::GetFlag(FLAGS_repeat));
  const size_t es = DTypeSize(*dtype);
  const size_t slice = n / static_cast<size_t>(g);
  for (int i = 0; i < repeat; ++i) {
    if (*kind != OpKind::kAllReduce) {
      const std::vector<uint8_t>& in = inputs[static_cast<size_t>(rank)];
      std::vector<uint8_t> out(
          (*kind == OpKind::kAllGather ? n * static_cast<size_t>(g) : slice) *
          es);
      const absl::Time t0 = absl::Now();
      auto res = *kind == OpKind::kAllGather
                     ? (*client)->AllGather(in.data(), n, out.data(),
                                            n * static_cast<size_t>(g), *dtype,
                                            oo)
                     : (*client)->ReduceScatter(in.data(), n, out.data(),
                                                slice, *dtype, *op, oo);
      const absl::Time t1 = absl::Now();
      const double ms = absl::ToDoubleMilliseconds(t1 - t0);
      if (!res.ok()) {
        std::fprintf(stderr, "halkactl: rank %d: %s failed after %.0f ms: %s\n",
                     rank, std::string(OpKindName(*kind)).c_str(), ms,
                     res.status().ToString().c_str());
        return 1;
      }
      size_t wrong = 0;
      if (absl::GetFlag(FLAGS_check)) {
        wrong = *kind == OpKind::kAllGather
                    ? CheckAllGather(*dtype, inputs, out.data(), n).wrong
                    : CheckReduceScatter(*dtype, *op, inputs, out.data(), rank,
                                         slice).wrong;
      }
      PrintAllReduce(rank, g, *kind, *res, *dtype, *op, count, ms, t1, wrong);
      if (wrong > 0) return 1;
      continue;
    }
    std::vector<uint8_t> buf = inputs[static_cast<size_t>(rank)];
    CudaBuffer device;
    if (on_device && !buf.empty()) {
      auto d = CudaBuffer::Allocate(buf.size());
      if (!d.ok()) return Fail(d.status());
      device = std::move(*d);
      absl::Status s = CudaCopyToDevice(device.data(), buf.data(), buf.size());
      if (!s.ok()) return Fail(s);
    }
    const absl::Time t0 = absl::Now();
    auto res = on_device
                   ? (*client)->AllReduceDevice(device.data(),
                                                static_cast<size_t>(count),
                                                *dtype, *op, oo)
                   : (*client)->AllReduce(buf.data(), static_cast<size_t>(count),
                                          *dtype, *op, oo);
    if (res.ok() && on_device && !buf.empty()) {
      absl::Status s = CudaCopyToHost(buf.data(), device.data(), buf.size());
      if (!s.ok()) return Fail(s);
    }
    const absl::Time t1 = absl::Now();
    const double ms = absl::ToDoubleMilliseconds(t1 - t0);
    if (!res.ok()) {
      std::fprintf(stderr, "halkactl: rank %d: all_reduce failed after %.0f ms: %s\n",
                   rank, ms, res.status().ToString().c_str());
      return 1;
    }
    size_t wrong = 0;
    if (absl::GetFlag(FLAGS_check)) {
      wrong = reference->Check(buf.data()).wrong;
    }
    PrintAllReduce(rank, g, *kind, *res, *dtype, *op, count, ms, t1, wrong);
    if (wrong > 0) return 1;
  }
  return 0;
}

}  // namespace halka
