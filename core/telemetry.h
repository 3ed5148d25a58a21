// What a communicator has done: one ledger, booked once per event.
//
// Every send, wait and reduce of an operation is booked once, into one
// per-peer record. The per-peer views a Telemetry snapshot carries are all
// derived from those records:
//   - links: payload bytes per peer, including the running operation;
//   - edges_total: per-edge sums of the operations that ended;
//   - last_op: the per-edge sums of the last operation that ended;
//   - window: the same events over a rolling window (EdgeWindow), fed by the
//     same booking calls.
// Every call takes `now`; the ledger has no clock of its own.
#ifndef HALKA_CORE_TELEMETRY_H_
#define HALKA_CORE_TELEMETRY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/edge_window.h"
#include "core/frame.h"
#include "core/timeline.h"

namespace halka {

struct LinkBytes {
  uint64_t sent = 0;
  uint64_t received = 0;
};

// When one operation reached this rank's ring (its Communicator started
// it): the facts the rendezvous compares across ranks for arrival lag.
struct OpArrival {
  uint64_t generation = 0;
  uint64_t op_seq = 0;
  absl::Time start;
  absl::Time end;
};

struct Telemetry {
  uint64_t ops_completed = 0;
  uint64_t ops_failed = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double send_seconds = 0;
  double wait_seconds = 0;
  double reduce_seconds = 0;
  std::string last_error;
  // Payload bytes per peer (ranks >= world_size: parameter-server shards).
  std::map<int, LinkBytes> links;
  // Per peer edge: over the rolling window (window_seconds) and for the
  // last operation that ended.
  EdgeSummary window;
  double window_seconds = 60;
  EdgeSummary last_op;
  std::string last_algorithm;   // "" before the first operation
  uint64_t last_chunk_bytes = 0;
  uint64_t last_op_bytes = 0;
  // The last operation's time, and what the job's link model predicted
  // for it (0: no model or no prediction).
  double last_op_seconds = 0;
  double last_model_seconds = 0;
  // The last kMaxArrivals operations that succeeded, oldest first.
  std::vector<OpArrival> arrivals;
  // Time this process did not run (StallMonitor) over the window.
  double stall_seconds = 0;
  // Since the communicator started, for /metrics: per-edge sums, operations
  // by (kind, algorithm, outcome) and an operation latency histogram.
  std::map<int, EdgeStats> edges_total;
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t>
      ops_by_label;
  std::vector<uint64_t> latency_buckets;  // parallel to kLatencyBounds
  double latency_sum_seconds = 0;
  uint64_t latency_count = 0;
};

// Upper bounds (seconds) of the operation latency histogram (+Inf last).
extern const std::vector<double> kLatencyBounds;

// The telemetry ledger of one communicator. Operations run one at a time:
// BeginOp, any number of Book* calls, EndOp.
// Thread-safety: thread-safe; one short critical section per call, never
// calling out while it holds its lock.
class OpTelemetry {
 public:
  // How a wait for a peer's frame ended.
  enum class WaitEnd {
    kFrame,       // a frame of `bytes` payload bytes arrived from `peer`
    kLinkFailed,  // the link to `peer` broke
    kOther,       // abort, interrupt, deadline: booked as time only
  };

  // What EndOp books about the operation as a whole.
  struct OpEnd {
    OpKind kind = OpKind::kBarrier;
    std::string algorithm;  // "ring", ...
    absl::Status status;
    absl::Duration elapsed;
    uint64_t chunk_bytes = 0;
    uint64_t op_bytes = 0;
    // For arrival lag and the timeline.
    uint64_t generation = 0;
    uint64_t op_seq = 0;
    std::string description;
    absl::Time start;
    absl::Time fingerprint_end = absl::InfinitePast();  // never: past
    double model_seconds = 0;  // the link model's prediction; 0: none
  };
  static constexpr size_t kMaxArrivals = 256;

  // Starts a new operation's record (forgets nothing that ended).
  void BeginOp();
  // One frame handed to the transport for `peer`, taking `spent`; `ok`:
  // the transport took it (`bytes` payload bytes), else a send error.
  void BookSend(absl::Time now, int peer, uint64_t bytes,
                absl::Duration spent, bool ok);
  // One wait of `waited` that ended as `end` (see WaitEnd). `arrival`: a
  // wait of the fingerprint pass (for the callers to arrive), booked apart
  // from the edge's data waits.
  void BookWait(absl::Time now, WaitEnd end, int peer, uint64_t bytes,
                absl::Duration waited, bool arrival = false);
  // The link to `peer` was busy writing this rank's frames for `busy`.
  void BookWire(absl::Time now, int peer, absl::Duration busy);
  // One span of the running operation's timeline.
  void BookSpan(const TraceSpan& span);
  // The last operations' timelines (see Timeline), oldest first.
  std::vector<TraceOp> Trace() const;
  // Reducing (or copying) one frame from `peer` took `spent`.
  void BookReduce(absl::Time now, int peer, absl::Duration spent);
  // An algorithm's whole reduce time (own data included), booked when it
  // succeeds.
  void BookReduceTotal(absl::Duration spent);
  // Closes the running operation: folds its per-peer record into the
  // totals and last_op, counts it by label and latency. Returns the
  // payload bytes it moved.
  LinkBytes EndOp(absl::Time now, const OpEnd& end);

  // Every Telemetry field, the window summarised at `now`.
  Telemetry Snapshot(absl::Time now) const;
  // Replaces this ledger with a copy of `previous` (a ring replacing
  // another keeps counting where it stopped). An operation `previous` is
  // still running stays in `links` only, as it was there.
  void InheritFrom(const OpTelemetry& previous);

 private:
  // Everything booked about one peer.
  struct PeerRecord {
    EdgeStats total;            // operations that ended (edges_total)
    EdgeStats op;               // the running operation
    std::vector<double> waits;  // the running operation's per-frame waits
    bool in_total = false;      // has an edges_total entry
    bool in_op = false;         // touched by the running operation
    bool linked = false;        // has a links entry (a send or frame got through)
    LinkBytes carried;          // an inherited running operation's bytes
  };
  PeerRecord& OpPeer(int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  // The scalar fields, ops_by_label, latency and last_*; links, edges_total
  // and window are filled in by Snapshot.
  Telemetry scalars_ ABSL_GUARDED_BY(mu_);
  std::map<int, PeerRecord> peers_ ABSL_GUARDED_BY(mu_);
  mutable EdgeWindow window_ ABSL_GUARDED_BY(mu_);
  Timeline timeline_ ABSL_GUARDED_BY(mu_);
  std::deque<OpArrival> arrivals_ ABSL_GUARDED_BY(mu_);
};

}  // namespace halka

#endif  // HALKA_CORE_TELEMETRY_H_
