// The serving end of a wire link (transport/tcp/wire_link.h): reads records off
// the connection, opens sealed ones, lands payloads that an operation
// offered a place for (core/landing.h) and hands frames on.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "codec/frame_codec.h"
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

}  // namespace

WireReceiver::WireReceiver(int fd, std::string key, OnFrame on_frame,
                           OnError on_error,
                           std::shared_ptr<LandingBoard> landings, int from,
                           std::shared_ptr<LinkCounters> counters)
    : fd_(fd),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      seal_(key.empty() ? nullptr : std::make_unique<WireSeal>(std::move(key))),
      on_frame_(std::move(on_frame)),
      on_error_(std::move(on_error)),
      landings_(from >= 0 ? std::move(landings) : nullptr),
      from_(from),
      counters_(std::move(counters)) {
  if (landings_ != nullptr) landings_->AddSource(from_);
  thread_ = std::thread([this] { Loop(); });
}

WireReceiver::~WireReceiver() {
  Stop();
  if (landings_ != nullptr) landings_->RemoveSource(from_);
  close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void WireReceiver::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      // What the sender wrote before the link ended is still delivered:
      // the stream's end may overtake the data, which comes on another
      // connection. Bounded: a sender that keeps writing cannot hold it.
      drain_until_ = absl::Now() + absl::Milliseconds(250);
    }
  }
  if (wake_fd_ >= 0) Signal(wake_fd_);
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // from its own callback: it returns on its own
    return;
  }
  thread_.join();
}

bool WireReceiver::Stopped() {
  absl::MutexLock lock(&mu_);
  return stopping_ && absl::Now() >= drain_until_;
}

absl::Status WireReceiver::ReadFull(
    size_t n, bool* clean_end,
    absl::FunctionRef<ssize_t(size_t got, size_t want)> take) {
  size_t got = 0;
  // Read first, poll only once the socket has nothing: a record's bytes
  // are usually there together, and each poll is a system call more.
  bool wait = false;
  while (got < n) {
    if (wait) {
      // Until Stop's wake-up, wait for bytes with no timeout: an idle link
      // costs no wake-ups (the socket's keepalive and user timeout still
      // end a dead connection). After it (and without an eventfd), 50 ms
      // slices, so that the drain's end is seen. poll skips a negative fd.
      const bool woken = woken_ || wake_fd_ < 0;
      pollfd pf[2] = {{fd_, POLLIN, 0}, {woken ? -1 : wake_fd_, POLLIN, 0}};
      const int ready = poll(pf, 2, woken ? 50 : -1);
      if (ready < 0 && errno != EINTR) {
        return absl::UnavailableError(Errno("poll"));
      }
      if (pf[1].revents != 0) woken_ = true;
      if (ready <= 0 || pf[0].revents == 0) {
        if (Stopped()) return absl::CancelledError("stopped");
        continue;
      }
    }
    const ssize_t r = take(got, n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
      wait = false;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait = true;
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

absl::Status WireReceiver::ReadFull(uint8_t* p, size_t n, bool* clean_end) {
  return ReadFull(n, clean_end, [this, p](size_t got, size_t want) {
    return recv(fd_, p + got, want, MSG_DONTWAIT);
  });
}

// The payload straight into its place, in bounded pieces, each under the
// landing's lock; once the operation revokes it, the rest goes to scratch
// and the frame is dropped.
absl::Status WireReceiver::LandPlain(Landing& landing, bool* revoked) {
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
absl::Status WireReceiver::LandSealed(Landing& landing,
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

absl::Status WireReceiver::ReadRecord(
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

absl::Status WireReceiver::ReadCloseRecord(const uint8_t head[4]) {
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

void WireReceiver::Loop() {
  for (;;) {
    uint8_t head[4];
    bool clean_end = false;
    absl::Status s = ReadFull(head, 4, &clean_end);
    if (absl::IsCancelled(s)) return;
    if (clean_end) {
      if (closed_) return;  // the close record came first: the normal end
      s = absl::UnavailableError(
          "the connection ended between records without the link's close "
          "record (cut by the network or a third party, or the peer died)");
    }
    const size_t n = GetU32(head);
    if (s.ok() && closed_) {
      s = absl::DataLossError("a record after the link's close record");
    }
    if (s.ok() && n == 0) {
      s = ReadCloseRecord(head);
      if (s.ok()) continue;  // then the connection's end
    }
    if (s.ok() && n > kMaxRecordBytes) {
      s = absl::DataLossError(absl::StrCat("a wire record of ", n,
                                           " bytes (at most ",
                                           kMaxRecordBytes, ")"));
    }
    std::optional<absl::StatusOr<InFrame>> frame;
    if (s.ok()) s = ReadRecord(n, head, &frame);
    if (absl::IsCancelled(s)) return;
    if (!s.ok()) {
      bool stopping;
      {
        absl::MutexLock lock(&mu_);
        stopping = stopping_;
      }
      if (!stopping) on_error_(s);  // else the link has ended already
      return;
    }
    if (frame.has_value() && !on_frame_(*std::move(frame)).ok()) return;
  }
}

}  // namespace halka
