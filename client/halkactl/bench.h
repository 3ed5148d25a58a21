// The measurement loop behind `halkactl demo` and `halkactl bench`: G ranks,
// each with its own Client, run the same collective (all-reduce, all-gather,
// reduce-scatter or broadcast); time, bandwidth and correctness as
// nccl-tests reports them.
#ifndef HALKA_CLIENT_HALKACTL_BENCH_H_
#define HALKA_CLIENT_HALKACTL_BENCH_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cost_model.h"
#include "halka/client.h"

namespace halka {

struct BenchCase {
  // As nccl-tests counts it: the whole buffer (an all-gather's result, a
  // reduce-scatter's input; G slices of bytes/G each, rounded down).
  size_t bytes = 0;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kAuto;
  // broadcast, reduce, gather, scatter: rooted at rank 0; kSend:
  // "sendrecv", each rank sends its buffer to the next rank and receives
  // the previous rank's (nccl-tests'). Gather, scatter and all-to-all:
  // `bytes` is the whole buffer (G slices), as in nccl-tests.
  OpKind kind = OpKind::kAllReduce;
};

// nccl-tests' bus-bandwidth factor of `kind` on `world_size` ranks:
// 2(G-1)/G for all-reduce, (G-1)/G for all-gather, reduce-scatter, gather,
// scatter and all-to-all, 1 for broadcast, reduce and sendrecv (0 for a
// barrier).
double BusBandwidthFactor(OpKind kind, int world_size);
// "allreduce", "allgather", "reducescatter", "broadcast", "sendrecv",
// "reduce", "gather", "scatter", "alltoall" (the --coll names; sendrecv is
// OpKind::kSend). INVALID_ARGUMENT otherwise.
absl::StatusOr<OpKind> ParseCollective(const std::string& name);
// The --coll name of `kind`.
std::string CollectiveName(OpKind kind);

struct BenchOptions {
  int iterations = 5;
  int warmup = 1;
  bool check = true;
  bool zero_copy = true;  // shared-memory buffers instead of plain vectors
  bool device = false;    // CUDA device buffers (the *Device calls)
  absl::Duration timeout = absl::Seconds(120);
  uint64_t seed = 1;
};

struct BenchRow {
  BenchCase c;
  size_t count = 0;
  std::string algorithm;
  double time_us = 0;      // mean over iterations of the slowest rank
  double algbw_gbs = 0;    // bytes / time
  double busbw_gbs = 0;    // algbw * BusBandwidthFactor
  size_t wrong = 0;        // elements off the reference, plus disagreeing ranks
  uint64_t bytes_sent = 0; // by rank 0, one operation
  uint64_t bytes_received = 0;
  std::string error;       // non-empty when the operation failed
  // With a model (--model): what it predicts for the algorithm that ran,
  // and the algorithm it would pick with its prediction (< 0: none).
  double model_us = -1;
  std::string model_best;
  double model_best_us = -1;
};

// The latency-bandwidth model a bench compares with (--model): the ring's
// shape from the workers' membership (hosts as the members name them) and
// the links' alpha and B, probed by sendrecv around the ring (8 B, then
// 4 MiB): one level, the ring's slowest edge, used for both levels.
struct BenchModel {
  RingShape shape;
  LinkModel links;
  std::string how;  // one line: what was probed, the values
};
absl::StatusOr<BenchModel> ProbeBenchModel(const std::vector<Client*>& clients,
                                           const BenchOptions& options);
// Fills row.model_us, model_best and model_best_us.
void ApplyModel(const BenchModel& model, int world_size, BenchRow& row);

// Runs one case on every client (one per rank, in rank order).
BenchRow RunBenchCase(const std::vector<Client*>& clients, const BenchCase& c,
                      const BenchOptions& options);

// nccl-tests-style table; with_model: the model's columns after #wrong.
std::string BenchHeader(bool with_model = false);
std::string FormatBenchRow(const BenchRow& row, bool with_model = false);
std::string BenchRowJson(const BenchRow& row, int world_size);

// "8", "1K", "64M", "1G" -> bytes. INVALID_ARGUMENT otherwise.
absl::StatusOr<size_t> ParseBytes(const std::string& text);

// Table of a job's health (Client::RingHealth; from the wire's reply:
// ToRingHealth in client/client_proto.h), in health_format.cc. The first
// line carries the whole verdict: "job J: healthy, generation 7, 8 members
// on 2 hosts", or "job J: FAILING, generation 7: <the failure>".
std::string FormatHealth(const RingHealth& health);

}  // namespace halka

#endif  // HALKA_CLIENT_HALKACTL_BENCH_H_
