// The inbox tap of a wire link (WireReceiver::tap()): the waiting
// operation reads whole small records off the socket itself and sleeps in
// poll on it, taking turns with the link's reader thread
// (transport/tcp/wire_receiver_core.h).
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/frame_codec.h"
#include "core/status_macros.h"
#include "transport/tcp/wire_receiver_core.h"
#include "transport/tcp/wire_record.h"

namespace halka {
namespace {

using wire_record::Errno;
using wire_record::GetU32;
using wire_record::Signal;
using wire_receiver_detail::kParkSlice;

}  // namespace

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

absl::StatusOr<WireReceiver::Core::TapRead>
WireReceiver::Core::TapPlainRecord(bool* took) {
  peeked_.resize(4 + kTapRecordBytes);
  const ssize_t r =
      recv(fd_, peeked_.data(), peeked_.size(), MSG_PEEK | MSG_DONTWAIT);
  if (r <= 0) {
    HALKA_RETURN_IF_ERROR(PeekedNothing(r));
    return TapRead::kDone;  // nothing there now
  }
  if (r < 4) {
    HandOver();  // a head still coming: the reader's
    return TapRead::kDone;
  }
  const size_t n = GetU32(peeked_.data());
  if (n == 0) return TapRead::kClose;
  if (n > kTapPlainRecordBytes) SawLarge();
  // Queued bytes: what the peek saw, or, for a record longer than the
  // peek, what FIONREAD says.
  size_t queued = static_cast<size_t>(r);
  // A record over kTapRecordBytes while the operation offers landings
  // may be a chunk that lands (core/landing.h): the reader's, which puts
  // it in place.
  const bool may_land = n > kTapRecordBytes && landings_ != nullptr &&
                        landings_->Armed();
  if (n > kTapRecordBytes && n <= kTapPlainRecordBytes && !may_land) {
    int q = 0;
    if (ioctl(fd_, FIONREAD, &q) == 0 && q > 0) queued = static_cast<size_t>(q);
  }
  if (n > kTapPlainRecordBytes || may_land || queued < 4 + n) {
    HandOver();  // large, landing, or its bytes still coming: the reader's
    return TapRead::kDone;
  }
  if (closed_) {
    return absl::DataLossError("a record after the link's close record");
  }
  // The record's bytes are queued: take them, the frame into a buffer of
  // its own size (the frame keeps it; the inbox counts its payload).
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
  const absl::Span<const uint8_t> bytes(buf.get(), n);
  HALKA_RETURN_IF_ERROR(Deliver(
      DecodeFrame(absl::MakeConstSpan(&bytes, 1), std::move(buf)), took));
  // More was queued: look again; else the socket was empty behind it (no
  // look that finds nothing).
  return queued > 4 + n ? TapRead::kMore : TapRead::kDone;
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

}  // namespace halka
