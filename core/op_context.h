// One operation of a Communicator, below the algorithms: its state and its
// I/O.
//
// An OpContext holds what one collective call needs while it runs: the
// agreed fingerprint, the caller's buffer, the deadline, the plan (which
// algorithm, which peers are watched) and the frames still on the wire. The
// algorithms (core/algorithms/) are free functions over it: they plan
// chunks and reduce, and do every send, wait, check and abort through it,
// so that errors read the same everywhere and every byte is booked once in
// the communicator's OpTelemetry and progress in its ProgressLedger.
//
// Thread-safety: an OpContext belongs to the thread that runs the operation
// and is not thread-safe. Only the release callbacks of its sends run on
// other threads; they touch the shared send counters under their own
// mutex. The ProgressLedger and OpTelemetry it writes to are thread-safe.
#ifndef HALKA_CORE_OP_CONTEXT_H_
#define HALKA_CORE_OP_CONTEXT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/comm_types.h"
#include "core/frame.h"
#include "core/op_buffer.h"
#include "core/ring_plan.h"
#include "core/telemetry.h"
#include "core/transport.h"

namespace halka {

// What the running operation is doing right now, for GetProgress, and
// whether it has touched the caller's buffer yet (AbortIfUntouched).
// Thread-safe.
class ProgressLedger {
 public:
  // A new operation, described by `op` (its fingerprint text), is running
  // and has not touched its buffer; forgets any earlier untouched-abort.
  void Start(std::string op);
  // The operation's description changed (it adopted a sequence number).
  void Describe(std::string op);
  // Where the operation is; `awaited` is the rank it waits for (-1: none).
  // waiting_since restarts whenever `awaited` changes.
  void Set(Phase phase, int step, int chunk, int chunks, int awaited);
  // The fingerprint pass ended with `status`. Returns the status the
  // operation continues with: `status`, or the untouched-abort asked for
  // while it ran. OK means the operation may now touch its buffer.
  absl::Status EndUntouched(absl::Status status);
  // Records `status` for the running operation if it has not touched its
  // buffer yet; false when no operation runs or it is past that point.
  bool RequestUntouchedAbort(const absl::Status& status);
  // No operation runs.
  void Finish();
  Progress Get() const;

 private:
  mutable absl::Mutex mu_;
  Progress progress_ ABSL_GUARDED_BY(mu_);
  // The running operation has passed its fingerprints (may touch the
  // buffer); an untouched-abort was requested before that point.
  bool touched_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status untouched_abort_ ABSL_GUARDED_BY(mu_);
};

// What every operation of one communicator shares. Owned by the
// Communicator; every pointer outlives its operations.
struct CommParts {
  const CommConfig* config;
  Transport* transport;
  Inbox* inbox;
  OpTelemetry* telemetry;
  ProgressLedger* progress;
};

// The header of an ABORT frame that rank `config.rank` originates for
// operation `op_seq`: what every peer's wait on that operation then fails
// with (`code` and `message`).
FrameMeta AbortMeta(const CommConfig& config, uint64_t op_seq,
                    absl::StatusCode code, std::string message);

class OpContext {
 public:
  // An operation of `fp` (op_seq already assigned, possibly 0) on `buffer`,
  // started at `start`, bounded by `timeout` (zero: the configured
  // default). `servers`: the parameter-server shards (ranks world_size +
  // k), used only by Algorithm::kParameterServer.
  OpContext(const CommParts& parts, const Fingerprint& fp, OpBuffer* buffer,
            absl::Duration timeout, absl::Time start, Algorithm algorithm,
            std::vector<PeerInfo> servers);
  ~OpContext();  // WithdrawRecvs()
  OpContext(const OpContext&) = delete;
  OpContext& operator=(const OpContext&) = delete;

  // --- State.
  const CommConfig& config() const { return config_; }
  // For HeldWrites around sends that leave together (communicator.cc).
  Transport* transport() const { return transport_; }
  int rank() const { return config_.rank; }
  int world() const { return config_.world_size; }
  // The ring's path (config().ring_order), this rank's ring position and
  // its ring neighbours.
  const RingPath& path() const { return path_; }
  int position() const { return path_.position(config_.rank); }
  int succ() const { return path_.succ(config_.rank); }
  int pred() const { return path_.pred(config_.rank); }
  const Fingerprint& fp() const { return fp_; }
  void set_op_seq(uint64_t seq) { fp_.op_seq = seq; }
  OpBuffer& buffer() { return *buffer_; }
  // Points buffer() at `other` (nullptr: back at the caller's): a
  // two-level all-reduce reduces its host's sums in a copy while the
  // fingerprints are in flight (TwoLevelStartEarly). Only around steps
  // that post no receive (PostRecv writes into buffer()).
  void LendBuffer(OpBuffer* other) {
    buffer_ = other != nullptr ? other : caller_buffer_;
  }
  absl::Time start() const { return start_; }
  absl::Time deadline() const { return deadline_; }
  absl::Duration timeout() const { return timeout_; }
  // The plan: which algorithm runs (every rank resolves it alike), whether
  // fingerprints (and aborts) go to every rank at once, and how many
  // parameter-server shards take part.
  Algorithm algorithm() const { return algorithm_; }
  bool all_to_all() const { return all_to_all_; }
  int servers() const { return static_cast<int>(servers_.size()); }
  // An eager naive all-reduce's payloads, by rank, taken off the
  // fingerprint frames; empty otherwise.
  std::vector<InFrame>& eager() { return eager_; }
  // DATA_LOSS naming the link when a frame this operation read in place
  // came from memory that was taken away under it (InFrame::intact): the
  // result is then not valid. Call once the algorithm is done.
  absl::Status CheckIntact() const;
  // Host memory an algorithm may send from besides the buffer (the tree's
  // partial results): it lives as long as the context, past the
  // communicator's ReleaseEverything, so a failed operation's frames that
  // still point into it are released before it goes. The communicator
  // lends the last operation's (Communicator::spare_scratch_): its size
  // and contents are whatever that one left, so an algorithm sizes it and
  // writes every byte it sends.
  std::vector<uint8_t>& send_scratch() { return send_scratch_; }
  // How long past the deadline the next waits (Await) end (0, the
  // default): an algorithm whose later waits wait on ranks that wait
  // themselves lets the earlier waits, nearer the cause, fail first and
  // name it in their ABORT.
  void set_wait_slack(absl::Duration slack) {
    wait_slack_ = slack;
    max_wait_slack_ = std::max(max_wait_slack_, slack);
  }
  // The deadline plus the largest slack any wait had: what a wait for the
  // links to let go of frames allows (a wait may have ended in its slack
  // with its result whole).
  absl::Time release_deadline() const { return deadline_ + max_wait_slack_; }
  // Recursive doubling: which half of send_scratch() holds the result.
  int result_half() const { return result_half_; }
  void set_result_half(int half) { result_half_ = half; }
  // All-gather: the slice of the buffer that holds this rank's contribution.
  int input_slice() const { return input_slice_; }
  void set_input_slice(int slice) { input_slice_ = slice; }
  // The ring or halving-doubling sent its first step (this rank's own
  // input, read-only) while the fingerprints were still in flight; the
  // algorithm does not send it again.
  bool first_step_sent() const { return first_step_sent_; }
  void set_first_step_sent() { first_step_sent_ = true; }
  // Fingerprints taken before the exchange's wait, by rank (a two-level
  // all-reduce's host peers', TwoLevelStartEarly): AwaitFingerprints takes
  // them from here instead of waiting for them again. Empty: none.
  std::vector<std::optional<Fingerprint>>& early_fingerprints() {
    return early_fingerprints_;
  }
  // A two-level all-reduce's host reduce-scatter ran in send_scratch()
  // while the fingerprints were in flight, and the cross-host ring's first
  // step left from there (TwoLevelStartEarly): the buffer is still the
  // caller's input; the host's sums wait in the scratch copy.
  bool host_sums_early() const { return host_sums_early_; }
  void set_host_sums_early() { host_sums_early_ = true; }

  // --- Frames.
  // The header fields every fingerprint / data frame of this op shares.
  FrameMeta FingerprintMeta() const;
  FrameMeta DataMeta(Phase phase) const;
  // The header of the data frame that carries chunk `c` at (phase, step,
  // segment): what a sender sends and what a receiver expects.
  FrameMeta ChunkMeta(Phase phase, int step, int segment,
                      const Range& c) const;
  // Hands one frame to the transport. The payload must stay unmodified
  // until WaitForReleases(segment) returns true (segment -1: tracked only
  // by the total). Errors: UNAVAILABLE naming the peer, phase and step.
  absl::Status Send(int to, const FrameMeta& meta, const uint8_t* payload,
                    size_t bytes, int segment);
  // Waits for the next frame of this op from `from` and turns every other
  // outcome into the error the caller returns: ABORTED (or the aborting
  // rank's code), UNAVAILABLE (a watched link broke), the interrupt's code,
  // DEADLINE_EXCEEDED (saying what was awaited; `detail` adds to it).
  absl::StatusOr<InFrame> Await(int from, const std::string& detail = "");
  // Await(from, detail) for the fingerprint of `origin` that `from` brings
  // (its own, or one it forwards). Where the deadline passes first,
  // `origin` is late: this operation's ABORT names it
  // (FrameMeta::late_ranks), so that a rank new in the ring that adopted
  // this operation's number learns its call came after the others had
  // ended it.
  absl::StatusOr<InFrame> AwaitFingerprint(int from, int origin,
                                           const std::string& detail);
  // After AwaitFingerprint timed out: those of `others` whose frames of
  // this operation are not here either are late too.
  void AlsoLate(absl::Span<const int> others);
  // The late ranks this op's ABORT names: those AwaitFingerprint timed out
  // on, or those the ABORT that failed this op named; empty: none.
  const std::vector<int32_t>& late_ranks() const { return late_ranks_; }
  // DATA_LOSS unless `frame` is the data frame `expect` describes (phase,
  // step, segment, offset, count) of this op's generation and dtype.
  absl::Status CheckData(const InFrame& frame, int from,
                         const FrameMeta& expect) const;
  // Await(from), then CheckData(expect).
  absl::StatusOr<InFrame> AwaitData(int from, const FrameMeta& expect);
  // A wait of this operation also fails when the link with `rank` breaks,
  // and an ABORT goes to it too (an algorithm that talks to more than the
  // ring's neighbours). Every rank already is when fingerprints go to
  // every rank at once.
  void Watch(int rank);
  // Tracks at least `segments` segments' sends (each a count of frames on
  // their way). It only adds segments, idle: a count is never reset, so an
  // algorithm that sent its first step early and plans its segments
  // afterwards (or twice) loses no frame still on its way.
  void TrackSegments(size_t segments);
  // Waits until the wire holds no frame of `segment` (-1: of any segment)
  // or `deadline` passes; whether it does. The frames stay where they are:
  // an operation that fails for it frees its buffer with
  // ReleaseEverything. A wait of 10 us or more is a "window" span in the
  // timeline.
  bool WaitForReleases(int segment, absl::Time deadline);
  // Before the buffer goes back: waits until `deadline` for every frame's
  // release; past it, resets the links (a peer that stopped reading holds
  // frames that point into the buffer) and waits for the releases that
  // follow. A failed operation withdraws its frames first
  // (Transport::Withdraw), so only a link that cannot let go is cut.
  void ReleaseEverything(absl::Time deadline);
  // Whether the wire holds no frame of `segment` now (no wait).
  bool SegmentReleased(int segment);
  // Posts a receive: the data frame `expect` from `from` may be written
  // straight into the buffer's range [expect.offset, + expect.count) by
  // the link that carries it (core/landing.h). Post only once
  // nothing reads or writes that range until the frame is taken. Every
  // path accepts the post and may ignore it (the frame then arrives as any
  // other and is copied into place); nothing happens where the buffer
  // cannot take it.
  void PostRecv(int from, const FrameMeta& expect);
  // Takes back every receive posted: no link writes into the buffer after
  // it returns. The destructor calls it, on every path, before the
  // communicator hands the buffer back.
  void WithdrawRecvs();
  // Best effort: tells the neighbours (or every rank, all-to-all) and the
  // parameter servers that this op failed with `status`, except the rank
  // whose ABORT failed it.
  void SendAbort(const absl::Status& status);

  // --- Ledgers.
  // Where the operation is; see ProgressLedger::Set.
  void SetLedger(Phase phase, int step, int chunk, int chunks, int awaited);
  // While held, SetLedger keeps the phase, step and chunk where they are
  // (only the awaited peer follows): work done before the fingerprints
  // agree (TwoLevelStartEarly) stays in the fingerprint phase for the
  // progress ledger, the timeline, the fingerprint pass's end and the
  // error text, as the ring's early first step does.
  void HoldLedger(bool hold) { ledger_held_ = hold; }
  // Books `spent` reducing a frame from `peer` (plus the test-only delay,
  // which it sleeps); returns what it booked.
  absl::Duration RecordReduce(int peer, absl::Duration spent);
  // Books an algorithm's whole reduce time when it succeeds.
  void RecordReduceTotal(absl::Duration spent);
  // After the last release (WaitForReleases): books the links' busy write
  // time and closes the running phase's span in the timeline.
  void EndTrace();
  // When the fingerprint pass ended (InfinitePast: it did not).
  absl::Time fingerprint_end() const { return fingerprint_end_; }

  // --- Error text.
  // "rank 2 (w2, addr)" or "parameter server shard 0 (ps0, addr)".
  std::string Who(int rank) const;
  // "rank 0 (w0, addr): all_reduce #3 float32x1000 sum".
  std::string Where() const;

 private:
  // Counts frames the transport still holds, per segment, so that a segment
  // is never overwritten while the wire may still read it, and the
  // operation never returns while the caller's buffer is referenced. Shared
  // with the release callbacks, which may outlive a failed operation.
  // Each link writes its frames in order, so a frame's write starts when
  // it was handed over or when the previous frame was released, whichever
  // is later, and ends at its release: the link's busy intervals.
  struct WireSpan {
    int peer;
    uint64_t bytes;
    absl::Time start, end;
  };
  struct SendTracker {
    absl::Mutex mu;
    std::vector<int> per_segment ABSL_GUARDED_BY(mu);
    int total ABSL_GUARDED_BY(mu) = 0;
    std::map<int, absl::Time> last_release ABSL_GUARDED_BY(mu);
    std::vector<WireSpan> wire ABSL_GUARDED_BY(mu);
  };
  void TraceStall(absl::Time t0);  // a "window" span from t0, if >= 10 us
  // One span of this op's timeline at the current phase, step and chunk.
  void Trace(TraceSpan::Kind kind, int peer, uint64_t bytes, absl::Time from,
             absl::Time to);

  const CommConfig& config_;
  const RingPath path_;
  Transport* const transport_;
  Inbox* const inbox_;
  OpTelemetry* const telemetry_;
  ProgressLedger* const progress_;

  Fingerprint fp_;
  OpBuffer* const caller_buffer_;
  OpBuffer* buffer_;  // buffer(): the caller's, or one lent (LendBuffer)
  const absl::Time start_;
  const absl::Duration timeout_;
  const absl::Time deadline_;
  const Algorithm algorithm_;
  const bool all_to_all_;
  const std::vector<PeerInfo> servers_;
  std::vector<int> watch_;  // ranks whose broken link fails a wait
  std::shared_ptr<SendTracker> sends_ = std::make_shared<SendTracker>();
  std::vector<InFrame> eager_;
  std::vector<uint8_t> send_scratch_;  // send_scratch()
  int result_half_ = 0;
  absl::Duration wait_slack_;
  absl::Duration max_wait_slack_;
  std::vector<std::shared_ptr<Landing>> landings_;  // offered, not withdrawn
  // One InFrame::intact per sending rank whose frames were read in place.
  std::vector<std::pair<int, std::function<bool()>>> intact_;
  int input_slice_ = 0;
  bool first_step_sent_ = false;
  bool host_sums_early_ = false;
  bool ledger_held_ = false;  // HoldLedger
  std::vector<std::optional<Fingerprint>> early_fingerprints_;
  // Where the op is (mirrors the progress ledger, for error text).
  Phase phase_ = Phase::kFingerprint;
  int step_ = 0;
  int chunk_ = 0;
  int chunks_ = 0;
  int abort_from_ = -1;  // neighbour whose ABORT frame failed this op
  std::vector<int32_t> late_ranks_;  // late_ranks()
  bool timed_out_ = false;  // the last Await ended at the deadline
  absl::Time phase_start_;
  absl::Time fingerprint_end_ = absl::InfinitePast();
};

}  // namespace halka

#endif  // HALKA_CORE_OP_CONTEXT_H_
