// The serving end of a wire link (transport/tcp/wire_link.h): its reader
// thread reads records off the connection, opens sealed ones, lands
// payloads that an operation offered a place for (core/landing.h) and
// hands frames on. The waiting operation's own reads (the tap) are in
// transport/tcp/wire_tap.cc; the state both share in wire_receiver_core.h.
#include <poll.h>
#include <sys/socket.h>
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
#include "transport/tcp/wire_receiver_core.h"
#include "transport/tcp/wire_record.h"

namespace halka {
namespace {

using wire_record::Errno;
using wire_record::GetU32;
using wire_record::kMaxRecordBytes;
using wire_record::Signal;
using wire_receiver_detail::kDrainPollMs;
using wire_receiver_detail::kKeptStaging;
using wire_receiver_detail::kLandingPiece;
using wire_receiver_detail::kParkSlice;

}  // namespace

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
    // Past the drain's end the link stops even if the peer keeps writing
    // (checked first: a busy socket must not hold the stop).
    if ((woken || woken_) && Stopped()) return absl::CancelledError("stopped");
    if (ready > 0 && pf[0].revents != 0) return absl::OkStatus();
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

void WireReceiver::Core::ReadRecords(bool tap, bool* took) {
  reading_on_tap_ = tap;
  absl::Status s;
  for (;;) {
    uint8_t head[4];
    if (tap && seal_ == nullptr) {
      absl::StatusOr<TapRead> next = TapPlainRecord(took);
      if (!next.ok()) {
        s = next.status();
        break;
      }
      if (*next == TapRead::kMore) continue;
      if (*next == TapRead::kDone) break;
      // kClose: the close record takes the path below.
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
    if (s.ok() && !tap &&
        GetU32(head) >
            (seal_ == nullptr ? kTapPlainRecordBytes : kTapRecordBytes)) {
      SawLarge();
    }
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
