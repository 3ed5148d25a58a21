#include "core/transport.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace halka {

Inbox::Inbox(int max_ranks, std::shared_ptr<LinkCounters> counters)
    : max_ranks_(max_ranks),
      counters_(counters != nullptr ? std::move(counters)
                                    : std::make_shared<LinkCounters>()) {}

Inbox::~Inbox() {
  const int fd = wake_fd_.load();
  if (fd >= 0) close(fd);
}

void Inbox::SetSpinBeforeSleep(absl::Duration spin) {
  spin_ns_.store(absl::ToInt64Nanoseconds(
      std::clamp(spin, absl::ZeroDuration(), absl::Milliseconds(1))));
}

absl::Duration Inbox::spin_before_sleep() const {
  return absl::Nanoseconds(spin_ns_.load(std::memory_order_relaxed));
}

void Inbox::SetYieldBeforeSleep(absl::Duration yield) {
  yield_ns_.store(absl::ToInt64Nanoseconds(
      std::clamp(yield, absl::ZeroDuration(), absl::Milliseconds(1))));
}

absl::Duration Inbox::yield_before_sleep() const {
  return absl::Nanoseconds(yield_ns_.load(std::memory_order_relaxed));
}

void Inbox::SetLinkFailureHook(
    std::function<void(int, const absl::Status&)> hook) {
  absl::MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

void Inbox::Bump() {
  events_.fetch_add(1);
  if (sleepers_.load() != 0) FutexWakeAll(&events_, /*shared=*/false);
  if (poll_sleepers_.load() != 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_.load(), &one, sizeof(one));
  }
}

absl::Status Inbox::Deliver(int from, InFrame frame) {
  absl::Status s = Enqueue(from, std::move(frame));
  if (s.ok()) Bump();
  return s;
}

absl::Status Inbox::Enqueue(int from, InFrame frame) {
  absl::MutexLock lock(&mu_);
  if (from < 0 || from >= max_ranks_) {  // validated by the transport
    return absl::InvalidArgumentError(absl::StrCat("no rank ", from));
  }
  if (frame.meta.group != 0) return RouteGroup(from, std::move(frame));
  if (frame.meta.kind == FrameKind::kPeer) {
    auto& q = peer_queues_[from];
    absl::Status s = Budget(from, frame.PayloadBytes(), q.size());
    if (!s.ok()) return s;
    // A piece may wait long for its recv: it gets bytes of its own, and
    // lets go of the link's memory (a same-host ring frees its space only
    // as its records are let go of: kept, every rank sending a large
    // message at once would find its ring full and wait for a receiver
    // that waits, itself, on its own send).
    auto bytes = std::make_shared<std::vector<uint8_t>>();
    bytes->reserve(frame.PayloadBytes());
    for (absl::Span<const uint8_t> p : frame.pieces) {
      bytes->insert(bytes->end(), p.begin(), p.end());
    }
    if (frame.intact && !frame.intact()) {
      Unbudget(from, frame.PayloadBytes());
      return absl::DataLossError(absl::StrCat(
          "a message piece from rank ", from, " was overwritten in its "
          "shared memory before it was read"));
    }
    frame.pieces.assign(1, absl::MakeConstSpan(*bytes));
    frame.keepalive = std::move(bytes);
    frame.intact = nullptr;
    q.emplace_back(++peer_arrivals_, std::move(frame));
    return absl::OkStatus();
  }
  max_seen_ = std::max(max_seen_, frame.meta.op_seq);
  // A frame of an operation DropBefore already let go of (it arrived, or
  // was taken off its ring, late): dropped now. Kept, it would hold its
  // record, and a ring frees its space only over a prefix of released
  // records: one old frame kept would stop the link.
  if (frame.meta.op_seq < floor_) return absl::OkStatus();
  if (frame.meta.kind == FrameKind::kAbort) {
    // An abort is kept until the operation is over and only its header is
    // read: it need not hold its ring record either.
    frame.pieces.clear();
    frame.keepalive.reset();
    // Keep the first abort per operation: it names the original cause.
    if (aborts_.size() < kMaxQueuedFrames) {
      aborts_.emplace(frame.meta.op_seq, std::move(frame));
    }
    return absl::OkStatus();
  }
  std::deque<InFrame>& q = queues_[from];
  absl::Status s =
      Budget(from, frame.landed ? 0 : frame.PayloadBytes(), q.size());
  if (!s.ok()) return s;
  uint64_t& delivered = delivered_seq_[from];
  delivered = std::max(delivered, frame.meta.op_seq);
  q.push_back(std::move(frame));
  return absl::OkStatus();
}

absl::Status Inbox::Budget(int from, uint64_t bytes, size_t queued) {
  if (queued >= kMaxQueuedFrames) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rank ", from, " has ", queued,
        " frames queued that no operation of this rank has taken: the limit"));
  }
  uint64_t& mine = queued_bytes_[from];
  if (budget_.per_peer != 0 && mine + bytes > budget_.per_peer) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rank ", from, " has ", mine, " bytes queued that no operation of "
        "this rank has taken, and a frame of ", bytes, " more would pass the "
        "limit of ", budget_.per_peer, " bytes per peer (--max_queued_bytes_per_peer)"));
  }
  if (budget_.total != 0 && total_queued_bytes_ + bytes > budget_.total) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a frame of ", bytes, " bytes from rank ", from, " would pass this "
        "worker's limit of ", budget_.total, " bytes queued from all peers "
        "(--max_queued_bytes; ", total_queued_bytes_, " queued, ", mine,
        " of them from rank ", from, ")"));
  }
  mine += bytes;
  total_queued_bytes_ += bytes;
  return absl::OkStatus();
}

void Inbox::Unbudget(int from, uint64_t bytes) {
  uint64_t& mine = queued_bytes_[from];
  mine -= std::min(mine, bytes);
  total_queued_bytes_ -= std::min(total_queued_bytes_, bytes);
}

InFrame Inbox::PopFront(int from, std::deque<InFrame>& q) {
  InFrame f = std::move(q.front());
  q.pop_front();
  Unbudget(from, f.landed ? 0 : f.PayloadBytes());
  return f;
}

Inbox::Event Inbox::NextPeer(int from, absl::Time deadline,
                              bool heed_interrupt, std::optional<int> tag) {
  LeaveTapsToReaders(/*polled_only=*/false);
  absl::MutexLock lock(&mu_);
  // The sender whose piece is next: `from`, or the earliest arrival.
  auto pick = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> int {
    int best = -1;
    uint64_t arrival = 0;
    for (const auto& [rank, q] : peer_queues_) {
      if (q.empty() || (from >= 0 && rank != from)) continue;
      const FrameMeta& head = q.front().second.meta;
      if (tag.has_value() && head.offset == 0 && head.step != *tag) continue;
      if (best < 0 || q.front().first < arrival) {
        best = rank;
        arrival = q.front().first;
      }
    }
    return best;
  };
  auto failed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return from >= 0 ? link_failures_.find(from)
                     : link_failures_.begin();
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (heed_interrupt && !interrupt_.ok()) || pick() >= 0 ||
           failed() != link_failures_.end();
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  Event ev;
  ev.type = Event::kTimeout;
  if (heed_interrupt && !interrupt_.ok()) {
    ev.type = Event::kInterrupted;
    ev.status = interrupt_;
  } else if (const int sender = pick(); sender >= 0) {
    auto& q = peer_queues_[sender];
    ev.type = Event::kFrame;
    ev.peer = sender;
    ev.frame = std::move(q.front().second);
    q.pop_front();
    Unbudget(sender, ev.frame.PayloadBytes());
  } else if (auto f = failed(); f != link_failures_.end()) {
    ev.type = Event::kLinkFailed;
    ev.peer = f->first;
    ev.status = f->second;
  }
  return ev;
}

absl::Status Inbox::LinkFailure(int peer) const {
  absl::MutexLock lock(&mu_);
  auto f = link_failures_.find(peer);
  return f == link_failures_.end() ? absl::OkStatus() : f->second;
}

void Inbox::SetByteBudget(ByteBudget budget) {
  absl::MutexLock lock(&mu_);
  budget_ = budget;
}

Inbox::ByteBudget Inbox::byte_budget() const {
  absl::MutexLock lock(&mu_);
  return budget_;
}

uint64_t Inbox::queued_bytes() const {
  absl::MutexLock lock(&mu_);
  return total_queued_bytes_;
}

absl::Status Inbox::ToGroup(const GroupRoute& route, int from,
                            InFrame frame) {
  auto r = route.group_rank.find(from);
  if (r == route.group_rank.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", from, " sent a frame of group ", frame.meta.group,
        ", which it is not a member of"));
  }
  const uint64_t id = frame.meta.group;
  frame.meta.sender_rank = r->second;
  frame.meta.group = 0;  // in the group's inbox, the group's own frames
  absl::Status s = route.inbox->Deliver(r->second, std::move(frame));
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("group ", id, " (job rank ", from,
                               " is its rank ", r->second, "): ", s.message()));
  }
  return s;
}

absl::Status Inbox::RouteGroup(int from, InFrame frame) {
  const uint64_t id = frame.meta.group;
  if (auto g = groups_.find(id); g != groups_.end()) {
    return ToGroup(g->second, from, std::move(frame));
  }
  const uint64_t bytes = frame.PayloadBytes();
  const uint64_t limit = budget_.per_peer != 0 ? budget_.per_peer
                                               : ByteBudget().per_peer;
  // Past the bounds, the groups held longest are let go of first (a group
  // no call here ever starts, a list one member got wrong, must not hold
  // its room for good); a group's own frames past them are refused.
  if (bytes > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rank ", from, " sent a frame of ", bytes, " bytes of group ", id,
        ", which no call of this rank has started: more than the ", limit,
        " bytes held for such groups in all"));
  }
  auto full = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (held_.count(id) == 0 && held_.size() >= kMaxHeldGroups) ||
           held_frames_ >= kMaxQueuedFrames || held_bytes_ + bytes > limit;
  };
  while (full() && !held_order_.empty() && held_order_.front() != id) {
    DropHeld(held_order_.front());
  }
  if (full()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rank ", from, " sent a frame of group ", id, ", which no call of "
        "this rank has started, past the limit of what is held for such "
        "groups (", held_frames_, " frames, ", held_bytes_,
        " bytes of at most ", limit, ")"));
  }
  // Held for a while: bytes of its own, not the link's (a same-host ring
  // frees its space only as its records are let go of).
  auto own = std::make_shared<std::vector<uint8_t>>();
  own->reserve(bytes);
  for (absl::Span<const uint8_t> p : frame.pieces) {
    own->insert(own->end(), p.begin(), p.end());
  }
  if (frame.intact && !frame.intact()) {
    return absl::DataLossError(absl::StrCat(
        "a frame of group ", id, " from rank ", from, " was overwritten in "
        "its shared memory before it was read"));
  }
  frame.pieces.clear();
  if (!own->empty()) frame.pieces.push_back(absl::MakeConstSpan(*own));
  frame.keepalive = std::move(own);
  frame.intact = nullptr;
  frame.landed = false;
  auto& held = held_[id];
  if (held.empty()) held_order_.push_back(id);
  held.emplace_back(from, std::move(frame));
  ++held_frames_;
  held_bytes_ += bytes;
  return absl::OkStatus();
}

absl::Status Inbox::AttachGroup(uint64_t id, std::vector<int> ranks,
                                std::shared_ptr<Inbox> inbox) {
  absl::MutexLock lock(&mu_);
  if (id == 0 || groups_.count(id) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", id, " cannot be attached (0, or attached)"));
  }
  GroupRoute route;
  route.inbox = std::move(inbox);
  route.inbox->job_inbox_.store(this);
  for (size_t i = 0; i < ranks.size(); ++i) {
    route.group_rank.emplace(ranks[i], static_cast<int>(i));
  }
  if (!interrupt_.ok()) route.inbox->Interrupt(interrupt_);
  for (const auto& [peer, status] : link_failures_) {
    if (auto r = route.group_rank.find(peer); r != route.group_rank.end()) {
      route.inbox->LinkFailed(r->second, status);
    }
  }
  // What came early goes first, in its order, under this lock: a frame
  // that arrives meanwhile waits for it.
  if (auto held = held_.find(id); held != held_.end()) {
    for (auto& [from, frame] : held->second) {
      --held_frames_;
      held_bytes_ -= std::min(held_bytes_, uint64_t{frame.PayloadBytes()});
      ToGroup(route, from, std::move(frame)).IgnoreError();  // as on arrival
    }
    held_.erase(held);
    held_order_.erase(
        std::find(held_order_.begin(), held_order_.end(), id));
  }
  groups_.emplace(id, std::move(route));
  return absl::OkStatus();
}

void Inbox::DropHeld(uint64_t id) {
  auto held = held_.find(id);
  if (held != held_.end()) {
    for (const auto& [from, frame] : held->second) {
      --held_frames_;
      held_bytes_ -= std::min(held_bytes_, uint64_t{frame.PayloadBytes()});
    }
    held_.erase(held);
  }
  auto at = std::find(held_order_.begin(), held_order_.end(), id);
  if (at != held_order_.end()) held_order_.erase(at);
}

void Inbox::DetachGroup(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(id);
  if (it == groups_.end()) return;
  it->second.inbox->job_inbox_.store(nullptr);
  groups_.erase(it);
}

void Inbox::LinkFailed(int peer, absl::Status status) {
  std::function<void(int, const absl::Status&)> hook;
  std::vector<std::pair<std::shared_ptr<Inbox>, int>> groups;
  {
    absl::MutexLock lock(&mu_);
    link_failures_.emplace(peer, status);
    hook = hook_;
    for (const auto& [id, route] : groups_) {
      if (auto r = route.group_rank.find(peer); r != route.group_rank.end()) {
        groups.emplace_back(route.inbox, r->second);
      }
    }
  }
  for (auto& [inbox, rank] : groups) inbox->LinkFailed(rank, status);
  Bump();
  if (hook) hook(peer, status);
}

void Inbox::TakeFromTaps() {
  for (const auto& t : Taps()) {
    bool took = false;
    t->Drain(&took);
  }
}

uint64_t Inbox::MaxOpSeqSeen() {
  TakeFromTaps();
  absl::MutexLock lock(&mu_);
  return max_seen_;
}

std::vector<int> Inbox::WithoutFrameOf(absl::Span<const int> ranks,
                                       uint64_t op_seq) {
  TakeFromTaps();
  absl::MutexLock lock(&mu_);
  std::vector<int> out;
  for (int r : ranks) {
    auto q = queues_.find(r);
    const bool has =
        q != queues_.end() &&
        std::any_of(q->second.begin(), q->second.end(),
                    [&](const InFrame& f) { return f.meta.op_seq == op_seq; });
    if (!has) out.push_back(r);
  }
  return out;
}

std::optional<absl::Status> Inbox::AbortSeen(uint64_t op_seq) const {
  absl::MutexLock lock(&mu_);
  auto it = aborts_.find(op_seq);
  if (it == aborts_.end()) return std::nullopt;
  return absl::Status(it->second.meta.abort_code, it->second.meta.message);
}

absl::StatusOr<uint64_t> Inbox::WaitFirstOpSeq(absl::Time deadline) {
  LeaveTapsToReaders(/*polled_only=*/false);
  absl::MutexLock lock(&mu_);
  // The newest operation any peer has sent frames for and nobody aborted:
  // older frames belong to operations the ring already finished or failed.
  auto running = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> uint64_t {
    uint64_t newest = 0;
    for (const auto& [rank, q] : queues_) {
      for (const InFrame& f : q) newest = std::max(newest, f.meta.op_seq);
    }
    if (newest == 0 || aborts_.lower_bound(newest) != aborts_.end()) return 0;
    return newest;
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !interrupt_.ok() || running() != 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (!interrupt_.ok()) return interrupt_;
  const uint64_t seq = running();
  if (seq == 0) {
    return absl::DeadlineExceededError(
        "no operation of the running ring reached this new member");
  }
  return seq;
}

void Inbox::Interrupt(absl::Status status, bool to_groups) {
  std::vector<std::shared_ptr<Inbox>> groups;
  {
    absl::MutexLock lock(&mu_);
    interrupt_ = status;
    if (to_groups) {
      for (const auto& [id, route] : groups_) groups.push_back(route.inbox);
    }
  }
  for (auto& g : groups) g->Interrupt(status);
  Bump();
}

void Inbox::ClearInterrupt() {
  std::vector<std::shared_ptr<Inbox>> groups;
  {
    absl::MutexLock lock(&mu_);
    interrupt_ = absl::OkStatus();
    for (const auto& [id, route] : groups_) groups.push_back(route.inbox);
  }
  for (auto& g : groups) g->ClearInterrupt();
}

void Inbox::ClearLinkFailures() {
  absl::MutexLock lock(&mu_);
  link_failures_.clear();
}

void Inbox::DropBefore(uint64_t op_seq) {
  absl::MutexLock lock(&mu_);
  floor_ = std::max(floor_, op_seq);
  for (auto& [rank, q] : queues_) {
    while (!q.empty() && q.front().meta.op_seq < op_seq) PopFront(rank, q);
  }
  aborts_.erase(aborts_.begin(), aborts_.lower_bound(op_seq));
}

const absl::Status* Inbox::WatchedFailure(int peer, int from,
                                          uint64_t op_seq) const {
  auto f = link_failures_.find(peer);
  if (f == link_failures_.end()) return nullptr;
  if (peer != from) {
    auto d = delivered_seq_.find(peer);
    if (d != delivered_seq_.end() && d->second >= op_seq) return nullptr;
  }
  return &f->second;
}

bool Inbox::Ready(int from, uint64_t op_seq,
                  absl::Span<const int> watch) const {
  if (!interrupt_.ok()) return true;
  if (aborts_.lower_bound(op_seq) != aborts_.end()) return true;
  for (int peer : watch) {
    if (WatchedFailure(peer, from, op_seq) != nullptr) return true;
  }
  auto qit = queues_.find(from);
  if (qit == queues_.end()) return false;
  for (const InFrame& f : qit->second) {
    if (f.meta.op_seq >= op_seq) return true;
  }
  return false;
}

Inbox::Event Inbox::Next(int from, uint64_t op_seq,
                         absl::Span<const int> watch, absl::Time deadline) {
  std::optional<Event> tapped = NextOnTaps(from, op_seq, watch, deadline);
  if (tapped.has_value()) return *std::move(tapped);
  LeaveTapsToReaders(/*polled_only=*/false);  // they deliver this wait's frames
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return Ready(from, op_seq, watch);
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  return EventLocked(from, op_seq, watch);
}

Inbox::Event Inbox::EventLocked(int from, uint64_t op_seq,
                                absl::Span<const int> watch) {
  Event ev;
  ev.type = Event::kTimeout;
  if (!interrupt_.ok()) {
    ev.type = Event::kInterrupted;
    ev.status = interrupt_;
    return ev;
  }
  // Data already queued for this op wins over a later failure report: the
  // frame is good, and the failure will be seen at the next wait. Except
  // when `from` itself aborted this op: what it sent before belongs to a
  // call it gave up on (perhaps long ago, with no peer there), and must
  // never be combined with this rank's call.
  auto& q = queues_[from];
  while (!q.empty() && q.front().meta.op_seq < op_seq) PopFront(from, q);
  auto own = aborts_.find(op_seq);
  const bool sender_aborted =
      own != aborts_.end() && own->second.meta.origin_rank == from;
  if (!sender_aborted && !q.empty() && q.front().meta.op_seq == op_seq) {
    ev.type = Event::kFrame;
    ev.frame = PopFront(from, q);
    return ev;
  }
  auto it = aborts_.lower_bound(op_seq);
  if (it != aborts_.end()) {
    ev.type = Event::kAbort;
    ev.frame = it->second;  // copy: several waits may report it
    return ev;
  }
  for (int peer : watch) {
    if (const absl::Status* failure = WatchedFailure(peer, from, op_seq)) {
      ev.type = Event::kLinkFailed;
      ev.peer = peer;
      ev.status = *failure;
      return ev;
    }
  }
  if (!q.empty()) {  // a frame of a later operation: the sender moved on
    ev.type = Event::kAbort;
    ev.frame.meta.kind = FrameKind::kAbort;
    ev.frame.meta.op_seq = q.front().meta.op_seq;
    ev.frame.meta.origin_rank = from;
    ev.frame.meta.sender_rank = from;
    ev.frame.meta.abort_code = absl::StatusCode::kAborted;
    ev.frame.meta.message =
        absl::StrCat("rank ", from, " already started operation #",
                     q.front().meta.op_seq, " while this rank waits in #",
                     op_seq);
    return ev;
  }
  return ev;  // timeout
}

}  // namespace halka
