// Which rank the ring waits on: a pure function (no gRPC, no clock) from
// the members' per-edge telemetry to every directed edge's figures and a
// diagnosis with the evidence in numbers.
//
// Three ways one rank holds the ring up, checked in this order:
//   - its process does not run (stall_seconds, from the worker's stall
//     monitor: SIGSTOP, CPU starvation, swap), well above the ranks' median;
//   - its calls reach the ring late (arrival lag, see ArrivalLags): its host
//     or its training step is slow; the others wait in the fingerprint
//     pass, which is booked apart from the edges' data waits;
//   - inside the ring (data phases), the edge it sends on adds wait:
// A ring is a pipeline: when one rank is slow, every rank downstream of it
// waits, transitively. So the raw wait on an edge does not locate the
// culprit; the wait an edge ADDS does: for ring edge s -> succ(s),
//   added_wait = max(0, wait(succ(s) on s) - wait(s on pred(s))),
// the time the successor blocked on s that s did not itself spend blocked
// on its own predecessor. The straggler is the sender of the ring edge with
// the largest added wait, if that wait is a noticeable share of the
// successor's operation time.
#ifndef HALKA_SERVER_RING_DIAGNOSIS_H_
#define HALKA_SERVER_RING_DIAGNOSIS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace halka {

// One rank's window figures for one peer edge (as the worker reports them).
struct EdgeInput {
  int peer = -1;
  double wire_seconds = 0;  // the link busy writing this rank's frames
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double send_seconds = 0;
  double wait_seconds = 0;
  double reduce_seconds = 0;
  double wait_p50_seconds = 0;
  double wait_p99_seconds = 0;
  uint64_t errors = 0;
};

struct RankInput {
  int rank = -1;
  bool has_telemetry = false;
  double op_seconds = 0;  // summed elapsed time of its operations (window)
  double ring_seconds = 0;  // ... after their fingerprint pass (0: unknown)
  uint64_t ops = 0;
  double stall_seconds = 0;  // its process did not run (window)
  // From ArrivalLags; arrival_ops == 0: unknown.
  double arrival_lag_p50_seconds = 0;
  double arrival_lag_p99_seconds = 0;
  uint64_t arrival_ops = 0;
  std::vector<EdgeInput> edges;
};

// One operation reaching one rank's ring (the worker's wall clock).
struct ArrivalInput {
  uint64_t generation = 0;
  uint64_t op_seq = 0;
  int64_t start_unix_us = 0;
  int64_t end_unix_us = 0;
};

struct ArrivalLag {
  double p50_seconds = 0;
  double p99_seconds = 0;
  uint64_t ops = 0;
};

// Per rank (index = rank, g entries): how long after the first rank each
// rank's call reached the ring because of its caller, over the operations
// (generation, op_seq) that every one of the g ranks reported, with their
// previous operation, starting at or after `since_unix_us`. For op N:
//   lag(r)  = start(r, N) - min over ranks of start(N)
//   idle(r) = start(r, N) - end(r, N-1): the caller's own time between calls
//   caller lag(r) = max(0, min(lag(r), idle(r) - min over ranks of idle))
// so a rank whose previous operation ended late (a slow edge upstream of
// it) but whose caller came straight back is not a late caller. Compares
// the workers' wall clocks: on one host exact, across hosts as good as
// their clock synchronisation (docs/health.md). Pure.
std::vector<ArrivalLag> ArrivalLags(
    int g, const std::vector<std::vector<ArrivalInput>>& by_rank,
    int64_t since_unix_us);

struct EdgeReport {
  int from = -1;
  int to = -1;
  uint64_t bytes = 0;
  // bytes / wire_seconds: the rate the edge moves data while it does.
  double throughput_bps = 0;
  double wire_seconds = 0;  // the sender's link busy writing its frames
  double wait_seconds = 0;
  double added_wait_seconds = 0;
  double wait_p50_seconds = 0;
  double wait_p99_seconds = 0;
  uint64_t errors = 0;
  bool ring = false;
};

struct RingDiagnosis {
  std::vector<EdgeReport> edges;  // sorted by (from, to)
  bool has_straggler = false;
  int straggler_rank = -1;
  int slowest_from = -1;
  int slowest_to = -1;
  int late_rank = -1;     // its calls arrive late
  int stalled_rank = -1;  // its process stalls
  std::string summary;
};

// Thresholds: a straggler's successor must have waited at least
// min_added_wait_s for it, and at least min_share of its operation time.
// A late caller's p50 arrival lag must exceed the ranks' median by
// min_lag_s and by min_share of the median operation's ring time, and the
// next latest rank's p50 lag by min_lag_s (one rank must stand out:
// callers that share a few busy cores are each late by turns); a
// stalled rank's stall must exceed the median by min_added_wait_s and
// min_share of its operation time.
struct DiagnosisOptions {
  double min_added_wait_s = 0.05;
  double min_share = 0.2;
  double min_lag_s = 0.02;
  uint64_t min_arrival_ops = 5;
};

// `ring_order`: the ranks in ring order (Membership.ring_order; empty:
// rank order): ring edges go from each rank to its ring successor.
RingDiagnosis DiagnoseRing(int world_size, const std::vector<RankInput>& ranks,
                           DiagnosisOptions options = DiagnosisOptions(),
                           const std::vector<int>& ring_order = {});

// One rank's last operation that ended, from its telemetry.
struct LastOpInput {
  int rank = -1;
  uint64_t op_seq = 0;  // 0: no operation ended yet
  bool failed = false;
  std::string error;    // when failed
  uint64_t calls_received = 0;
};

// Whether operations are failing, as a sentence: "" when no rank's last
// operation failed, else e.g. "operations are failing: rank 3's last op
// #24 failed (deadline exceeded); ranks 0-2 are at #25". Ranks with the
// same outcome, number and error are grouped ("ranks 0-1, 3"); errors are
// cut to 160 characters; when the ranks' counts of calls received differ
// they follow ("; calls received: ranks 0-2 25, rank 3 24"). `ranks` holds
// the live ranks with telemetry, in any order. Pure; thread-safe.
std::string DiagnoseFailures(std::vector<LastOpInput> ranks);

// "12.3 MB/s".
std::string FormatRate(double bytes_per_second);

}  // namespace halka

#endif  // HALKA_SERVER_RING_DIAGNOSIS_H_
