// WireReceiver's shared state (WireReceiver::Core), for its two halves:
// the reader thread's (transport/tcp/wire_receiver.cc: records, sealed
// units, landings) and the inbox tap's, the waiting operation's reads
// (transport/tcp/wire_tap.cc). Internal to the wire link.
#ifndef HALKA_TRANSPORT_TCP_WIRE_RECEIVER_CORE_H_
#define HALKA_TRANSPORT_TCP_WIRE_RECEIVER_CORE_H_

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/tcp/wire_link.h"

namespace halka {
namespace wire_receiver_detail {
// The most a wire reader reads into a landing at once: what an operation
// that takes its landings back may wait for (one read, or, sealed, the
// payload's one decryption: well under a millisecond).
constexpr size_t kLandingPiece = 256 << 10;
// The staging buffer of sealed landings a link keeps between records.
constexpr size_t kKeptStaging = 4 << 20;
// How long the reader stands aside at a time while the tap is attached,
// and after its last detach: frames that come between operations wait at
// most twice this long for the reader (the next operation's wait takes
// them at once).
constexpr absl::Duration kParkSlice = absl::Milliseconds(5);
// How long a link stays its reader's after a record over what the tap
// reads (kTapRecordBytes; a plain link's kTapPlainRecordBytes).
constexpr absl::Duration kLargeHold = absl::Milliseconds(100);
// How long the reader waits for bytes at a time once Stop woke it (so that
// the drain's end is seen).
constexpr int kDrainPollMs = 50;

// The monotonic clock (a step of the wall clock must not hold the reader
// aside, or the tap off), in nanoseconds.
inline int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace wire_receiver_detail

// The reader's state, shared by its thread and the inbox tap (which may
// outlive the WireReceiver: the socket is closed when both are done).
class WireReceiver::Core final : public InboxTap {
 public:
  Core(int fd, std::string key, OnFrame on_frame, OnError on_error,
       std::shared_ptr<LandingBoard> landings, int from,
       std::shared_ptr<LinkCounters> counters, OnError on_rejected)
      : fd_(fd),
        wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        turn_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        seal_(key.empty() ? nullptr
                          : std::make_unique<WireSeal>(std::move(key))),
        on_frame_(std::move(on_frame)),
        on_error_(std::move(on_error)),
        on_rejected_(std::move(on_rejected)),
        landings_(from >= 0 ? std::move(landings) : nullptr),
        from_(from),
        counters_(std::move(counters)) {
    if (landings_ != nullptr) landings_->AddSource(from_);
  }
  ~Core() override {
    if (landings_ != nullptr) landings_->RemoveSource(from_);
    close(fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    if (turn_fd_ >= 0) close(turn_fd_);
  }

  // InboxTap, polled: Seq and Waiter are not used.
  uint32_t Seq() override { return 0; }
  FutexWaiter Waiter(uint32_t) override { return {nullptr, 0, false}; }
  bool polled() const override { return turn_fd_ >= 0; }
  // After Sleeping(true): the turn eventfd is emptied first, so that only
  // a TurnBack from now on makes it readable (one that ran before left
  // reader_turn_ false, and the socket is watched).
  int PollFd() override {
    uint64_t n;
    (void)!read(turn_fd_, &n, sizeof(n));
    return reader_turn_.load() || large() ? turn_fd_ : fd_;
  }
  void Sleeping(bool sleeping) override {
    sleeping_.fetch_add(sleeping ? 1 : -1);
  }
  void Attach(bool attached) override {
    if (!attached) {
      detached_at_ns_.store(wire_receiver_detail::MonotonicNanos(),
                            std::memory_order_relaxed);
    }
    attached_.fetch_add(attached ? 1 : -1);
  }
  // Attached now, or within the last kParkSlice: an operation's waits come
  // one after another (and the next operation's soon after), so the socket
  // stays the tap's between them rather than its reader's for a moment.
  bool tap_active() const {
    if (large()) return false;
    return attached_.load() > 0 ||
           wire_receiver_detail::MonotonicNanos() -
                   detached_at_ns_.load(std::memory_order_relaxed) <
               absl::ToInt64Nanoseconds(wire_receiver_detail::kParkSlice);
  }
  bool over() override { return over_.load(); }
  bool reading_aside() override { return large(); }
  void LeaveToReader() override {
    if (detached_at_ns_.load(std::memory_order_relaxed) == 0) return;
    detached_at_ns_.store(0, std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    park_cv_.SignalAll();
  }
  bool Drain(bool* took) override;

  void ReaderLoop();
  void BeginStop();
  // After the reader thread is gone: no callback runs again.
  void End() {
    absl::MutexLock lock(&read_mu_);
    over_.store(true);
  }
  void Shutdown() { shutdown(fd_, SHUT_RDWR); }

 private:
  // What the reader does with one pass: false once it is over.
  bool ReaderPass();
  // Reads every record there is now (the reader: also one whose bytes are
  // still coming, and what follows it until the socket is empty between
  // records; the tap: only whole records of at most kTapRecordBytes, a
  // plain link's kTapPlainRecordBytes, the reader's turn for any other).
  // Delivers under read_mu_. An error that ends the connection goes to
  // failure_ (the reader thread reports it, outside the lock, not once
  // stopping), and the link is over.
  void ReadRecords(bool tap, bool* took)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // The tap on a sealed link: the next record's bytes on the socket (recv
  // MSG_PEEK and FIONREAD, no wait): whether the tap may read it whole
  // (*ready), or the reader's turn (*hand_over). OK with neither: nothing
  // there. An error: the peer ended the connection (AtEnd's verdict), or
  // the socket failed.
  absl::Status Peek(bool* ready, bool* hand_over);
  // What a recv(MSG_PEEK) that returned r <= 0 (errno as it left it)
  // means: OK (nothing there now), the end (AtEnd's verdict, or
  // OUT_OF_RANGE), or the socket's failure.
  absl::Status PeekedNothing(ssize_t r) const;
  // One record from its head on (head: its 4 length bytes, read).
  absl::Status Record(const uint8_t head[4], bool* took)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // The tap on a plaintext link: one recv(MSG_PEEK) of up to
  // kTapRecordBytes shows whether the next record is there whole (for one
  // of up to kTapPlainRecordBytes, with a FIONREAD), and one recvmsg
  // takes it into the frame's own buffer (Peek, the head's and the body's
  // reads, and the empty socket's last look took five system calls).
  // kMore: a record taken and more bytes behind it; kDone: nothing more
  // for the tap now (a record taken with nothing behind it, nothing there,
  // or the reader's turn); kClose: the close record is next (Record's
  // path). An error ends the link.
  enum class TapRead { kMore, kDone, kClose };
  absl::StatusOr<TapRead> TapPlainRecord(bool* took)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // A frame read whole: counted and handed to on_frame_ (a refusal ends
  // the link: ABORTED, with refused_ set).
  absl::Status Deliver(absl::StatusOr<InFrame> frame, bool* took)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // The connection ended between records: OK after the close record (the
  // link's normal end), UNAVAILABLE otherwise.
  absl::Status AtEnd() const;
  // Waits (without the lock) until the socket has bytes: OK; CANCELLED
  // once stopped and drained; UNAVAILABLE if poll fails.
  absl::Status WaitReadable();
  // Reads exactly n bytes (waiting, as WaitReadable, once the socket has
  // nothing: only the reader ever waits, the tap reads what is there):
  // OK; OUT_OF_RANGE at a clean end before any byte (`clean_end`);
  // CANCELLED once stopped and drained; UNAVAILABLE otherwise.
  absl::Status ReadFull(uint8_t* p, size_t n, bool* clean_end);
  // The same through `take`, which reads at most `want` bytes once without
  // blocking and returns what recv(MSG_DONTWAIT) would.
  absl::Status ReadFull(size_t n, bool* clean_end,
                        absl::FunctionRef<ssize_t(size_t got, size_t want)> take);
  // The rest of a record of n bytes whose length is `head`: OK with *frame
  // set to what DecodeFrame made of it, or left empty (the frame's landing
  // was revoked while it came: its operation has ended, the frame is
  // dropped); otherwise the error that ends the connection.
  absl::Status ReadRecord(size_t n, const uint8_t* head,
                          std::optional<absl::StatusOr<InFrame>>* frame);
  // Reads a landed payload into its place (plain) or into scratch_, opens
  // it there and copies it into place once authentic (sealed).
  absl::Status LandPlain(Landing& landing, bool* revoked);
  absl::Status LandSealed(Landing& landing, absl::Span<const uint8_t> aad,
                          bool* revoked);
  // The link's close record (its 0-byte head read); sealed, its tag.
  absl::Status ReadCloseRecord(const uint8_t head[4]);
  bool Stopped();
  bool stopping();
  // The reader's wait while the tap is attached and the socket is the
  // tap's: Stop and a hand-over wake it.
  void Park();
  // The socket is the reader's until it finds it empty between records.
  void HandOver() ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // The reader's turn is over: a tap asleep on turn_fd_ looks again.
  void TurnBack() ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);

  const int fd_;
  const int wake_fd_;  // an eventfd Stop writes; -1 if none could be made
  // An eventfd the reader writes when its turn ends while a tap sleeps;
  // -1 if none could be made (the link then has no tap).
  const int turn_fd_;
  std::unique_ptr<WireSeal> seal_;
  const OnFrame on_frame_;
  const OnError on_error_;
  const OnError on_rejected_;  // may be null
  const std::shared_ptr<LandingBoard> landings_;  // null: nothing lands
  const int from_;
  const std::shared_ptr<LinkCounters> counters_;  // may be null

  // Who reads: one record at a time, and its delivery, under read_mu_.
  absl::Mutex read_mu_;
  // A revoked landing's bytes; sealed, the staging of a landed payload.
  std::vector<uint8_t> scratch_ ABSL_GUARDED_BY(read_mu_);
  // TapPlainRecord's look at the socket (4 + kTapRecordBytes).
  std::vector<uint8_t> peeked_ ABSL_GUARDED_BY(read_mu_);
  // A close record came: what follows is the connection's end.
  bool closed_ = false;
  // What ended the link, for the reader thread to report: a failure
  // (on_error), or on_frame's refusal of a frame (on_rejected).
  absl::Status failure_ ABSL_GUARDED_BY(read_mu_);
  absl::Status refused_ ABSL_GUARDED_BY(read_mu_);
  bool reading_on_tap_ = false;  // read_mu_'s holder is the tap
  bool woken_ = false;           // the reader's own: Stop's wake-up was seen
  // The socket is the reader's (a record the tap leaves, or the reader is
  // inside one): the tap sleeps on turn_fd_, not on the socket.
  std::atomic<bool> reader_turn_{false};
  // A record over what the tap reads came within kLargeHold: the socket is
  // the reader's. A transfer of large chunks is read beside the
  // operation's reduction, the tap would only hand each over, and a
  // record larger than the socket's buffer holds its sender until it is
  // read (while the operation may wait for that send elsewhere).
  std::atomic<int64_t> large_until_ns_{0};
  bool large() const {
    return wire_receiver_detail::MonotonicNanos() <
           large_until_ns_.load(std::memory_order_relaxed);
  }
  void SawLarge() {
    large_until_ns_.store(wire_receiver_detail::MonotonicNanos() +
                              absl::ToInt64Nanoseconds(wire_receiver_detail::kLargeHold),
                          std::memory_order_relaxed);
  }
  std::atomic<int> sleeping_{0};  // waits asleep on this tap
  std::atomic<int> attached_{0};
  std::atomic<int64_t> detached_at_ns_{0};
  std::atomic<bool> over_{false};
  absl::Mutex mu_;
  absl::CondVar park_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time drain_until_ ABSL_GUARDED_BY(mu_);
};

}  // namespace halka

#endif  // HALKA_TRANSPORT_TCP_WIRE_RECEIVER_CORE_H_
