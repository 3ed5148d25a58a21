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
//
// Layout: this class runs one operation at a time (Run); the operation's
// state and I/O are an OpContext (op_context.h), the collectives free
// functions over it (algorithms/algorithms.h), the counters one OpTelemetry
// ledger (telemetry.h).
#ifndef HALKA_CORE_COMMUNICATOR_H_
#define HALKA_CORE_COMMUNICATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/comm_types.h"
#include "core/dtype.h"
#include "core/frame.h"
#include "core/op_buffer.h"
#include "core/op_context.h"
#include "core/telemetry.h"
#include "core/transport.h"

namespace halka {

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
                                     int root, absl::Duration timeout,
                                     Algorithm algorithm = Algorithm::kAuto);
  absl::StatusOr<OpResult> Barrier(absl::Duration timeout);

  // The same on a buffer that may live elsewhere (a CUDA device).
  absl::StatusOr<OpResult> AllReduce(OpBuffer& buffer, size_t count,
                                     DType dtype, ReduceOp op,
                                     absl::Duration timeout,
                                     Algorithm algorithm = Algorithm::kAuto);
  absl::StatusOr<OpResult> Broadcast(OpBuffer& buffer, size_t count,
                                     DType dtype, int root,
                                     absl::Duration timeout,
                                     Algorithm algorithm = Algorithm::kAuto);

  // All-gather over `buffer`, recv_count elements in world slices of
  // send_count: this rank's contribution waits in slice `input_slice`; on
  // success slice i holds rank i's on every rank, bit for bit.
  // Reduce-scatter over `buffer`, send_count elements in world slices of
  // recv_count, reduced in place: on success slice `rank` holds the
  // reduction of every rank's slice `rank` (AVG divides by the world); the
  // other slices hold partial results. Both run on the ring (kAuto, kRing).
  // Refused before they reach the ring (the call takes its number and the
  // peers' copies fail at once, see SkipOp): INVALID_ARGUMENT when the
  // counts do not match the ring's world (naming it) or input_slice is not
  // a slice, UNIMPLEMENTED for kNaive and kParameterServer.
  absl::StatusOr<OpResult> AllGather(OpBuffer& buffer, size_t send_count,
                                     size_t recv_count, int input_slice,
                                     DType dtype, absl::Duration timeout,
                                     Algorithm algorithm = Algorithm::kAuto);
  absl::StatusOr<OpResult> ReduceScatter(
      OpBuffer& buffer, size_t send_count, size_t recv_count, DType dtype,
      ReduceOp op, absl::Duration timeout,
      Algorithm algorithm = Algorithm::kAuto);

  // Reduce to `root` in place over `count` elements: on success the root's
  // buffer holds the reduction (op; AVG divides by the world) of every
  // rank's; the others' hold partial sums (ring) or are unchanged (naive,
  // direct to the root). kAuto: naive up to config.eager_bytes on worlds of
  // at most config.all_to_all_max_world, else ring.
  // Gather over `buffer`, recv_count = world x send_count elements: this
  // rank's contribution waits in slice `input_slice`; on success the
  // root's slice i holds rank i's; no other rank's buffer is written.
  // Scatter over `buffer`, send_count = world x recv_count elements: on
  // success rank r's slice r holds the root's slice r; the root's buffer
  // is not written. All-to-all over `count` = world x slice elements: on
  // success slice k holds rank k's slice r (this rank's), and slice r is
  // unchanged. Gather, scatter and all-to-all go straight between the two
  // ranks concerned (kAuto or kNaive). Refused as AllGather (SkipOp):
  // INVALID_ARGUMENT for counts that do not fit the world or a root outside
  // it, UNIMPLEMENTED for an algorithm the collective lacks.
  absl::StatusOr<OpResult> Reduce(OpBuffer& buffer, size_t count, DType dtype,
                                  ReduceOp op, int root,
                                  absl::Duration timeout,
                                  Algorithm algorithm = Algorithm::kAuto);
  absl::StatusOr<OpResult> Gather(OpBuffer& buffer, size_t send_count,
                                  size_t recv_count, int input_slice,
                                  DType dtype, int root,
                                  absl::Duration timeout,
                                  Algorithm algorithm = Algorithm::kAuto);
  absl::StatusOr<OpResult> Scatter(OpBuffer& buffer, size_t send_count,
                                   size_t recv_count, DType dtype, int root,
                                   absl::Duration timeout,
                                   Algorithm algorithm = Algorithm::kAuto);
  absl::StatusOr<OpResult> AllToAll(OpBuffer& buffer, size_t count,
                                    DType dtype, absl::Duration timeout,
                                    Algorithm algorithm = Algorithm::kAuto);

  // Point to point (core/peer_messages.cc): `bytes` of `buffer` to rank
  // `to`, and the next message from rank `from` (-1: from whichever rank's
  // message arrived first; OpResult::peer says whose) into `buffer`. Only
  // the two ranks call; no fingerprints, no number of the collectives'.
  // A rank's messages to one peer arrive in the order it sent them: the
  // receiver's next message from that peer must carry `tag` and exactly
  // `bytes` (FAILED_PRECONDITION naming both otherwise; the message is
  // consumed, the next recv takes the next one). Send copies the bytes
  // once and returns when every piece has left this rank (a link's ring,
  // socket or stream took it); the receiver's worker holds them until its
  // Recv, within its inbox's byte budget. Errors: INVALID_ARGUMENT (a peer
  // outside the ring, this rank itself), UNAVAILABLE (the link to the peer
  // failed), DEADLINE_EXCEEDED (naming the peer and the bytes still due),
  // ABORTED (the membership changed), DATA_LOSS (a piece out of order).
  absl::StatusOr<OpResult> Send(OpBuffer& buffer, size_t bytes, int to,
                                int tag, absl::Duration timeout);
  absl::StatusOr<OpResult> Recv(OpBuffer& buffer, size_t bytes, int from,
                                int tag, absl::Duration timeout);

  // Fails the running operation (and every later one until ClearAbort) with
  // `status`, e.g. ABORTED when membership changed.
  void Abort(absl::Status status);
  void ClearAbort();
  // Aborts the running operation only while it has not touched the
  // caller's buffer (it still compares fingerprints); it then fails with
  // `status` and kUntouchedPayload (except a rank still adopting whose
  // peers' newest operation was refused: that call was its copy, and fails
  // with the refusal, see Run). False (and nothing happens) when no
  // operation runs or it is past that point.
  bool AbortIfUntouched(absl::Status status);

  // The caller's next call ended on this rank before it reached the ring
  // (its request was refused, its upload failed or was abandoned): it takes
  // the number `seq` (the worker's count of its caller's calls), and every
  // peer is told, whose copy of that
  // call then fails at once (FAILED_PRECONDITION, naming this rank and
  // `status`) instead of waiting for its deadline. A rank new in a running
  // ring (no number yet) first learns the number of the operation its peers
  // run, waiting until `deadline`; where none came and the newest one they
  // ran was refused, it takes that one's number without sending an ABORT
  // (every peer's copy has failed already). Returns the number taken;
  // errors: that of the wait (DEADLINE_EXCEEDED: no peer's operation
  // reached this rank).
  absl::StatusOr<uint64_t> SkipOp(uint64_t seq, const absl::Status& status,
                                  absl::Time deadline);
  // SkipOp of the number the next operation would take (next_op_seq(),
  // read and given up under one lock); not for a rank that adopts (0).
  absl::StatusOr<uint64_t> SkipNextOp(const absl::Status& status);

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
  // The last operations' timelines, oldest first.
  std::vector<TraceOp> GetTrace() const;
  const CommConfig& config() const { return config_; }

 private:
  // One operation, start to end: the op context, fingerprints, the
  // algorithm, the ABORT frames on failure, the ledgers.
  absl::StatusOr<OpResult> Run(const Fingerprint& fp, OpBuffer* buffer,
                               absl::Duration timeout, int input_slice = 0);
  // The fingerprint of an all-gather or reduce-scatter whose buffer holds
  // `whole` = world x `slice` elements (the contribution of an all-gather
  // in slice `input_slice`), or, refused (see SkipOp), why not.
  absl::StatusOr<Fingerprint> SliceOpFingerprint(
      OpKind kind, size_t whole, size_t slice, DType dtype,
      Algorithm algorithm, absl::Duration timeout, int input_slice);
  // SkipOp's ABORT frames for `seq`, to every peer (op_mu_ held).
  void SendSkip(uint64_t seq, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // A call refused before it reaches the ring: it takes its number and the
  // peers' copies fail at once (SkipOp); returns `refused`.
  absl::Status Refuse(absl::Status refused, absl::Duration timeout);
  // OK, or (refused as above) INVALID_ARGUMENT for a root outside the world.
  absl::Status CheckRoot(absl::string_view name, int root,
                         absl::Duration timeout);
  // Gives `op` the sequence number of the operation the ring runs when this
  // rank has none (0): adopted from the peers' frames, or 1 alone.
  absl::Status AdoptOpSeq(OpContext& op);
  // The newest operation a peer sent anything for (0: none) and a peer's
  // ABORT of it, if one is here; refused() when that ABORT is a refusal
  // (FAILED_PRECONDITION: nobody runs it again).
  struct NewestOp {
    uint64_t seq = 0;
    std::optional<absl::Status> abort;
    bool refused() const {
      return abort.has_value() &&
             abort->code() == absl::StatusCode::kFailedPrecondition;
    }
  };
  NewestOp Newest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // After an operation ran (or failed) as op.fp().op_seq: the number the
  // next one takes, from what this one and the peers' frames tell (a
  // newcomer that came late gives the peers' next number up; a newcomer
  // that found only a refusal fails as that operation's copy; a peer
  // further on moves this rank on). May rewrite `status` and the
  // operation's number; false when the failure must not be re-run as an
  // untouched call (kUntouchedPayload). In op_numbering.cc.
  bool SettleNumber(OpContext& op, bool adopting, absl::Status* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // The parameter-server shards an operation of `algorithm` talks to (a
  // copy; none unless kParameterServer).
  std::vector<PeerInfo> ServersFor(Algorithm algorithm) const;
  // The algorithm of `op`'s kind, after the fingerprints agree.
  static absl::Status RunAlgorithm(OpContext& op);

  const CommConfig config_;
  Transport* const transport_;
  Inbox* const inbox_;

  absl::Mutex op_mu_;  // one operation at a time
  uint64_t next_op_seq_ ABSL_GUARDED_BY(op_mu_) = 1;
  // The last operation's send scratch (OpContext::send_scratch), lent to
  // the next one: once an operation ended, every frame that pointed into
  // it is released (or its link cut), as for the caller's buffer. Up to
  // kKeptScratchBytes; a larger one is freed with its operation.
  std::vector<uint8_t> spare_scratch_ ABSL_GUARDED_BY(op_mu_);

  // Point to point: the last message number sent to and taken from each
  // peer (messages are numbered per sender and receiver from 1).
  // Sends number their message and queue all its pieces under send_mu_
  // (one message's pieces are never interleaved with another's on a
  // link); receives run one at a time, in the order they were called, so
  // two never take pieces of one message: each takes a place in line
  // (recv_places_) and runs when recv_turn_ reaches it; one whose deadline
  // passes first gives its place up (recv_given_up_) and fails.
  absl::Mutex send_mu_;
  absl::Mutex peer_mu_;
  std::map<int, uint64_t> sent_to_ ABSL_GUARDED_BY(peer_mu_);
  std::map<int, uint64_t> taken_from_ ABSL_GUARDED_BY(peer_mu_);
  uint64_t recv_places_ ABSL_GUARDED_BY(peer_mu_) = 0;
  uint64_t recv_turn_ ABSL_GUARDED_BY(peer_mu_) = 1;
  std::set<uint64_t> recv_given_up_ ABSL_GUARDED_BY(peer_mu_);
  // Waits for a recv's turn until `deadline`: its place, or 0 (it gave
  // its place up). EndRecvTurn passes the turn on.
  uint64_t AwaitRecvTurn(absl::Time deadline);
  void EndRecvTurn();
  // The peer rank of a Send or Recv, checked; "send"/"recv" name the call.
  absl::Status CheckPeer(int peer, bool any, const char* what) const;

  ProgressLedger progress_;
  OpTelemetry telemetry_;
  mutable absl::Mutex servers_mu_;
  std::vector<PeerInfo> servers_ ABSL_GUARDED_BY(servers_mu_);
};

}  // namespace halka

#endif  // HALKA_CORE_COMMUNICATOR_H_
