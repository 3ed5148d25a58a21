#include "transport/shm/shm_link.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>

#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "codec/frame_codec.h"

namespace halka {
namespace {

// How long a sleeping end waits before it looks at its stop flag again
// (Close also wakes it at once).
constexpr absl::Duration kPoll = absl::Milliseconds(50);
// How long a ring's reader stands aside, without announcing a sleep, once
// an operation has taken the ring's records since its last look (below,
// ShmReceiver::Tap::StandAside): frames that come between operations, with
// no operation after them, wait at most about this long for the reader.
constexpr absl::Duration kStandAsideSlice = absl::Milliseconds(5);

size_t TotalBytes(const std::vector<absl::Span<const uint8_t>>& parts) {
  size_t n = 0;
  for (const auto& p : parts) n += p.size();
  return n;
}

void Release(ShmSender::Frame& f) { ReleaseOnce(f.on_released); }

// Keeps one record of the ring until the InFrame that points into it is
// gone.
class HeldRecord {
 public:
  HeldRecord(std::shared_ptr<ShmRing> ring, uint64_t id)
      : ring_(std::move(ring)), id_(id) {}
  HeldRecord(const HeldRecord&) = delete;
  HeldRecord& operator=(const HeldRecord&) = delete;
  ~HeldRecord() { ring_->Release(id_); }

 private:
  const std::shared_ptr<ShmRing> ring_;
  const uint64_t id_;
};

}  // namespace

size_t LinkRingBytes(size_t chunk_bytes) {
  const size_t want = 4 * (chunk_bytes + (size_t{64} << 10));
  return std::min(size_t{64} << 20, std::max(size_t{1} << 20, want));
}

bool PeerMayShareHost(const std::string& address) {
  if (IsLocalAddress(address)) return true;
  const std::string host = HostOf(address);
  in6_addr a6{};
  in_addr a4{};
  const bool v4 = inet_pton(AF_INET, host.c_str(), &a4) == 1;
  const bool v6 = !v4 && inet_pton(AF_INET6, host.c_str(), &a6) == 1;
  if (!v4 && !v6) return true;  // a name: let the peer decide
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return true;
  bool mine = false;
  for (ifaddrs* i = list; i != nullptr && !mine; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (v4 && i->ifa_addr->sa_family == AF_INET) {
      mine = std::memcmp(&reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr,
                         &a4, sizeof(a4)) == 0;
    } else if (v6 && i->ifa_addr->sa_family == AF_INET6) {
      mine = std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                         &a6, sizeof(a6)) == 0;
    }
  }
  freeifaddrs(list);
  return mine;
}

std::function<size_t(int)> LinkRingPolicy(bool enabled, size_t chunk_bytes,
                                          int successor) {
  if (!enabled) return nullptr;
  const size_t data = LinkRingBytes(chunk_bytes);
  return [data, successor](int to) {
    return to == successor ? data : kSmallLinkRingBytes;
  };
}

ShmSender::ShmSender(std::shared_ptr<ShmRing> ring) : ring_(std::move(ring)) {
  writer_ = std::thread([this] { WriterLoop(); });
}

ShmSender::~ShmSender() { Close(); }

void ShmSender::Send(std::vector<OutFrame> frames) {
  std::vector<OutFrame> released;
  {
    absl::MutexLock lock(&mu_);
    for (OutFrame& f : frames) {
      const size_t total = TotalBytes(f.parts);
      // Copied now (one frame, nothing ahead of it, room in the ring), or
      // dropped (the link is over): released below, outside the lock.
      if (stop_ || (frames.size() == 1 && queue_.empty() &&
                    ring_->TryWrite(f.parts, total))) {
        released.push_back(std::move(f));
        continue;
      }
      queue_.push_back(Queued{std::move(f), total, 0});
    }
  }
  for (OutFrame& f : released) Release(f);
}

void ShmSender::Withdraw(const OpId& op) {
  std::vector<OutFrame> dropped;
  std::vector<std::function<void()>> detached;
  {
    // The writer copies into the ring under mu_: no copy is under way.
    absl::MutexLock lock(&mu_);
    std::deque<Queued> kept;
    for (Queued& q : queue_) {
      if (!q.frame.DataOf(op)) {
        kept.push_back(std::move(q));
      } else if (q.done > 0) {
        detached.push_back(DetachPayload(q.frame));  // `done` stays valid
        kept.push_back(std::move(q));
      } else {
        dropped.push_back(std::move(q.frame));
      }
    }
    queue_.swap(kept);
  }
  for (OutFrame& f : dropped) Release(f);
  for (auto& release : detached) ReleaseOnce(release);
}

void ShmSender::Close() {
  std::deque<Queued> dropped;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    dropped.swap(queue_);
  }
  ring_->Close();
  if (writer_.joinable() && writer_.get_id() != std::this_thread::get_id()) {
    writer_.join();
  }
  for (Queued& q : dropped) Release(q.frame);
}

void ShmSender::WriterLoop() {
  for (;;) {
    Frame finished;
    bool have_finished = false;
    bool wait_for_space = false;
    uint32_t seq = 0;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      if (ring_->closed()) {
        // The receiver closed it (its link is ending): nothing more can
        // go through. Close (from OnDone) releases what is queued.
        mu_.Await(absl::Condition(&stop_));
        return;
      }
      Queued& q = queue_.front();
      seq = ring_->SpaceSeq();
      if (!ring_->TryWriteRecord(q.frame.parts, q.total, &q.done)) {
        wait_for_space = true;
      } else if (q.done == q.total) {
        finished = std::move(q.frame);
        have_finished = true;
        queue_.pop_front();
      }
    }
    if (have_finished) Release(finished);
    if (wait_for_space) ring_->WaitForSpace(seq, kPoll);
  }
}

// The consuming side of a link's ring: the reader thread and an
// operation's thread (through the Inbox) take turns here. The callbacks
// that end the link (on_rejected, on_error) run after the lock is
// released, so that nothing they start (a gRPC Finish, and whatever it
// runs) can find it held.
class ShmReceiver::Tap final : public InboxTap {
 public:
  Tap(std::shared_ptr<ShmRing> ring, OnFrame on_frame, OnError on_rejected,
      OnError on_error)
      : ring_(std::move(ring)),
        on_frame_(std::move(on_frame)),
        on_rejected_(std::move(on_rejected)),
        on_error_(std::move(on_error)) {}

  uint32_t Seq() override { return ring_->DataSeq(); }
  bool Drain(bool* took) override {
    absl::Status rejected, failed;
    bool over;
    {
      absl::MutexLock lock(&mu_);
      if (over_) return false;
      DrainLocked(took, &rejected, &failed);
      over = over_;
    }
    if (!rejected.ok()) on_rejected_(rejected);
    if (!failed.ok()) on_error_(failed);
    return !over;
  }
  FutexWaiter Waiter(uint32_t seq) override { return ring_->DataWaiter(seq); }
  void Sleeping(bool sleeping) override { ring_->ConsumerSleeping(sleeping); }
  void Attach(bool attached) override {
    if (attached) attaches_.fetch_add(1, std::memory_order_relaxed);
    attached_.fetch_add(attached ? 1 : -1);
  }
  // A wait that does not take the ring's records itself (a group's, a
  // naive operation's, one past the taps a thread can sleep on) needs the
  // reader now: it stops standing aside and sleeps on the ring's word.
  // Asked already and not yet taken up: the reader is woken, or will see
  // it before it parks again.
  void LeaveToReader() override {
    if (leave_.exchange(true)) return;
    absl::MutexLock lock(&park_mu_);
    park_cv_.SignalAll();
  }
  bool over() override {
    absl::MutexLock lock(&mu_);
    return over_;
  }

  bool attached() const { return attached_.load() > 0; }
  bool stopping() const { return stopping_.load(); }

  // The reader's wait while the tap is attached: Stop and LeaveToReader
  // wake it, a detach does not (the reader looks again within `timeout`;
  // the next operation drains the ring at its first wait, and
  // Inbox::MaxOpSeqSeen drains it too).
  void Park(absl::Duration timeout) {
    absl::MutexLock lock(&park_mu_);
    if (!stopping_) park_cv_.WaitWithTimeout(&park_mu_, timeout);
  }
  // The reader's turn with nothing in the ring, the tap detached. Where an
  // operation attached since the reader's last look, operations are
  // running on this ring: their waits come one after another, and each
  // takes what arrived between them at its start. The reader then parks
  // for kStandAsideSlice without announcing a sleep on the ring's word
  // (true), so a record written while the operation is not waiting (it
  // reduces, returns to its caller, or the peer is simply ahead) wakes
  // nobody; announced, every such record would wake the reader, a context
  // switch per operation (a peer that keeps ahead keeps it so). False: no
  // operation came, or a wait needs the reader (LeaveToReader), or it
  // stops: the reader sleeps on the word.
  bool StandAside() {
    const uint64_t attaches = attaches_.load(std::memory_order_relaxed);
    absl::MutexLock lock(&park_mu_);
    if (leave_.exchange(false) || stopping_ || attaches == seen_attaches_) {
      seen_attaches_ = attaches;
      return false;
    }
    seen_attaches_ = attaches;
    stand_asides_.fetch_add(1, std::memory_order_relaxed);
    park_cv_.WaitWithTimeout(&park_mu_,
                             absl::Nanoseconds(stand_aside_ns_.load()));
    return true;
  }
  void set_stand_aside(absl::Duration d) {
    stand_aside_ns_.store(absl::ToInt64Nanoseconds(d));
  }
  uint64_t stand_asides() const { return stand_asides_.load(); }

  // Delivers what was written up to now, no more, from now on.
  void BeginStop() {
    absl::MutexLock lock(&park_mu_);
    if (stopping_) return;
    stop_at_ = ring_->Published();  // before stopping_: Drain reads both
    stopping_ = true;
    ring_->Close();
    park_cv_.SignalAll();
  }
  // After the reader is gone: no callback runs again.
  void End() {
    absl::MutexLock lock(&mu_);
    over_ = true;
  }

 private:
  void DrainLocked(bool* took, absl::Status* rejected, absl::Status* failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      if (stopping_ && ring_->read_position() >= stop_at_) {
        over_ = true;
        return;
      }
      absl::StatusOr<std::optional<ShmRing::Record>> r =
          ring_->Next(absl::ZeroDuration());
      absl::Status s = r.status();
      if (s.ok()) {
        if (!r->has_value()) {
          // Closed and drained: a record published just before the close
          // (after Next looked) is taken on the next pass.
          if (ring_->closed() &&
              ring_->Published() == ring_->read_position()) {
            over_ = true;
          }
          return;
        }
        *took = true;
        bool ring_error = true;
        s = Take(**r, &ring_error);
        if (!s.ok() && !ring_error) {  // on_frame refused it
          ring_->Close();
          over_ = true;
          *rejected = s;
          return;
        }
      }
      if (!s.ok()) {
        ring_->Close();
        over_ = true;
        *failed = s;
        return;
      }
    }
  }
  // Ring errors (for on_error) or on_frame's (for on_rejected).
  absl::Status Take(const ShmRing::Record& r, bool* ring_error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<ShmRing> ring_;
  const OnFrame on_frame_;
  const OnError on_rejected_;
  const OnError on_error_;
  absl::Mutex mu_;
  bool over_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint8_t> assembling_ ABSL_GUARDED_BY(mu_);  // a frame of several records
  size_t expect_ ABSL_GUARDED_BY(mu_) = 0;  // its bytes
  bool in_frame_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> attached_{0};
  std::atomic<uint64_t> attaches_{0};  // Attach(true) calls, ever
  std::atomic<int64_t> stand_aside_ns_{
      absl::ToInt64Nanoseconds(kStandAsideSlice)};
  absl::Mutex park_mu_;
  absl::CondVar park_cv_;
  std::atomic<bool> leave_{false};  // LeaveToReader, not yet taken up
  std::atomic<uint64_t> stand_asides_{0};
  uint64_t seen_attaches_ ABSL_GUARDED_BY(park_mu_) = 0;  // StandAside's
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> stop_at_{0};  // the sender's position at Stop
};

ShmReceiver::ShmReceiver(std::shared_ptr<ShmRing> ring, OnFrame on_frame,
                         OnError on_rejected, OnError on_error)
    : tap_(std::make_shared<Tap>(ring, std::move(on_frame),
                                 std::move(on_rejected),
                                 std::move(on_error))) {
  // The thread holds what it uses: should Stop run on it (a callback that
  // ends the link), it outlives this object.
  reader_ = std::thread([tap = tap_, ring = std::move(ring)] {
    ReaderLoop(*tap, *ring);
  });
}

ShmReceiver::~ShmReceiver() { Stop(); }

std::shared_ptr<InboxTap> ShmReceiver::tap() const { return tap_; }

void ShmReceiver::set_stand_aside(absl::Duration d) { tap_->set_stand_aside(d); }

uint64_t ShmReceiver::stand_asides() const { return tap_->stand_asides(); }

void ShmReceiver::Stop() {
  tap_->BeginStop();
  if (!reader_.joinable()) return;
  if (reader_.get_id() == std::this_thread::get_id()) {
    reader_.detach();  // it returns right after this
    return;
  }
  reader_.join();
  tap_->End();
}

void ShmReceiver::ReaderLoop(Tap& tap, ShmRing& ring) {
  for (;;) {
    if (tap.attached() && !tap.stopping()) {
      tap.Park(kPoll);
      continue;
    }
    const uint32_t seq = ring.DataSeq();
    bool took = false;
    if (!tap.Drain(&took)) return;
    if (took || tap.StandAside()) continue;
    ring.WaitForData(seq, kPoll);
  }
}

absl::Status ShmReceiver::Tap::Take(const ShmRing::Record& r,
                                    bool* ring_error) {
  const bool first = (r.flags & ShmRing::kFirst) != 0;
  const bool last = (r.flags & ShmRing::kLast) != 0;
  if (first == in_frame_) {
    ring_->Release(r.id);
    return absl::DataLossError(
        first ? "link ring: a frame starts inside another"
              : "link ring: a frame continues that never started");
  }
  if (first && last) {
    if (r.bytes != r.frame_bytes) {
      ring_->Release(r.id);
      return absl::DataLossError("link ring: a frame's size disagrees");
    }
    auto hold = std::make_shared<HeldRecord>(ring_, r.id);
    const absl::Span<const uint8_t> bytes(r.data, r.bytes);
    *ring_error = false;
    absl::StatusOr<InFrame> f =
        DecodeFrame(absl::MakeConstSpan(&bytes, 1), std::move(hold));
    // Read in place: the ring (held by the frame) may shrink under it.
    if (f.ok()) f->intact = [ring = ring_.get()] { return !ring->broken(); };
    return on_frame_(std::move(f));
  }
  // A frame in several records: assemble it (bounded by the frame limit).
  if (first) {
    if (r.frame_bytes > kMaxFramePayloadBytes + kMaxFrameHeaderBytes + 4) {
      ring_->Release(r.id);
      return absl::DataLossError(absl::StrCat(
          "link ring: a frame of ", r.frame_bytes, " bytes is over the limit"));
    }
    assembling_.clear();
    assembling_.reserve(r.frame_bytes);
    expect_ = r.frame_bytes;
    in_frame_ = true;
  }
  if (r.frame_bytes != expect_ || assembling_.size() + r.bytes > expect_ ||
      (last && assembling_.size() + r.bytes != expect_)) {
    ring_->Release(r.id);
    return absl::DataLossError("link ring: a frame's records disagree");
  }
  assembling_.insert(assembling_.end(), r.data, r.data + r.bytes);
  ring_->Release(r.id);
  if (ring_->broken()) {
    return absl::DataLossError(absl::StrCat(
        "link ring ", ring_->name(), " shrank under its mapping while a frame "
        "was read from it (truncated by another process)"));
  }
  if (!last) return absl::OkStatus();
  in_frame_ = false;
  auto bytes = std::make_shared<std::vector<uint8_t>>(std::move(assembling_));
  assembling_ = {};
  const absl::Span<const uint8_t> span(bytes->data(), bytes->size());
  *ring_error = false;
  return on_frame_(DecodeFrame(absl::MakeConstSpan(&span, 1), std::move(bytes)));
}

}  // namespace halka
