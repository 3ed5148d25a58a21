// The collectives of one rank: ring all-reduce, broadcast, barrier.
//
// A Communicator belongs to one rank of one generation of a ring. It runs
// one operation at a time (callers are serialised in arrival order) on the
// calling thread, talking to its peers only through a Transport and an
// Inbox. Every operation:
//   1. passes every rank's fingerprint once around the ring, so that ranks
//      that disagree fail with FAILED_PRECONDITION, naming both, before any
//      data moves;
//   2. moves data in chunks (config.chunk_bytes), pipelined: a chunk is
//      forwarded as soon as it is reduced;
//   3. is bounded by its deadline; a failure anywhere reaches every rank as
//      an ABORT frame sent both ways around the ring.
// Errors name the peer (rank, worker id, address), the phase and the step:
//   INVALID_ARGUMENT (bad request), FAILED_PRECONDITION (ranks disagree),
//   UNAVAILABLE (a link broke), DEADLINE_EXCEEDED (names what was awaited),
//   ABORTED (another rank failed or membership changed; says why),
//   DATA_LOSS (a frame that does not fit the plan).
// Thread-safety: all methods are thread-safe.
#ifndef HALKA_WORKER_CORE_COMMUNICATOR_H_
#define HALKA_WORKER_CORE_COMMUNICATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/core/dtype.h"
#include "worker/core/edge_window.h"
#include "worker/core/frame.h"
#include "worker/core/op_buffer.h"
#include "worker/core/transport.h"

namespace halka {

struct PeerInfo {
  int rank = -1;
  std::string worker_id;
  std::string address;
};
// "rank 2 (worker-2, 127.0.0.1:7002)".
std::string DescribePeer(const PeerInfo& peer);

struct CommConfig {
  int rank = 0;
  int world_size = 1;
  uint64_t generation = 1;
  std::vector<PeerInfo> members;  // members[i].rank == i
  size_t chunk_bytes = size_t{1} << 20;
  absl::Duration default_timeout = absl::Seconds(60);
  // Largest buffer one operation may carry (RESOURCE_EXHAUSTED above it).
  uint64_t max_op_bytes = uint64_t{16} << 30;
  // Up to this world size, fingerprints go to every rank at once (one hop
  // instead of G-1), and AUTO all-reduces of at most eager_bytes run naive
  // with the data riding on the fingerprint frames: one hop in all.
  int all_to_all_max_world = 16;
  size_t eager_bytes = 64 << 10;
  // FOR TESTS ONLY: sleeps this long per received data chunk while reducing
  // it, to make this rank a straggler on purpose (worker flag
  // --test_reduce_delay).
  absl::Duration test_reduce_delay = absl::ZeroDuration();
  // Sequence number of the first operation. Rings of later generations
  // continue the numbering of the ring they replace, so that every rank
  // numbers the same call the same way across membership changes. 0: this
  // rank is new in a running ring and adopts the number of the first
  // operation its peers start.
  uint64_t first_op_seq = 1;
};

// A failed operation whose status carries this payload failed before it
// modified the caller's buffer or sent any of its data (the ranks were
// still comparing fingerprints). No rank can have completed it (each needs
// this rank's data), so it may be run again on the next generation's ring.
// The payload is the operation's sequence number.
inline constexpr char kUntouchedPayload[] = "halka.dev/untouched-op-seq";

struct OpResult {
  uint64_t op_seq = 0;
  std::string algorithm;  // "ring"
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  absl::Duration elapsed;
  uint64_t generation = 0;
  int rank = 0;
  int world_size = 1;
};

// The progress ledger: what the current operation is doing right now.
struct Progress {
  bool busy = false;
  std::string op;  // fingerprint text
  Phase phase = Phase::kFingerprint;
  int step = 0;
  int chunk = 0;
  int chunks = 0;
  int awaited_rank = -1;
  absl::Time waiting_since = absl::InfinitePast();
};

struct LinkBytes {
  uint64_t sent = 0;
  uint64_t received = 0;
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

class Communicator {
 public:
  // `transport` and `inbox` must outlive the communicator.
  Communicator(CommConfig config, Transport* transport, Inbox* inbox);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // In place over `count` elements of `dtype` at `data`. A zero timeout
  // means config.default_timeout.
  absl::StatusOr<OpResult> AllReduce(void* data, size_t count, DType dtype,
                                     ReduceOp op, absl::Duration timeout,
                                     Algorithm algorithm = Algorithm::kAuto);
  absl::StatusOr<OpResult> Broadcast(void* data, size_t count, DType dtype,
                                     int root, absl::Duration timeout);
  absl::StatusOr<OpResult> Barrier(absl::Duration timeout);

  // The same on a buffer that may live elsewhere (a CUDA device).
  absl::StatusOr<OpResult> AllReduce(OpBuffer& buffer, size_t count,
                                     DType dtype, ReduceOp op,
                                     absl::Duration timeout,
                                     Algorithm algorithm = Algorithm::kAuto);
  absl::StatusOr<OpResult> Broadcast(OpBuffer& buffer, size_t count,
                                     DType dtype, int root,
                                     absl::Duration timeout);

  // Fails the running operation (and every later one until ClearAbort) with
  // `status`, e.g. ABORTED when membership changed.
  void Abort(absl::Status status);
  void ClearAbort();
  // Aborts the running operation only while it has not touched the
  // caller's buffer (it still compares fingerprints); it then fails with
  // `status` and kUntouchedPayload. False (and nothing happens) when no
  // operation runs or it is past that point.
  bool AbortIfUntouched(absl::Status status);

  // The sequence number the next operation will use (0: it adopts the
  // number of the operation its peers run), and a way to set it: the
  // worker numbers every call of its caller, whichever ring runs it.
  uint64_t next_op_seq();
  void set_next_op_seq(uint64_t seq);
  // Carries the counters of the ring this one replaces into this one, so
  // /metrics counters do not restart at a membership change.
  void InheritTelemetry(const Communicator& previous);

  // Parameter-server shards for Algorithm::kParameterServer; shard k is
  // reached through the transport as rank world_size + k.
  void SetServers(std::vector<PeerInfo> servers);

  Progress GetProgress() const;
  Telemetry GetTelemetry() const;
  const CommConfig& config() const { return config_; }

 private:
  struct Op;
  absl::StatusOr<OpResult> Run(const Fingerprint& fp, OpBuffer* buffer,
                               absl::Duration timeout);
  // Which algorithm an operation runs; every rank resolves the same way
  // from the fingerprint alone.
  Algorithm Resolve(const Fingerprint& fp) const;
  absl::Status ExchangeFingerprints(Op& op);
  // One hop: every rank sends its fingerprint (and, when `eager`, its whole
  // buffer) to every other rank. Eager payloads are kept in op.eager.
  absl::Status ExchangeFingerprintsAllToAll(Op& op, bool eager);
  absl::Status CheckFingerprints(Op& op, const std::vector<Fingerprint>& all);
  absl::Status RingAllReduce(Op& op);
  absl::Status NaiveAllReduce(Op& op);
  absl::Status PsAllReduce(Op& op);
  // The header fields every fingerprint / data frame of `op` shares.
  FrameMeta FingerprintMeta(const Op& op) const;
  FrameMeta DataMeta(const Op& op, Phase phase) const;
  // "rank 2 (w2, addr)" or "parameter server shard 0 (ps0, addr)".
  std::string Who(int rank) const;
  absl::Status ChainBroadcast(Op& op);
  // Waits for the next frame of this op from `from`; turns every other
  // outcome into the error the caller returns.
  // `detail` says what exactly is awaited, for the error.
  absl::StatusOr<InFrame> Await(Op& op, int from,
                                const std::string& detail = "");
  absl::Status SendFrame(Op& op, int to, const FrameMeta& meta,
                         const uint8_t* payload, size_t bytes, int segment);
  absl::Status CheckData(Op& op, const InFrame& frame, int from,
                         const FrameMeta& expect);
  // Waits until the wire holds no frame of `segment` (-1: of any segment).
  // Past `deadline` it resets the links, waits for the releases that
  // follow, and returns false.
  bool WaitForReleases(Op& op, int segment, absl::Time deadline);
  void SendAbort(Op& op, const absl::Status& status, int skip_rank);
  void SetLedger(Op& op, Phase phase, int step, int chunk, int chunks,
                 int awaited);
  std::string Where(const Op& op) const;
  // Books `spent` reducing a frame from `peer` (plus the test-only delay,
  // which it sleeps); returns what it booked.
  absl::Duration RecordReduce(Op& op, int peer, absl::Duration spent);

  const CommConfig config_;
  Transport* const transport_;
  Inbox* const inbox_;

  absl::Mutex op_mu_;  // one operation at a time
  uint64_t next_op_seq_ ABSL_GUARDED_BY(op_mu_) = 1;

  mutable absl::Mutex state_mu_;
  Progress progress_ ABSL_GUARDED_BY(state_mu_);
  // The running operation has passed its fingerprints (may touch the
  // buffer); an untouched-abort was requested before that point.
  bool touched_ ABSL_GUARDED_BY(state_mu_) = false;
  absl::Status untouched_abort_ ABSL_GUARDED_BY(state_mu_);
  Telemetry telemetry_ ABSL_GUARDED_BY(state_mu_);
  mutable EdgeWindow window_ ABSL_GUARDED_BY(state_mu_);
  std::vector<PeerInfo> servers_ ABSL_GUARDED_BY(state_mu_);
};

}  // namespace halka

#endif  // HALKA_WORKER_CORE_COMMUNICATOR_H_
