// The boundary between the algorithms and the wire.
//
// The algorithms never see sockets or gRPC: they hand frames to a Transport
// and take received frames from an Inbox, which the transport fills.
#ifndef HALKA_WORKER_CORE_TRANSPORT_H_
#define HALKA_WORKER_CORE_TRANSPORT_H_

#include <deque>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/core/frame.h"

namespace halka {

class Transport {
 public:
  virtual ~Transport() = default;

  // Queues one frame for rank `to`. The payload is not copied: it must stay
  // valid and unmodified until `on_released` runs. `on_released` runs
  // exactly once, on any thread (possibly inside Send), whether or not the
  // frame was delivered. Errors: UNAVAILABLE when the link to `to` cannot be
  // opened; the frame is then released before Send returns. A link that
  // breaks later is reported through Inbox::LinkFailed.
  // Thread-safe.
  virtual absl::Status Send(int to, const FrameMeta& meta,
                            absl::Span<const uint8_t> payload,
                            std::function<void()> on_released) = 0;

  // Drops the frames queued for `to` and cancels its link, releasing every
  // payload promptly. The next Send reconnects. Thread-safe.
  virtual void Reset(int to) = 0;
};

// Received frames, per sending rank, and link failures. Filled by the
// transport (any thread, never blocks), drained by the engine.
// Thread-safe.
class Inbox {
 public:
  // Frames from ranks outside [0, max_ranks) are dropped (the transport
  // validates ranks before delivery; this is the last line of defence).
  explicit Inbox(int max_ranks = 1 << 16);
  int max_ranks() const { return max_ranks_; }

  // Called (outside the inbox's lock) for every LinkFailed, e.g. to report
  // the broken link to the rendezvous. Set before frames flow.
  void SetLinkFailureHook(std::function<void(int, const absl::Status&)> hook);

  // Called by the transport. RESOURCE_EXHAUSTED (the frame is dropped)
  // when `from` already has kMaxQueuedFrames frames queued: a peer that
  // runs that far ahead is broken or hostile, and its link is closed.
  static constexpr size_t kMaxQueuedFrames = size_t{1} << 16;
  absl::Status Deliver(int from, InFrame frame);
  void LinkFailed(int peer, absl::Status status);

  // Sets an error that fails every wait until ClearInterrupt (a membership
  // change, a shutdown).
  void Interrupt(absl::Status status);
  void ClearInterrupt();

  // Forgets link failures (start of an operation: the transport reconnects
  // on the next send).
  void ClearLinkFailures();

  // Result of a wait.
  struct Event {
    enum Type { kFrame, kAbort, kLinkFailed, kInterrupted, kTimeout } type;
    InFrame frame;        // kFrame, kAbort (the abort frame)
    int peer = -1;        // kLinkFailed
    absl::Status status;  // kLinkFailed, kInterrupted
  };

  // Waits for the next frame from `from` that belongs to op `op_seq`,
  // dropping frames of older operations. Returns early with kAbort if any
  // rank's ABORT frame for `op_seq` (or a later op) has arrived, with
  // kLinkFailed if the link to any rank in `watch` failed, with kInterrupted
  // after Interrupt, and with kTimeout at `deadline`. A frame of a later
  // operation from `from` is left queued and reported as kAbort with a
  // synthetic frame (the sender has moved on: it abandoned `op_seq`).
  Event Next(int from, uint64_t op_seq, absl::Span<const int> watch,
             absl::Time deadline);

  // Drops everything queued for operations before `op_seq`.
  void DropBefore(uint64_t op_seq);

  // The highest operation sequence any peer has sent a frame or an abort
  // for (0: none). A peer at op s has finished (or failed) every op < s.
  uint64_t MaxOpSeqSeen() const;

  // For a rank that enters a running ring: waits until a peer's frame of
  // an operation that nobody aborted arrives and returns the newest such
  // operation's sequence number. Errors: the interrupt status,
  // DEADLINE_EXCEEDED.
  absl::StatusOr<uint64_t> WaitFirstOpSeq(absl::Time deadline);

 private:
  bool Ready(int from, uint64_t op_seq, absl::Span<const int> watch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_ranks_;
  mutable absl::Mutex mu_;
  std::map<int, std::deque<InFrame>> queues_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, InFrame> aborts_ ABSL_GUARDED_BY(mu_);  // by op_seq
  std::map<int, absl::Status> link_failures_ ABSL_GUARDED_BY(mu_);
  absl::Status interrupt_ ABSL_GUARDED_BY(mu_);
  uint64_t max_seen_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(int, const absl::Status&)> hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace halka

#endif  // HALKA_WORKER_CORE_TRANSPORT_H_
