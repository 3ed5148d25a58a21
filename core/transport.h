// The boundary between the algorithms and the wire.
//
// The algorithms never see sockets or gRPC: they hand frames to a Transport
// and take received frames from an Inbox, which the transport fills.
#ifndef HALKA_CORE_TRANSPORT_H_
#define HALKA_CORE_TRANSPORT_H_

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/frame.h"
#include "core/futex.h"
#include "core/landing.h"
#include "core/link_counters.h"

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

  // Operation `op` failed on this rank: on every link, its data frames
  // that have not gone out are dropped and one part way out is copied
  // (LinkPath::Withdraw), so that its ABORT is next and its buffer is
  // released without cutting a link. A transport that copies at Send has
  // nothing to do. Thread-safe.
  virtual void Withdraw(const OpId& op) = 0;

  // Drops the frames queued for `to` and cancels its link, releasing every
  // payload promptly. The next Send reconnects. Thread-safe.
  virtual void Reset(int to) = 0;

  // Between HoldWrites and its ReleaseWrites a transport may keep the
  // frames it is given instead of starting their writes, so that frames
  // sent back to back leave together: on a gRPC stream whose peer agreed
  // to batches, in one message, where the first would otherwise leave
  // alone and the next wait for its write to complete (a callback
  // thread's wake-up). The caller must not wait in between for anything
  // a held frame is needed for (a peer's frame, the release of its own
  // payloads): it only sends. Nests; ReleaseWrites of the outermost
  // starts every held write. Thread-safe. Default: nothing is held.
  virtual void HoldWrites() {}
  virtual void ReleaseWrites() {}
};

// HoldWrites for a scope.
class HeldWrites {
 public:
  explicit HeldWrites(Transport* transport) : transport_(transport) {
    if (transport_ != nullptr) transport_->HoldWrites();
  }
  ~HeldWrites() {
    if (transport_ != nullptr) transport_->ReleaseWrites();
  }
  HeldWrites(const HeldWrites&) = delete;
  HeldWrites& operator=(const HeldWrites&) = delete;

 private:
  Transport* const transport_;
};

// A path whose frames the waiting thread can take itself instead of a
// thread of the link's handing them over (a same-host link's ring,
// transport/shm/shm_link.h). Where the kernel can sleep on several words at once
// (futex_waitv), Inbox::Next drains its taps before it sleeps and sleeps
// on their words too, with the taps' own readers standing aside: a record
// then wakes the operation's thread directly, and a record that is already
// there costs no wake-up at all. Without futex_waitv the readers deliver
// as they would without a tap.
class InboxTap {
 public:
  virtual ~InboxTap() = default;
  // The tap's data sequence now: read before the Drain that found nothing.
  virtual uint32_t Seq() = 0;
  // Takes every frame there is now and delivers it (Inbox::Deliver, after
  // the link's own checks), without blocking; sets *took if it took any.
  // False once the tap is over (stopped, failed, closed and drained).
  virtual bool Drain(bool* took) = 0;
  // The word to sleep on, and the calls around the sleep.
  virtual FutexWaiter Waiter(uint32_t seq) = 0;
  virtual void Sleeping(bool sleeping) = 0;
  // While attached, the waiting thread takes the frames: the tap's reader
  // stands aside (it looks again within its poll interval once detached).
  virtual void Attach(bool attached) = 0;
  // Over for good (its link stopped or failed): the inbox forgets it.
  virtual bool over() = 0;
  // A tap on a socket (a wire link, transport/tcp/wire_link.h) instead of
  // a word: the waiting thread sleeps in poll() on PollFd() (what to watch
  // now: the socket, or an eventfd while the tap's reader has the socket),
  // with Sleeping around the sleep; Seq and Waiter are not used. The inbox
  // sleeps on such taps only when every tap it has is one (poll() cannot
  // wait on futex words), and none is reading_aside(); otherwise their
  // readers deliver.
  virtual bool polled() const { return false; }
  virtual int PollFd() { return -1; }
  // A polled tap whose records the waiting thread would not read now (its
  // link carries large records: its reader reads them beside the
  // operation). A wait then leaves every polled tap to its reader.
  virtual bool reading_aside() { return false; }
  // This wait leaves the tap to its reader: the reader stops standing
  // aside for an operation that waited on the tap a moment ago.
  virtual void LeaveToReader() {}
};

// Received frames, per sending rank, and link failures. Filled by the
// transport (any thread, never blocks), drained by the engine.
// Thread-safe.
class Inbox {
 public:
  // Frames from ranks outside [0, max_ranks) are dropped (the transport
  // validates ranks before delivery; this is the last line of defence).
  // `counters`: where it counts its missed wake-ups (its worker's,
  // core/link_counters.h); null: counters of its own.
  explicit Inbox(int max_ranks = 1 << 16,
                 std::shared_ptr<LinkCounters> counters = nullptr);
  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;
  int max_ranks() const { return max_ranks_; }
  const std::shared_ptr<LinkCounters>& counters() const { return counters_; }

  // How long Next polls its taps' words before it sleeps on them (its
  // worker's --shm_spin_us; 0, the default: it sleeps at once). Clamped
  // to [0, 1 ms] as ShmRing::set_spin_before_sleep. Any thread.
  void SetSpinBeforeSleep(absl::Duration spin);
  absl::Duration spin_before_sleep() const;
  // How long Next, waiting on its taps (rings or wire sockets) with
  // nothing there, gives its core away (sched_yield) and looks again
  // before it sleeps: on a host whose ranks outnumber its cores, the rank
  // it waits for mostly runs on this core, and a yield lets it run at once
  // while this thread's own wake-up then costs no futex or socket wake-up
  // (its worker's automatic choice, OperationYield in worker/ring_book.h;
  // 0, the default: none). Before the spin, if both are set. Only where
  // Next waits on its taps (sockets, or rings with futex_waitv): not for
  // frames that come by delivery alone (gRPC streams, a group's inbox).
  // Frames it found so count in counters()->waits_yielded. Clamped to
  // [0, 1 ms]. Any thread.
  void SetYieldBeforeSleep(absl::Duration yield);
  absl::Duration yield_before_sleep() const;

  // Bytes of payload queued and not yet taken by an operation, at most per
  // sending rank and for the whole inbox: a peer past either (a buggy or
  // hostile one streaming frames for a far-future operation) gets
  // RESOURCE_EXHAUSTED naming it, and its link is closed. Landed frames
  // cost nothing (their bytes are in the operation's buffer). What a link
  // holds beyond this is its one record being read (wire: at most
  // wire_record::kMaxRecordBytes; gRPC: one message). Set before frames
  // flow; 0 leaves a bound off.
  struct ByteBudget {
    uint64_t per_peer = uint64_t{1} << 30;  // 1 GiB
    uint64_t total = uint64_t{4} << 30;     // 4 GiB
  };
  void SetByteBudget(ByteBudget budget);
  ByteBudget byte_budget() const;
  uint64_t queued_bytes() const;

  // Where this generation's operations offer landings for their frames,
  // and its links' readers claim them (core/landing.h).
  const std::shared_ptr<LandingBoard>& landings() const { return landings_; }

  // Called (outside the inbox's lock) for every LinkFailed, e.g. to report
  // the broken link to the rendezvous. Set before frames flow.
  void SetLinkFailureHook(std::function<void(int, const absl::Status&)> hook);

  // Called by the transport. RESOURCE_EXHAUSTED (the frame is dropped)
  // when `from` already has kMaxQueuedFrames frames queued: a peer that
  // runs that far ahead is broken or hostile, and its link is closed.
  static constexpr size_t kMaxQueuedFrames = size_t{1} << 16;
  absl::Status Deliver(int from, InFrame frame);
  void LinkFailed(int peer, absl::Status status);

  // Adds a path Next drains (and sleeps on) itself; forgets those that are
  // over (also at every Next with taps). Any thread.
  void AddTap(std::shared_ptr<InboxTap> tap);
  // Forgets a tap (its link's end). Any thread.
  void RemoveTap(const InboxTap* tap);
  size_t taps() const;

  // Sets an error that fails every wait until ClearInterrupt (a membership
  // change, a shutdown); with `groups`, the attached groups' too.
  void Interrupt(absl::Status status, bool groups = true);
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

  // Drops everything queued for operations before `op_seq`, and every such
  // frame that arrives later.
  void DropBefore(uint64_t op_seq);

  // The highest operation sequence any peer has sent a frame or an abort
  // for (0: none). A peer at op s has finished (or failed) every op < s.
  // Takes what the taps hold first (their readers may stand aside).
  uint64_t MaxOpSeqSeen();

  // Those of `ranks` with no frame of operation `op_seq` queued here (the
  // taps' frames taken first, as MaxOpSeqSeen).
  std::vector<int> WithoutFrameOf(absl::Span<const int> ranks,
                                  uint64_t op_seq);

  // The (first) peer's ABORT for operation `op_seq` that is here (Next has
  // not dropped it: DropBefore keeps those of op_seq and later), as its
  // code and message; nullopt if none.
  std::optional<absl::Status> AbortSeen(uint64_t op_seq) const;

  // For a rank that enters a running ring: waits until a peer's frame of
  // an operation that nobody aborted arrives and returns the newest such
  // operation's sequence number. Errors: the interrupt status,
  // DEADLINE_EXCEEDED.
  absl::StatusOr<uint64_t> WaitFirstOpSeq(absl::Time deadline);

  // Point to point (Communicator::Send/Recv): pieces of messages (frames
  // of kind kPeer) wait in a queue per sender of their own, outside the
  // collectives' numbering, within the same byte budget. Waits for the
  // next piece from `from`, or with `from` = -1 for the piece that arrived
  // first from any sender (ev.peer: its sender). kLinkFailed when the link
  // to `from` (any peer's with -1) failed and no piece is there;
  // kInterrupted, kTimeout as Next. The taps' readers deliver meanwhile
  // (this wait does not take their records itself). With heed_interrupt
  // false an interrupt does not end the wait (Communicator::Recv takes what
  // a peer sent before it left). With `tag`, a sender whose next piece
  // starts a message of another tag is passed over (its message stays
  // queued): a recv from any source matches by tag, as gloo's and MPI's.
  Event NextPeer(int from, absl::Time deadline, bool heed_interrupt = true,
                 std::optional<int> tag = std::nullopt);
  // The failure of the link to `peer` since the last ClearLinkFailures.
  absl::Status LinkFailure(int peer) const;

  // Groups (core/sub_ring.h): from now on, the frames of group `id`
  // (FrameMeta::group) go to `inbox`, their sender and sender_rank turned
  // into the group's rank (job rank ranks[i] is group rank i); a frame of
  // the group from a rank outside it is refused (INVALID_ARGUMENT). Frames
  // of a group that arrived before it was attached here (a peer ran ahead)
  // are handed over first, in their order. Link failures of its ranks and
  // interrupts reach it too. INVALID_ARGUMENT when `id` is 0 or attached.
  absl::Status AttachGroup(uint64_t id, std::vector<int> ranks,
                           std::shared_ptr<Inbox> inbox);
  // The group's frames are held again (as before AttachGroup, within the
  // same bounds) until it is attached again.
  void DetachGroup(uint64_t id);
  // Frames held for groups that are not attached: at most kMaxHeldGroups
  // groups, kMaxQueuedFrames frames, and the byte budget's per_peer bytes
  // in all; past them the groups held longest are let go of (their frames
  // dropped: a member's call that comes later waits for them in vain, to
  // its deadline), and a frame that does not fit even then gets
  // RESOURCE_EXHAUSTED, as above. They hold bytes of their own, not their
  // link's.
  static constexpr size_t kMaxHeldGroups = 64;

 private:
  // Has every tap hand over what its link read (its reader may stand
  // aside). Without mu_.
  void TakeFromTaps();
  struct GroupRoute {
    std::shared_ptr<Inbox> inbox;
    std::map<int, int> group_rank;  // by job rank
  };
  // Routes a group's frame (mu_ held): to its inbox, or held.
  absl::Status RouteGroup(int from, InFrame frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands a frame to an attached group's inbox as its rank's (mu_ held:
  // the group's inbox never calls back into this one).
  static absl::Status ToGroup(const GroupRoute& route, int from,
                              InFrame frame);
  std::map<uint64_t, GroupRoute> groups_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::deque<std::pair<int, InFrame>>> held_
      ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> held_order_ ABSL_GUARDED_BY(mu_);  // first held first
  // Drops what is held for group `id`.
  void DropHeld(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t held_frames_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  bool Ready(int from, uint64_t op_seq, absl::Span<const int> watch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The failure of the link with watched `peer` that a wait for `from`'s
  // frame of `op_seq` reports, or null. A peer other than `from` that has
  // delivered a frame of this operation (or a later one) does not fail
  // the wait: it took part before its link ended (a rank that finished
  // and left); a wait for its own frame reports the failure once its
  // queue runs dry, and a peer that crashed part way stalls a neighbour,
  // whose failure and ABORT reach this rank.
  const absl::Status* WatchedFailure(int peer, int from, uint64_t op_seq) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a wait for `from`'s frame of `op_seq` returns now (kTimeout when
  // nothing is ready).
  Event EventLocked(int from, uint64_t op_seq, absl::Span<const int> watch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deliver without the Bump.
  absl::Status Enqueue(int from, InFrame frame);
  // futex_waitv takes at most 128 words: the inbox's and 127 taps'.
  static constexpr size_t kMaxTapsWaited = 127;
  // The longest one sleep on the taps' words lasts (as a ring's reader).
  static constexpr absl::Duration kLongestSleep = absl::Milliseconds(50);
  // Next's wait on the taps (core/inbox_taps.cc): on the polled ones when
  // every tap is one and none reads aside, else on the words (the sockets
  // left to their readers); nullopt when it could not (Next then waits on
  // the inbox alone).
  std::optional<Event> NextOnTaps(int from, uint64_t op_seq,
                                  absl::Span<const int> watch,
                                  absl::Time deadline);
  // Next with taps: drains them, sleeps on them and on events_.
  // nullopt when it could not sleep on the taps' words (Next then waits on
  // the inbox alone). With `polled`, the taps are polled() ones: it sleeps
  // in poll() on their fds and on wake_fd_.
  std::optional<Event> NextWithTaps(
      int from, uint64_t op_seq, absl::Span<const int> watch,
      absl::Time deadline, std::vector<std::shared_ptr<InboxTap>> taps,
      bool polled);
  // One sleep of NextWithTaps on polled taps (until wake_by): false when
  // it could not sleep (no eventfd).
  bool PollSleep(const std::vector<std::shared_ptr<InboxTap>>& taps,
                 uint32_t events, absl::Time wake_by);
  std::vector<std::shared_ptr<InboxTap>> Taps() const;
  // After any change a wait looks for (a frame, an abort, a link failure,
  // an interrupt): wakes a thread sleeping in NextWithTaps.
  void Bump();

  const int max_ranks_;
  // Sleeps on taps that the clock ended although a word had moved go to
  // missed_wakeups (tests and diagnostics).
  const std::shared_ptr<LinkCounters> counters_;
  std::atomic<int64_t> spin_ns_{0};  // SetSpinBeforeSleep
  std::atomic<int64_t> yield_ns_{0};  // SetYieldBeforeSleep
  const std::shared_ptr<LandingBoard> landings_ =
      std::make_shared<LandingBoard>();
  mutable absl::Mutex mu_;
  std::map<int, std::deque<InFrame>> queues_ ABSL_GUARDED_BY(mu_);
  // Per peer, the newest operation it delivered a data frame of
  // (WatchedFailure).
  std::map<int, uint64_t> delivered_seq_ ABSL_GUARDED_BY(mu_);
  // Payload bytes queued, per sending rank and in all (ByteBudget).
  std::map<int, uint64_t> queued_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t total_queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  ByteBudget budget_ ABSL_GUARDED_BY(mu_);
  // Takes the front frame off `from`'s queue, out of the byte count.
  InFrame PopFront(int from, std::deque<InFrame>& q)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<uint64_t, InFrame> aborts_ ABSL_GUARDED_BY(mu_);  // by op_seq
  // kPeer frames per sender, each with its arrival number (NextPeer).
  std::map<int, std::deque<std::pair<uint64_t, InFrame>>> peer_queues_
      ABSL_GUARDED_BY(mu_);
  uint64_t peer_arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  // Checks the budget for `bytes` more from `from` and counts them.
  absl::Status Budget(int from, uint64_t bytes, size_t queued)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `bytes` off `from`'s count.
  void Unbudget(int from, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<int, absl::Status> link_failures_ ABSL_GUARDED_BY(mu_);
  absl::Status interrupt_ ABSL_GUARDED_BY(mu_);
  uint64_t max_seen_ ABSL_GUARDED_BY(mu_) = 0;
  // DropBefore's highest operation: older frames are dropped on arrival.
  uint64_t floor_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(int, const absl::Status&)> hook_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex taps_mu_;
  std::vector<std::shared_ptr<InboxTap>> taps_ ABSL_GUARDED_BY(taps_mu_);
  // Counts the changes Bump reports; NextWithTaps sleeps on it.
  std::atomic<uint32_t> events_{0};
  std::atomic<uint32_t> sleepers_{0};
  // The taps' readers take their paths back at once (LeaveToReader), this
  // inbox's and, for a group's, the job inbox's (whose links carry the
  // group's frames): the wire links' readers (`polled_only`: only they,
  // before a Next that sleeps on the rings but not the sockets), or every
  // tap's, rings' too (before a wait that reads none of them: NextPeer,
  // WaitFirstOpSeq, a Next that cannot sleep on its taps; once per wait).
  void LeaveTapsToReaders(bool polled_only);
  // A group's inbox: the job's inbox that routes its frames (AttachGroup;
  // null once detached). The job's inbox outlives its groups' (SubRing).
  std::atomic<Inbox*> job_inbox_{nullptr};
  // Threads asleep in poll() on polled taps, and the eventfd Bump makes
  // readable for them (-1 if none could be made: polled taps are then
  // left to their readers).
  std::atomic<uint32_t> poll_sleepers_{0};
  std::atomic<int> wake_fd_{-1};  // made with the first polled tap
};

}  // namespace halka

#endif  // HALKA_CORE_TRANSPORT_H_
