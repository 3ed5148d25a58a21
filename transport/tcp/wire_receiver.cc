// The serving end of a wire link (transport/tcp/wire_link.h): reads records off
// the connection, opens sealed ones, lands payloads that an operation
// offered a place for (core/landing.h) and hands frames on.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "codec/frame_codec.h"
#include "common/clock.h"
#include "core/status_macros.h"
#include "transport/tcp/wire_link.h"
#include "transport/tcp/wire_record.h"

namespace halka {
namespace {

using wire_record::Errno;
using wire_record::GetU32;
using wire_record::kMaxRecordBytes;
using wire_record::Signal;

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
// How long a link stays its reader's after a record over kTapRecordBytes.
constexpr absl::Duration kLargeHold = absl::Milliseconds(100);
// How long the reader waits for bytes at a time once Stop woke it (so that
// the drain's end is seen).
constexpr int kDrainPollMs = 50;

// The monotonic clock (a step of the wall clock must not hold the reader
// aside, or the tap off), in nanoseconds.
int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace

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
      detached_at_ns_.store(MonotonicNanos(),
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
           MonotonicNanos() -
                   detached_at_ns_.load(std::memory_order_relaxed) <
               absl::ToInt64Nanoseconds(kParkSlice);
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
  // records; the tap: only whole records of at most kTapRecordBytes, the
  // reader's turn for any other). Delivers under read_mu_. An error that
  // ends the connection goes to failure_ (the reader thread reports it,
  // outside the lock, not once stopping), and the link is over.
  void ReadRecords(bool tap, bool* took)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // The next record's bytes on the socket (recv MSG_PEEK and FIONREAD, no
  // wait): whether the tap may read it whole (*ready), or the reader's turn
  // (*hand_over). OK with neither: nothing there. An error: the peer ended
  // the connection (AtEnd's verdict), or the socket failed.
  absl::Status Peek(bool* ready, bool* hand_over);
  // What a recv(MSG_PEEK) that returned r <= 0 (errno as it left it)
  // means: OK (nothing there now), the end (AtEnd's verdict, or
  // OUT_OF_RANGE), or the socket's failure.
  absl::Status PeekedNothing(ssize_t r) const;
  // One record from its head on (head: its 4 length bytes, read).
  absl::Status Record(const uint8_t head[4], bool* took)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // The tap on a plaintext link: one recv(MSG_PEEK) of up to a whole tap
  // record shows whether the next record is there whole, and one recv
  // takes it into the frame's own buffer (Peek, the head's and the body's
  // reads, and the empty socket's last look took five system calls). OK
  // with *more when the peek saw bytes past that record; *stop when the
  // record is not the tap's (nothing there, the reader's turn, a close
  // record for Record's path: *close).
  absl::Status TapPlainRecord(bool* took, bool* more, bool* stop, bool* close)
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
  // A record over kTapRecordBytes came within kLargeHold: the socket is
  // the reader's. A transfer of large chunks is read beside the
  // operation's reduction, the tap would only hand each over, and a
  // record larger than the socket's buffer holds its sender until it is
  // read (while the operation may wait for that send elsewhere).
  std::atomic<int64_t> large_until_ns_{0};
  bool large() const {
    return MonotonicNanos() <
           large_until_ns_.load(std::memory_order_relaxed);
  }
  void SawLarge() {
    large_until_ns_.store(MonotonicNanos() +
                              absl::ToInt64Nanoseconds(kLargeHold),
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

WireReceiver::WireReceiver(int fd, std::string key, OnFrame on_frame,
                           OnError on_error,
                           std::shared_ptr<LandingBoard> landings, int from,
                           std::shared_ptr<LinkCounters> counters,
                           OnError on_rejected)
    : core_(std::make_shared<Core>(fd, std::move(key), std::move(on_frame),
                                   std::move(on_error), std::move(landings),
                                   from, std::move(counters),
                                   std::move(on_rejected))) {
  // The thread holds the core: should Stop run on it (a callback that
  // ends the link), it outlives this object.
  thread_ = std::thread([core = core_] { core->ReaderLoop(); });
}

WireReceiver::~WireReceiver() {
  Stop();
  core_->Shutdown();  // closed once the tap lets go of it too
}

std::shared_ptr<InboxTap> WireReceiver::tap() const {
  if (!core_->polled()) return nullptr;
  return core_;
}

void WireReceiver::Stop() {
  core_->BeginStop();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // from its own callback: it returns on its own
    return;
  }
  thread_.join();
  core_->End();
}

void WireReceiver::Core::BeginStop() {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      // What the sender wrote before the link ended is still delivered:
      // the stream's end may overtake the data, which comes on another
      // connection. Bounded: a sender that keeps writing cannot hold it.
      drain_until_ = halka::Now() + absl::Milliseconds(250);
    }
    park_cv_.SignalAll();
  }
  if (wake_fd_ >= 0) Signal(wake_fd_);
}

bool WireReceiver::Core::Stopped() {
  absl::MutexLock lock(&mu_);
  return stopping_ && halka::Now() >= drain_until_;
}

bool WireReceiver::Core::stopping() {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void WireReceiver::Core::Park() {
  absl::MutexLock lock(&mu_);
  // Looked at again under mu_: a hand-over, LeaveToReader and the tap's
  // end signal under it.
  if (!stopping_ && !reader_turn_.load() && !over_.load() && tap_active()) {
    park_cv_.WaitWithTimeout(&mu_, kParkSlice);
  }
}

void WireReceiver::Core::HandOver() {
  if (reader_turn_.exchange(true)) return;
  absl::MutexLock lock(&mu_);
  park_cv_.Signal();
}

void WireReceiver::Core::TurnBack() {
  // Stored before sleeping_ is looked at, as the tap announces its sleep
  // before it asks PollFd: one of the two sees the other.
  reader_turn_.store(false);
  if (sleeping_.load() > 0) Signal(turn_fd_);
}

absl::Status WireReceiver::Core::WaitReadable() {
  for (;;) {
    // Until Stop's wake-up, wait for bytes with no timeout: an idle link
    // costs no wake-ups (the socket's keepalive and user timeout still
    // end a dead connection). After it (and without an eventfd), slices,
    // so that the drain's end is seen. poll skips a negative fd.
    const bool woken = woken_ || wake_fd_ < 0;
    pollfd pf[2] = {{fd_, POLLIN, 0}, {woken ? -1 : wake_fd_, POLLIN, 0}};
    const int ready = poll(pf, 2, woken ? kDrainPollMs : -1);
    if (ready < 0 && errno != EINTR) {
      return absl::UnavailableError(Errno("poll"));
    }
    if (pf[1].revents != 0) woken_ = true;
    if (ready > 0 && pf[0].revents != 0) return absl::OkStatus();
    if (Stopped()) return absl::CancelledError("stopped");
  }
}

absl::Status WireReceiver::Core::ReadFull(
    size_t n, bool* clean_end,
    absl::FunctionRef<ssize_t(size_t got, size_t want)> take) {
  size_t got = 0;
  // Read first, wait only once the socket has nothing: a record's bytes
  // are usually there together, and each poll is a system call more.
  while (got < n) {
    const ssize_t r = take(got, n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (reading_on_tap_) {
        // The tap reads only what FIONREAD counted: never here.
        return absl::InternalError(
            "wire tap: a record's counted bytes were not there");
      }
      HALKA_RETURN_IF_ERROR(WaitReadable());
      continue;
    }
    if (r == 0 && got == 0 && clean_end != nullptr) {
      *clean_end = true;
      return absl::OutOfRangeError("end");
    }
    return absl::UnavailableError(
        r == 0 ? "the connection ended inside a record" : Errno("read"));
  }
  return absl::OkStatus();
}

absl::Status WireReceiver::Core::ReadFull(uint8_t* p, size_t n,
                                          bool* clean_end) {
  return ReadFull(n, clean_end, [this, p](size_t got, size_t want) {
    return recv(fd_, p + got, want, MSG_DONTWAIT);
  });
}

// The payload straight into its place, in bounded pieces, each under the
// landing's lock; once the operation revokes it, the rest goes to scratch
// and the frame is dropped.
absl::Status WireReceiver::Core::LandPlain(Landing& landing, bool* revoked) {
  const size_t payload = landing.bytes();
  return ReadFull(payload, nullptr, [&](size_t got, size_t want) -> ssize_t {
    want = std::min(want, kLandingPiece);
    ssize_t r = -1;
    int err = 0;
    auto take = [&](uint8_t* into) {
      r = recv(fd_, into, want, MSG_DONTWAIT);
      err = errno;
    };
    if (*revoked || !landing.Write([&](uint8_t* dst) { take(dst + got); })) {
      *revoked = true;
      scratch_.resize(kLandingPiece);
      take(scratch_.data());
    }
    errno = err;
    return r;
  });
}

// Sealed: the payload and its tag into this link's staging buffer, opened
// there, and only once its tag verified copied into its place (in bounded
// pieces, each under the landing's lock). No byte that failed
// authentication, and no ciphertext, ever reaches the operation's buffer.
absl::Status WireReceiver::Core::LandSealed(Landing& landing,
                                      absl::Span<const uint8_t> aad,
                                      bool* revoked) {
  const size_t payload = landing.bytes();
  scratch_.resize(payload + WireSeal::kTagBytes);
  absl::Status s = ReadFull(scratch_.data(), scratch_.size(), nullptr);
  if (s.ok()) s = seal_->Open(scratch_.data(), payload, aad);
  if (!s.ok()) return s;
  for (size_t at = 0; at < payload && !*revoked; at += kLandingPiece) {
    const size_t piece = std::min(kLandingPiece, payload - at);
    *revoked = !landing.Write([&](uint8_t* dst) {
      std::memcpy(dst + at, scratch_.data() + at, piece);
    });
  }
  // A large staging buffer goes back: at most one record's worth stays.
  if (scratch_.capacity() > kKeptStaging) std::vector<uint8_t>().swap(scratch_);
  return absl::OkStatus();
}

absl::Status WireReceiver::Core::ReadRecord(
    size_t n, const uint8_t* head,
    std::optional<absl::StatusOr<InFrame>>* frame) {
  const bool sealed = seal_ != nullptr;
  const size_t tag = sealed ? WireSeal::kTagBytes : 0;
  // The frame's head ([u32 header length][header]) first where it is a
  // unit of its own (sealed: authenticated before anything is decided on
  // it), or where an operation may wait for this payload
  // (core/landing.h).
  uint8_t aad[8];
  std::memcpy(aad, head, 4);
  std::vector<uint8_t> front;
  if (sealed) {
    absl::Status s = ReadFull(aad + 4, 4, nullptr);
    const size_t h = GetU32(aad + 4);
    if (s.ok() && (h < 4 || h > n || h > 4 + kMaxFrameHeaderBytes)) {
      s = absl::DataLossError(absl::StrCat(
          "a sealed wire record whose frame head is ", h, " of ", n, " bytes"));
    }
    if (s.ok()) {
      front.resize(h + tag);
      s = ReadFull(front.data(), front.size(), nullptr);
    }
    if (s.ok()) s = seal_->Open(front.data(), h, absl::MakeConstSpan(aad));
    if (!s.ok()) return s;
    front.resize(h);
  } else if (landings_ != nullptr && landings_->Armed() && n >= 4) {
    front.resize(4);
    absl::Status s = ReadFull(front.data(), 4, nullptr);
    const size_t h = s.ok() ? GetU32(front.data()) : 0;
    if (s.ok() && h <= kMaxFrameHeaderBytes && 4 + h <= n) {
      front.resize(4 + h);
      s = ReadFull(front.data() + 4, h, nullptr);
    }
    if (!s.ok()) return s;
  }
  std::shared_ptr<Landing> landing;
  if (landings_ != nullptr && landings_->Armed() && front.size() >= 4 &&
      front.size() == 4 + size_t{GetU32(front.data())}) {
    absl::StatusOr<FrameMeta> meta =
        DecodeFrameHead(absl::MakeConstSpan(front).subspan(4));
    if (meta.ok()) landing = landings_->Claim(from_, *meta, n - front.size());
  }
  if (landing == nullptr) {
    // The whole frame in a buffer of its own, which the frame keeps.
    std::shared_ptr<uint8_t[]> buf(new uint8_t[n + tag]);
    const size_t at = front.size();
    if (at > 0) std::memcpy(buf.get(), front.data(), at);
    absl::Status s = ReadFull(buf.get() + at, n - at + tag, nullptr);
    if (s.ok() && sealed) {
      s = seal_->Open(buf.get() + at, n - at, absl::MakeConstSpan(aad));
    }
    if (!s.ok()) return s;
    const absl::Span<const uint8_t> bytes(buf.get(), n);
    *frame = DecodeFrame(absl::MakeConstSpan(&bytes, 1), std::move(buf));
    return absl::OkStatus();
  }
  bool revoked = false;
  absl::Status s = sealed ? LandSealed(*landing, absl::MakeConstSpan(aad), &revoked)
                          : LandPlain(*landing, &revoked);
  if (!s.ok() || revoked) return s;
  if (counters_ != nullptr) {
    counters_->wire.landed.fetch_add(1, std::memory_order_relaxed);
  }
  const absl::Span<const uint8_t> parts[2] = {
      absl::MakeConstSpan(front),
      absl::MakeConstSpan(landing->data(), landing->bytes())};
  absl::StatusOr<InFrame> f =
      DecodeFrame(absl::MakeConstSpan(parts), landing);
  if (f.ok()) f->landed = true;
  *frame = std::move(f);
  return absl::OkStatus();
}

absl::Status WireReceiver::Core::ReadCloseRecord(const uint8_t head[4]) {
  if (closed_) return absl::DataLossError("a second close record");
  if (seal_ != nullptr) {
    uint8_t tag[WireSeal::kTagBytes];
    absl::Status s = ReadFull(tag, sizeof(tag), nullptr);
    if (s.ok()) s = seal_->Open(tag, 0, absl::MakeConstSpan(head, 4));
    if (!s.ok()) return s;
  }
  closed_ = true;
  return absl::OkStatus();
}

absl::Status WireReceiver::Core::AtEnd() const {
  if (closed_) return absl::OkStatus();  // the close record came first
  return absl::UnavailableError(
      "the connection ended between records without the link's close "
      "record (cut by the network or a third party, or the peer died)");
}

absl::Status WireReceiver::Core::PeekedNothing(ssize_t r) const {
  if (r == 0) {
    absl::Status end = AtEnd();
    return end.ok() ? absl::OutOfRangeError("end") : end;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(Errno("read"));
}

absl::Status WireReceiver::Core::Peek(bool* ready, bool* hand_over) {
  *ready = *hand_over = false;
  uint8_t head[4];
  const ssize_t r = recv(fd_, head, sizeof(head), MSG_PEEK | MSG_DONTWAIT);
  if (r <= 0) return PeekedNothing(r);
  int queued = 0;
  if (r < 4 || ioctl(fd_, FIONREAD, &queued) != 0) {
    *hand_over = true;  // a head still coming: the reader's
    return absl::OkStatus();
  }
  const size_t n = GetU32(head);
  // The record's bytes on the connection (wire_link.h): sealed, the
  // head's length word and two tags (one for a close record).
  const size_t tags = seal_ == nullptr ? 0 : (n == 0 ? 1 : 2);
  const size_t total =
      4 + n + (seal_ == nullptr || n == 0 ? 0 : 4) + tags * WireSeal::kTagBytes;
  if (n > kTapRecordBytes) SawLarge();
  if (n > kTapRecordBytes || static_cast<size_t>(queued) < total) {
    *hand_over = true;
  } else {
    *ready = true;
  }
  return absl::OkStatus();
}

absl::Status WireReceiver::Core::Record(const uint8_t head[4], bool* took) {
  const size_t n = GetU32(head);
  if (closed_) return absl::DataLossError("a record after the link's close record");
  if (n == 0) return ReadCloseRecord(head);  // then the connection's end
  if (n > kMaxRecordBytes) {
    return absl::DataLossError(absl::StrCat(
        "a wire record of ", n, " bytes (at most ", kMaxRecordBytes, ")"));
  }
  std::optional<absl::StatusOr<InFrame>> frame;
  HALKA_RETURN_IF_ERROR(ReadRecord(n, head, &frame));
  if (!frame.has_value()) return absl::OkStatus();  // revoked: dropped
  return Deliver(*std::move(frame), took);
}

absl::Status WireReceiver::Core::Deliver(absl::StatusOr<InFrame> frame,
                                         bool* took) {
  *took = true;
  if (reading_on_tap_ && counters_ != nullptr) {
    counters_->wire.tapped.fetch_add(1, std::memory_order_relaxed);
  }
  // A refusal ends the link: on_frame reported it, or on_rejected will.
  absl::Status s = on_frame_(std::move(frame));
  if (s.ok()) return s;
  refused_ = std::move(s);
  return absl::AbortedError("the frame was refused");
}

absl::Status WireReceiver::Core::TapPlainRecord(bool* took, bool* more,
                                                bool* stop, bool* close) {
  *more = *stop = *close = false;
  peeked_.resize(4 + kTapRecordBytes);
  const ssize_t r =
      recv(fd_, peeked_.data(), peeked_.size(), MSG_PEEK | MSG_DONTWAIT);
  *stop = true;
  if (r <= 0) return PeekedNothing(r);
  if (r < 4) {
    HandOver();  // a head still coming: the reader's
    return absl::OkStatus();
  }
  const size_t n = GetU32(peeked_.data());
  if (n == 0) {  // the close record: Record's path
    *close = true;
    return absl::OkStatus();
  }
  if (n > kTapRecordBytes) SawLarge();
  if (n > kTapRecordBytes || static_cast<size_t>(r) < 4 + n) {
    HandOver();  // large, or its bytes still coming: the reader's
    return absl::OkStatus();
  }
  if (closed_) return absl::DataLossError("a record after the link's close record");
  // The peeked bytes are the record's: take them, the frame into a buffer
  // of its own size (the frame keeps it; the inbox counts its payload).
  std::shared_ptr<uint8_t[]> buf(new uint8_t[n]);
  uint8_t head[4];
  iovec iov[2] = {{head, 4}, {buf.get(), n}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  const ssize_t got = recvmsg(fd_, &msg, MSG_DONTWAIT);
  if (got != static_cast<ssize_t>(4 + n)) {
    return absl::InternalError(absl::StrCat(
        "wire tap: a record's ", 4 + n, " peeked bytes were not there (",
        got < 0 ? Errno("read") : absl::StrCat(got, " read"), ")"));
  }
  *stop = false;
  *more = static_cast<size_t>(r) > 4 + n;
  const absl::Span<const uint8_t> bytes(buf.get(), n);
  absl::StatusOr<InFrame> frame =
      DecodeFrame(absl::MakeConstSpan(&bytes, 1), std::move(buf));
  return Deliver(std::move(frame), took);
}

void WireReceiver::Core::ReadRecords(bool tap, bool* took) {
  reading_on_tap_ = tap;
  absl::Status s;
  for (;;) {
    uint8_t head[4];
    if (tap && seal_ == nullptr) {
      bool more = false, stop = false, close = false;
      s = TapPlainRecord(took, &more, &stop, &close);
      if (!s.ok() || (stop && !close)) break;
      if (!close) {
        if (more) continue;
        break;  // the socket held nothing past it: no look that finds none
      }
    }
    if (tap) {
      bool ready = false, hand_over = false;
      s = Peek(&ready, &hand_over);
      if (!s.ok() || !ready) {
        if (s.ok() && hand_over) HandOver();
        break;
      }
      s = ReadFull(head, 4, nullptr);
    } else {
      // The reader: a record whose head is there is read to its end.
      const ssize_t r = recv(fd_, head, 4, MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) {
        s = AtEnd();
        if (s.ok()) s = absl::OutOfRangeError("end");
        break;
      }
      s = r < 0 ? absl::UnavailableError(Errno("read"))
                : ReadFull(head + r, 4 - static_cast<size_t>(r), nullptr);
    }
    if (s.ok() && !tap && GetU32(head) > kTapRecordBytes) SawLarge();
    if (s.ok()) s = Record(head, took);
    if (!s.ok()) break;
  }
  reading_on_tap_ = false;
  if (s.ok()) return;
  // The link is over: its normal end (OUT_OF_RANGE), stopped (CANCELLED),
  // a frame refused (ABORTED: refused_), or failed: the reader thread
  // reports the last two (so that no callback runs after Stop returns, nor
  // under read_mu_).
  over_.store(true);
  if (!absl::IsOutOfRange(s) && !absl::IsCancelled(s) && !absl::IsAborted(s)) {
    failure_ = s;
  }
}

bool WireReceiver::Core::Drain(bool* took) {
  if (over_.load()) return false;
  if (reader_turn_.load() || large() || !read_mu_.TryLock()) {
    return true;  // the reader reads: it delivers, and gives the turn back
  }
  if (!over_.load()) ReadRecords(/*tap=*/true, took);
  const bool over = over_.load();
  read_mu_.Unlock();
  if (over) {
    // The reader ends too, and reports a failure: its poll sees the
    // shut-down socket, or its park is cut short.
    shutdown(fd_, SHUT_RDWR);
    absl::MutexLock lock(&mu_);
    park_cv_.SignalAll();
  }
  return !over;
}

bool WireReceiver::Core::ReaderPass() {
  absl::Status wait;
  if (!over_.load() && !reader_turn_.load()) {
    if (tap_active() && !stopping()) {
      Park();  // the socket is the tap's
      return true;
    }
    wait = WaitReadable();
    // A tap attached while this thread slept in poll: the bytes are the
    // waiting operation's (it polls the socket too); stand aside. A tap
    // asleep on turn_fd_ (it last saw a large record) does not poll the
    // socket: wake it to look again.
    if (wait.ok() && tap_active() && !stopping() && !reader_turn_.load()) {
      if (sleeping_.load() > 0) Signal(turn_fd_);
      return true;
    }
  }
  absl::Status failed, refused;
  {
    absl::MutexLock lock(&read_mu_);
    if (!wait.ok()) {
      over_.store(true);
      if (!absl::IsCancelled(wait)) failure_ = wait;
    }
    if (!over_.load()) {
      // Inside a record the socket is the reader's: a tap sleeps on
      // turn_fd_.
      reader_turn_.store(true);
      bool took = false;
      ReadRecords(/*tap=*/false, &took);
      TurnBack();
    }
    if (!over_.load()) return true;
    failed = std::exchange(failure_, absl::OkStatus());
    refused = std::exchange(refused_, absl::OkStatus());
  }
  if (!stopping()) {
    if (!failed.ok()) on_error_(failed);
    if (!refused.ok() && on_rejected_ != nullptr) on_rejected_(refused);
  }
  return false;
}

void WireReceiver::Core::ReaderLoop() {
  while (ReaderPass()) {
  }
}

}  // namespace halka
