// WireSender's sending side: records onto the connection, by the writer
// thread, or by the caller's own thread when the link is idle and the frame
// is of at most 513 KiB (65 KiB sealed): no hand-off, no wake-up, one
// sendmsg.
// Connecting is in wire_link.cc; the record format in wire_record.h.
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "transport/tcp/wire_link.h"
#include "transport/tcp/wire_record.h"

namespace halka {
namespace {

using wire_record::Errno;
using wire_record::FrameHeadBytes;
using wire_record::kMaxRecordBytes;
using wire_record::PutU32;
using wire_record::SplitParts;

// On a sealed link, frames up to this size (head and payload) may be
// written by the caller's thread: a 64 KiB payload and its head. Larger
// ones are sealed and written by the writer thread, so that the sealing
// of a large chunk runs beside the operation's own work.
constexpr size_t kInlineBytes = (64 + 1) * 1024;

// A plain link's caller writes frames up to this size: a 512 KiB payload
// and its head. One sendmsg costs it the copy into the socket and saves
// the writer's wake-up, which is most of a step of a 256 KiB-1 MiB
// all-reduce. A frame of a whole chunk (1 MiB by default) mostly has
// more behind it: the writer's copy of it then runs beside the
// operation's reduction (docs/performance.md, "The operation's own
// sendmsg, up to 512 KiB").
constexpr size_t kInlinePlainBytes = (512 + 1) * 1024;

// HALKA_WIRE_INLINE=0 turns the caller's writes off (every frame goes to
// the writer thread); HALKA_WIRE_INLINE=small keeps a plain link's too to
// frames of up to kInlineBytes; for comparison. Read once.
enum class Inline { kOff, kSmall, kAll };
Inline InlineWrites() {
  static const Inline mode = [] {
    const char* v = std::getenv("HALKA_WIRE_INLINE");
    if (v == nullptr) return Inline::kAll;
    const std::string s(v);
    if (s == "0") return Inline::kOff;
    return s == "small" ? Inline::kSmall : Inline::kAll;
  }();
  return mode;
}


// Advances `iov` past `n` written bytes; returns the index of the first
// entry with bytes left (iov.size() when none).
size_t Consume(std::vector<iovec>& iov, size_t first, size_t n) {
  while (first < iov.size() && n >= iov[first].iov_len) {
    n -= iov[first].iov_len;
    ++first;
  }
  if (n > 0) {
    iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + n;
    iov[first].iov_len -= n;
  }
  return first;
}

}  // namespace

void WireSender::Send(std::vector<OutFrame> frames) {
  std::vector<OutFrame> done;  // written by this thread, or refused (closed)
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      done = std::move(frames);
    } else {
      for (OutFrame& f : frames) {
        if (TryInline(f)) {
          done.push_back(std::move(f));
        } else {
          queue_.push_back(std::move(f));
        }
      }
    }
  }
  for (OutFrame& f : done) ReleaseOnce(f.on_released);
}

bool WireSender::TryInline(OutFrame& frame) {
  // Only when nothing is ahead of it: the writer is waiting for work (so it
  // is not inside a record, and the seal and its buffer are free), nothing
  // is queued and no earlier record is half written.
  const Inline mode = InlineWrites();
  if (mode == Inline::kOff || !idle_ || fd_ < 0 || !queue_.empty() ||
      remainder_ != nullptr) {
    return false;
  }
  const bool small_only = seal_ != nullptr || mode == Inline::kSmall;
  if (frame.Bytes() > (small_only ? kInlineBytes : kInlinePlainBytes)) {
    return false;
  }
  uint8_t head[8];
  std::vector<iovec> iov;
  if (!BuildRecord(frame, head, &iov).ok()) return false;  // the writer says
  size_t first = 0;
  for (;;) {
    msghdr m{};
    m.msg_iov = iov.data();
    m.msg_iovlen = std::min<size_t>(iov.size(), IOV_MAX);
    const ssize_t w = sendmsg(fd_, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w > 0) first = Consume(iov, 0, static_cast<size_t>(w));
    break;
  }
  inline_frames_.fetch_add(1, std::memory_order_relaxed);
  if (first == iov.size()) return true;
  // The socket took part of the record (or none: a full buffer, or an
  // error the writer will meet and report). The writer sends its rest
  // before anything else.
  inline_partial_.fetch_add(1, std::memory_order_relaxed);
  auto rest = std::make_unique<Remainder>();
  if (seal_ == nullptr) {
    size_t left = 0;
    for (size_t i = first; i < iov.size(); ++i) left += iov[i].iov_len;
    // A plain record is the frame's own bytes behind a head that
    // BuildRecord writes again the same: the writer takes the frame (and
    // its release) and skips what went.
    rest->written = 4 + frame.Bytes() - left;
    rest->frame = std::move(frame);
    frame.on_released = nullptr;
    rest->of_frame = true;
    inline_from_frame_.fetch_add(1, std::memory_order_relaxed);
  } else {
    // Sealed: the record is in sealed_, which the writer reuses (and
    // sealing cannot be done twice): a copy.
    for (size_t i = first; i < iov.size(); ++i) {
      rest->bytes.append(static_cast<const char*>(iov[i].iov_base),
                         iov[i].iov_len);
    }
  }
  remainder_ = std::move(rest);
  return true;
}

void WireSender::Withdraw(const OpId& op) {
  std::vector<Frame> dropped;
  {
    absl::MutexLock lock(&mu_);
    withdrawn_ops_.push_back(op);
    if (withdrawn_ops_.size() > kWithdrawnRemembered) {
      withdrawn_ops_.pop_front();
    }
    std::deque<Frame> kept;
    for (Frame& f : queue_) {
      if (f.DataOf(op)) {
        dropped.push_back(std::move(f));
      } else {
        kept.push_back(std::move(f));
      }
    }
    queue_.swap(kept);
    // A rest the writer has not taken yet: a record no byte of which went
    // is dropped as a queued frame is; one begun is written from a copy,
    // and its frame released now.
    if (remainder_ != nullptr && remainder_->of_frame &&
        remainder_->frame.DataOf(op)) {
      if (remainder_->written == 0) {
        dropped.push_back(std::move(remainder_->frame));
        remainder_ = nullptr;
      } else {
        Frame detached;
        detached.on_released = DetachPayload(remainder_->frame);
        dropped.push_back(std::move(detached));
      }
    }
  }
  for (Frame& f : dropped) ReleaseOnce(f.on_released);
}

void WireSender::Close() {
  std::deque<Frame> dropped;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    // Not inside a record: a half-written one would make the close record
    // garbage; the reader then sees the cut instead.
    if (fd_ >= 0 && idle_ && remainder_ == nullptr) WriteCloseRecord();
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);  // cuts a blocked write
  }
  if (thread_.joinable()) thread_.join();
  {
    absl::MutexLock lock(&mu_);
    dropped.swap(queue_);
    if (remainder_ != nullptr && remainder_->of_frame) {
      dropped.push_back(std::move(remainder_->frame));
    }
    remainder_ = nullptr;
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  for (Frame& f : dropped) ReleaseOnce(f.on_released);
}

void WireSender::WriteCloseRecord() {
  // Best effort and never blocking: a full socket buffer means the reader
  // is behind, and it then sees the cut instead.
  uint8_t rec[4 + WireSeal::kTagBytes] = {0, 0, 0, 0};
  size_t n = 4;
  if (seal_ != nullptr) {
    if (!seal_->Seal({}, absl::MakeConstSpan(rec, 4), rec + 4).ok()) return;
    n += WireSeal::kTagBytes;
  }
  (void)!send(fd_, rec, n, MSG_DONTWAIT | MSG_NOSIGNAL);
}

absl::Status WireSender::BuildRecord(Frame& frame, uint8_t head[8],
                                      std::vector<iovec>* iov) {
  size_t total = 0;
  for (const auto& p : frame.parts) total += p.size();
  if (total > kMaxRecordBytes) {
    return absl::InvalidArgumentError("a frame larger than a wire record");
  }
  PutU32(head, static_cast<uint32_t>(total));
  if (seal_ != nullptr) {
    // Two units, each sealed: the frame's head, then its payload, so that
    // the reader authenticates the head before it decides where the
    // payload goes (core/landing.h).
    const size_t head_bytes = FrameHeadBytes(frame.parts, total);
    PutU32(head + 4, static_cast<uint32_t>(head_bytes));
    const absl::Span<const uint8_t> aad(head, 8);
    std::vector<absl::Span<const uint8_t>> front, payload;
    SplitParts(frame.parts, head_bytes, &front, &payload);
    sealed_.resize(total + 2 * WireSeal::kTagBytes);
    absl::Status s = seal_->Seal(front, aad, sealed_.data());
    if (s.ok()) {
      s = seal_->Seal(payload, aad,
                      sealed_.data() + head_bytes + WireSeal::kTagBytes);
    }
    if (!s.ok()) return s;
    iov->push_back({head, 8});
    iov->push_back({sealed_.data(), sealed_.size()});
  } else {
    iov->push_back({head, 4});
    for (const auto& p : frame.parts) {
      if (p.empty()) continue;
      iov->push_back({const_cast<uint8_t*>(p.data()), p.size()});
    }
  }
  return absl::OkStatus();
}

absl::Status WireSender::WriteAll(std::vector<iovec>& iov, Frame* frame) {
  int fd;
  {
    absl::MutexLock lock(&mu_);
    fd = fd_;
  }
  std::string rest;  // the record's rest, once its frame was withdrawn
  size_t first = 0;
  while (first < iov.size()) {
    msghdr m{};
    m.msg_iov = iov.data() + first;
    m.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w >= 0) {
      first = Consume(iov, first, static_cast<size_t>(w));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(Errno("wire link write"));
    }
    // The socket is full (a slow or stalled reader). A frame whose
    // operation failed meanwhile is let go: its rest is copied, the record
    // finishes from the copy, and the operation's buffer is free.
    if (frame != nullptr && frame->on_released && frame->data) {
      bool withdrawn;
      {
        absl::MutexLock lock(&mu_);
        withdrawn = std::any_of(
            withdrawn_ops_.begin(), withdrawn_ops_.end(),
            [&](const OpId& op) { return frame->DataOf(op); });
      }
      if (withdrawn) {
        for (size_t i = first; i < iov.size(); ++i) {
          rest.append(static_cast<const char*>(iov[i].iov_base),
                      iov[i].iov_len);
        }
        iov.assign(1, iovec{rest.data(), rest.size()});
        first = 0;
        ReleaseOnce(frame->on_released);
      }
    }
    pollfd p{fd, POLLOUT, 0};
    (void)poll(&p, 1, 50);  // Close's shutdown wakes it; sendmsg then fails
  }
  return absl::OkStatus();
}

absl::Status WireSender::Write(Frame& frame) {
  uint8_t head[8];
  std::vector<iovec> iov;
  absl::Status s = BuildRecord(frame, head, &iov);
  if (!s.ok()) return s;
  // Sealed, the record is a copy (sealed_): the frame is free already.
  if (seal_ != nullptr) ReleaseOnce(frame.on_released);
  return WriteAll(iov, &frame);
}

absl::Status WireSender::WriteRest(Remainder& rest) {
  uint8_t head[8];
  std::vector<iovec> iov;
  absl::Status s = BuildRecord(rest.frame, head, &iov);
  if (!s.ok()) return s;
  const size_t first = Consume(iov, 0, rest.written);
  iov.erase(iov.begin(), iov.begin() + static_cast<std::ptrdiff_t>(first));
  return WriteAll(iov, &rest.frame);
}

void WireSender::Loop() {
  absl::Status ready = Connect();
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;  // Close: nobody waits for the answer
  }
  on_ready_(ready);
  if (!ready.ok()) return;
  for (;;) {
    Frame frame;
    std::unique_ptr<Remainder> rest;  // a record the caller began
    {
      absl::MutexLock lock(&mu_);
      idle_ = true;
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty() || remainder_ != nullptr;
      };
      mu_.Await(absl::Condition(&has_work));
      if (stop_) return;
      idle_ = false;
      if (remainder_ != nullptr) {
        rest = std::move(remainder_);
      } else {
        frame = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    absl::Status s;
    if (rest != nullptr && rest->of_frame) {
      s = WriteRest(*rest);
      ReleaseOnce(rest->frame.on_released);
    } else if (rest != nullptr) {
      std::vector<iovec> iov = {{rest->bytes.data(), rest->bytes.size()}};
      s = WriteAll(iov, nullptr);
    } else {
      s = Write(frame);
      ReleaseOnce(frame.on_released);
    }
    if (!s.ok()) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;  // Close cut the write
      }
      on_failed_(s);
      return;
    }
  }
}

}  // namespace halka
