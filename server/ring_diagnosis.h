// Which rank the ring waits on: a pure function (no gRPC, no clock) from
// the members' per-edge telemetry to every directed edge's figures and a
// diagnosis with the evidence in numbers.
//
// A ring is a pipeline: when one rank is slow, every rank downstream of it
// waits, transitively. So the raw wait on an edge does not locate the
// culprit; the wait an edge ADDS does: for ring edge s -> s+1,
//   added_wait = max(0, wait(s+1 on s) - wait(s on s-1)),
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
  std::vector<EdgeInput> edges;
};

struct EdgeReport {
  int from = -1;
  int to = -1;
  uint64_t bytes = 0;
  // bytes / (wait + sender's send time), where a ring edge counts only its
  // added wait: the rate this hop would sustain were upstream not slower.
  double throughput_bps = 0;
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
  std::string summary;
};

// Thresholds: a straggler's successor must have waited at least
// min_added_wait_s for it, and at least min_share of its operation time.
struct DiagnosisOptions {
  double min_added_wait_s = 0.05;
  double min_share = 0.2;
};

RingDiagnosis DiagnoseRing(int world_size, const std::vector<RankInput>& ranks,
                           DiagnosisOptions options = DiagnosisOptions());

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
