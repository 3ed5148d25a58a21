#include "server/rendezvous_service.h"

#include "halka/v1/worker.grpc.pb.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "server/rendezvous_http.h"
#include "server/rendezvous_report.h"
#include "wire/membership_codec.h"

namespace halka {
namespace {

// A Join's log line names the members only up to this many (above it,
// counts: a line per Join that lists everyone grows the log as N^2).
constexpr size_t kJoinLogListed = 8;

RingClaim ClaimFrom(const v1::Membership& m) {
  RingClaim c;
  c.generation = m.generation();
  c.min_world_size = m.min_world_size();
  c.max_world_size = m.max_world_size();
  for (const v1::Member& x : m.members()) {
    MemberView v;
    v.rank = x.rank();
    v.worker_id = x.worker_id();
    v.address = x.address();
    v.device = x.device();
    v.since_generation = x.since_generation();
    c.members.push_back(std::move(v));
  }
  return c;
}

bool ParseMessage(const grpc::ByteBuffer& bytes,
                  google::protobuf::MessageLite* message) {
  std::vector<grpc::Slice> slices;
  if (!bytes.Dump(&slices).ok()) return false;
  std::string flat;
  for (const grpc::Slice& s : slices) {
    flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return message->ParseFromString(flat);
}

// Erases the entries of a map by job whose job fails `keep`.
template <typename Map, typename Keep>
void EraseUnless(Map& map, const Keep& keep) {
  for (auto it = map.begin(); it != map.end();) {
    it = keep(it->first) ? std::next(it) : map.erase(it);
  }
}

// Appends the key and length of a length-delimited field (its bytes follow,
// e.g. in another slice of the same message).
void AppendTag(int field, size_t length, std::string* out) {
  auto varint = [out](uint64_t v) {
    while (v >= 0x80) {
      out->push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out->push_back(static_cast<char>(v));
  };
  varint(static_cast<uint64_t>(field) << 3 | 2);  // wire type 2
  varint(length);
}

// Asks a suspect worker for its info with a short deadline: true when it
// answers (any answer but UNAVAILABLE / DEADLINE_EXCEEDED means alive).
bool Answers(const std::string& address, absl::Duration timeout,
             std::string* verdict) {
  auto stub = v1::Worker::NewStub(MakeChannel(address));
  grpc::ClientContext ctx;
  SetTimeout(ctx, timeout);
  v1::InfoReply reply;
  grpc::Status s = stub->GetInfo(&ctx, v1::InfoRequest(), &reply);
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    *verdict = absl::StrCat("probe of ", address, " failed: ",
                            s.error_code() == grpc::StatusCode::UNAVAILABLE
                                ? "unreachable"
                                : absl::StrCat("no answer within ",
                                               absl::FormatDuration(timeout)),
                            " (", s.error_message(), ")");
    return false;
  }
  *verdict = absl::StrCat("probe of ", address, " answered");
  return true;
}

}  // namespace

// A Join waiting for its ring. No thread waits: the service answers it
// when a generation gives it a rank, its wait runs out, it is cancelled, or
// the service stops; whoever removes it from joins_ answers it.
class RendezvousService::JoinCall final : public grpc::ServerUnaryReactor {
 public:
  JoinCall(RendezvousService* service, grpc::ByteBuffer* reply)
      : service_(service), reply_(reply) {}
  JoinArgs args;
  absl::Time deadline;
  bool compact = false;  // the reply's ring deflated (compact_membership)

  // The reply is the generation's JoinReply followed by this member's
  // rank: serialised protobuf messages concatenate as a merge, so the
  // shared bytes are never copied or re-encoded per member.
  void Answer(const grpc::Slice& shared, int rank) {
    v1::JoinReply own;
    own.set_rank(rank);
    const grpc::Slice parts[2] = {shared, grpc::Slice(own.SerializeAsString())};
    *reply_ = grpc::ByteBuffer(parts, 2);
    answered_ = true;
    Finish(grpc::Status::OK);
  }
  void OnCancel() override { service_->CancelJoin(this); }
  void OnDone() override {
    // The reply was sent: the member's heartbeat clock starts now.
    if (answered_) service_->JoinReturned(args);
    delete this;
  }

 private:
  RendezvousService* const service_;
  grpc::ByteBuffer* const reply_;
  bool answered_ = false;
};

// One Watch stream: the newest membership not yet written waits in next_
// (a watcher that falls behind skips generations, it never queues them).
// A watcher that takes deltas gets each update against the generation of
// the message written before it (the one it will hold), when the service
// has that delta; else the whole membership.
class RendezvousService::WatchCall final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `known`: the generation the watcher holds (0: none).
  WatchCall(RendezvousService* service, std::string job_id,
            std::string worker_id, std::string peer, bool deltas,
            uint64_t known)
      : service_(service), job_id(std::move(job_id)),
        worker_id(std::move(worker_id)), peer(std::move(peer)),
        deltas(deltas), written_(known) {}
  const std::string job_id;
  const std::string worker_id;
  const std::string peer;
  const bool deltas;
  bool counted = false;  // holds a place in service_->watches_

  // The generation the watcher will hold before the next update (0: none):
  // what a delta for this stream is against.
  uint64_t Base() {
    absl::MutexLock lock(&mu_);
    return written_;
  }
  // `delta` (may be empty) is against generation `base`.
  void Offer(uint64_t generation, const grpc::Slice& whole, uint64_t base,
             const grpc::Slice& delta) {
    {
      absl::MutexLock lock(&mu_);
      if (ended_ || generation == offered_) return;
      offered_ = generation;
      const bool use_delta =
          deltas && delta.size() > 0 && base != 0 && base == written_;
      const grpc::Slice& bytes = use_delta ? delta : whole;
      if (writing_) {
        next_ = grpc::ByteBuffer(&bytes, 1);
        next_generation_ = generation;
        return;
      }
      writing_ = true;
      current_ = grpc::ByteBuffer(&bytes, 1);
      written_ = generation;
    }
    StartWrite(&current_);
  }
  void End(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return;
      ended_ = true;
      if (writing_) {
        end_ = status;  // OnWriteDone finishes
        return;
      }
    }
    Finish(status);
  }
  void OnWriteDone(bool ok) override {
    enum { kIdle, kWrite, kFinish } then = kIdle;
    grpc::Status finish;
    {
      absl::MutexLock lock(&mu_);
      if (!ok && !ended_) {
        ended_ = true;
        end_ = grpc::Status::CANCELLED;
      }
      if (end_.has_value()) {
        finish = *end_;
        end_.reset();
        writing_ = false;
        then = kFinish;
      } else if (next_.has_value()) {
        current_ = std::move(*next_);
        next_.reset();
        written_ = next_generation_;
        then = kWrite;
      } else {
        writing_ = false;
      }
    }
    if (then == kWrite) StartWrite(&current_);
    if (then == kFinish) Finish(finish);
  }
  void OnCancel() override { End(grpc::Status::CANCELLED); }
  // The call keeps itself until OnDone (the service's list may let go of
  // it earlier, and a refused call is on no list).
  void Hold(std::shared_ptr<WatchCall> self) { self_ = std::move(self); }
  void OnDone() override {
    service_->DropWatch(this);
    std::shared_ptr<WatchCall> last = std::move(self_);
  }

 private:
  RendezvousService* const service_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t offered_ ABSL_GUARDED_BY(mu_) = 0;
  // The generation of the write in flight (or the last one; at first the
  // one the watcher knows), and of next_.
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ByteBuffer current_;  // the write in flight
  std::shared_ptr<WatchCall> self_;
  std::optional<grpc::ByteBuffer> next_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
};

RendezvousService::RendezvousService(RendezvousOptions options)
    : state_(options), sweeper_([this] { SweepLoop(); }) {}

RendezvousService::~RendezvousService() {
  Stop();
  if (sweeper_.joinable()) sweeper_.join();
}

void RendezvousService::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    Publish();
  }
  Deliver();
  if (!stop_.HasBeenNotified()) stop_.Notify();
}

void RendezvousService::SweepLoop() {
  absl::Duration period;
  {
    absl::MutexLock lock(&mu_);
    period = state_.options().heartbeat_interval / 2;
  }
  // Wakes every 100 ms for the joins whose wait ran out; sweeps every half
  // heartbeat interval.
  const absl::Duration tick = std::min(period, absl::Milliseconds(100));
  absl::Time next_sweep = absl::Now() + period;
  while (!stop_.WaitForNotificationWithTimeout(tick)) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      ExpireJoins(now);
      if (now >= next_sweep) {
        next_sweep = now + period;
        for (const std::string& l : state_.Sweep(now)) {
          LogWarning(l);
          ++version_;
        }
      }
      Publish();
    }
    Deliver();
  }
}

void RendezvousService::ExpireJoins(absl::Time now) {
  for (auto& [job_id, calls] : joins_) {
    auto expired = std::stable_partition(
        calls.begin(), calls.end(),
        [&](JoinCall* c) { return c->deadline > now; });
    for (auto it = expired; it != calls.end(); ++it) {
      JoinCall* c = *it;
      // Names up to 64 members: every blocked Join of a large job may time
      // out at once.
      const std::string what = state_.DescribeForming(job_id, 64);
      state_.WithdrawPending(job_id, c->args.worker_id);
      outbox_.answers.push_back(
          {c, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                           absl::StrCat("join timed out: ", what)),
           grpc::Slice(), -1});
    }
    calls.erase(expired, calls.end());
  }
}

void RendezvousService::CancelJoin(JoinCall* call) {
  {
    absl::MutexLock lock(&mu_);
    auto it = joins_.find(call->args.job_id);
    if (it == joins_.end()) return;
    auto& calls = it->second;
    auto at = std::find(calls.begin(), calls.end(), call);
    if (at == calls.end()) return;  // already answered
    calls.erase(at);
    state_.WithdrawPending(call->args.job_id, call->args.worker_id);
    outbox_.answers.push_back(
        {call, grpc::Status::CANCELLED, grpc::Slice(), -1});
    Publish();
  }
  Deliver();
}

void RendezvousService::JoinReturned(const JoinArgs& args) {
  absl::MutexLock lock(&mu_);
  state_.JoinReturned(args.job_id, args.worker_id, absl::Now());
}

void RendezvousService::DropWatch(WatchCall* call) {
  std::shared_ptr<WatchCall> last;  // dies after the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = watchers_.find(call->job_id);
    if (it != watchers_.end()) {
      auto& calls = it->second;
      auto at = std::find_if(calls.begin(), calls.end(),
                             [&](const auto& c) { return c.get() == call; });
      if (at != calls.end()) {
        last = std::move(*at);
        calls.erase(at);
        auto w = watching_.find({call->job_id, call->worker_id});
        if (w != watching_.end() && --w->second == 0) watching_.erase(w);
      }
      if (calls.empty()) watchers_.erase(it);
    }
  }
  if (call->counted) watches_.Release(call->peer);
}

void RendezvousService::Publish() {
  for (const std::string& l : state_.TakeEvents()) LogInfo(l);
  ++version_;
  std::vector<std::string> jobs;
  for (const auto& [id, calls] : joins_) jobs.push_back(id);
  for (const auto& [id, calls] : watchers_) jobs.push_back(id);
  std::sort(jobs.begin(), jobs.end());
  jobs.erase(std::unique(jobs.begin(), jobs.end()), jobs.end());
  for (const std::string& id : jobs) PublishJob(id);
  auto listened = [this](const std::string& id)
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return joins_.count(id) != 0 || watchers_.count(id) != 0;
  };
  EraseUnless(published_, listened);
  EraseUnless(join_replies_, listened);
  EraseUnless(compact_join_replies_, listened);
  EraseUnless(memberships_, listened);
  // Kept while the job lives: its members' Watches open after their Joins
  // return, and their first delta is against the Join's generation.
  EraseUnless(history_, [this](const std::string& id)
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                              return state_.HasJob(id);
                            });
}

void RendezvousService::PublishJob(const std::string& job_id) {
  const bool exists = state_.HasJob(job_id);
  const uint64_t generation = state_.Generation(job_id);
  auto [last, fresh] = published_.emplace(job_id, 0);
  if (!stopping_ && exists && !fresh && last->second == generation) return;
  last->second = generation;
  const grpc::Status down(grpc::StatusCode::UNAVAILABLE,
                          "rendezvous is shutting down");
  if (auto it = joins_.find(job_id); it != joins_.end()) {
    auto& calls = it->second;
    std::optional<MembershipView> view;
    if (!stopping_) view = state_.AssignmentView(job_id);
    grpc::Slice replies[2];  // plain, compact: made on first use
    auto reply = [&](bool compact) {
      grpc::Slice& r = replies[compact ? 1 : 0];
      if (r.size() == 0) r = JoinReplyOf(job_id, *view, compact);
      return r;
    };
    auto waiting = std::stable_partition(
        calls.begin(), calls.end(), [&](JoinCall* c) {
          if (stopping_ || !view.has_value()) return !stopping_;
          const int rank = state_.AssignedRank(job_id, c->args.worker_id);
          if (rank < 0) return true;
          outbox_.answers.push_back(
              {c, grpc::Status::OK, reply(c->compact), rank});
          return false;
        });
    if (stopping_) {
      for (JoinCall* c : calls) {
        outbox_.answers.push_back({c, down, grpc::Slice(), -1});
      }
    }
    calls.erase(waiting, calls.end());
    if (calls.empty()) joins_.erase(it);
  }
  auto it = watchers_.find(job_id);
  if (it == watchers_.end()) return;
  if (stopping_ || !exists) {
    const grpc::Status gone(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("watch: job ", job_id, " is gone"));
    for (auto& c : it->second) outbox_.ends.push_back({c, stopping_ ? down : gone});
    return;
  }
  for (auto& c : it->second) outbox_.updates.push_back(UpdateFor(job_id, c));
}

RendezvousService::Outbox::Update RendezvousService::UpdateFor(
    const std::string& job_id, const std::shared_ptr<WatchCall>& call) {
  Outbox::Update u{call, state_.Generation(job_id), MembershipOf(job_id)};
  if (call->deltas) {
    u.base = call->Base();
    if (u.base != 0 && u.base != u.generation) u.delta = DeltaOf(job_id, u.base);
  }
  return u;
}

void RendezvousService::Remember(const std::string& job_id,
                                 const v1::Membership& m) {
  // Three generations back covers a watcher whose write was in flight
  // through two quick changes; one further behind gets a whole one.
  constexpr size_t kKept = 4;
  if (m.generation() == 0) return;  // forming: no member holds it
  History& h = history_[job_id];
  const uint64_t epoch = state_.JobEpoch(job_id);
  if (h.epoch != epoch) h = History{epoch};
  for (const v1::Membership& k : h.kept) {
    if (k.generation() == m.generation()) return;
  }
  h.kept.push_back(m);
  if (h.kept.size() > kKept) h.kept.erase(h.kept.begin());
}

grpc::Slice RendezvousService::DeltaOf(const std::string& job_id,
                                       uint64_t base) {
  const uint64_t generation = state_.Generation(job_id);
  MembershipOf(job_id);  // keeps the current generation
  auto it = history_.find(job_id);
  if (it == history_.end()) return grpc::Slice();
  History& h = it->second;
  if (h.deltas_of != generation) {
    h.deltas.clear();
    h.deltas_of = generation;
  }
  if (auto d = h.deltas.find(base); d != h.deltas.end()) return d->second;
  const v1::Membership* from = nullptr;
  const v1::Membership* to = nullptr;
  for (const v1::Membership& k : h.kept) {
    if (k.generation() == base) from = &k;
    if (k.generation() == generation) to = &k;
  }
  if (from == nullptr || to == nullptr) return grpc::Slice();
  grpc::Slice bytes(MakeMembershipDelta(*from, *to).SerializeAsString());
  h.deltas[base] = bytes;
  return bytes;
}

bool RendezvousService::WatchHas(const std::string& job_id,
                                 const std::string& worker_id,
                                 uint64_t generation) {
  if (worker_id.empty() || watching_.count({job_id, worker_id}) == 0) {
    return false;
  }
  auto p = published_.find(job_id);
  return p != published_.end() && p->second == generation;
}

grpc::Slice RendezvousService::MembershipOf(const std::string& job_id) {
  const uint64_t generation = state_.Generation(job_id);
  const uint64_t epoch = state_.JobEpoch(job_id);
  Cached& cached = memberships_[job_id];
  // Not cached while forming: joins change the view, not the generation.
  if (generation != 0 && cached.epoch == epoch &&
      cached.generation == generation && cached.bytes.size() > 0) {
    return cached.bytes;
  }
  auto view = state_.Health(job_id, absl::Now());
  v1::Membership m;
  if (view.ok()) FillMembership(job_id, *view, &m);
  cached = {epoch, generation, grpc::Slice(m.SerializeAsString())};
  if (view.ok()) Remember(job_id, m);
  return cached.bytes;
}

grpc::Slice RendezvousService::JoinReplyOf(const std::string& job_id,
                                           const MembershipView& v,
                                           bool compact) {
  const uint64_t epoch = state_.JobEpoch(job_id);
  Cached& cached = (compact ? compact_join_replies_ : join_replies_)[job_id];
  if (cached.epoch == epoch && cached.generation == v.generation &&
      cached.bytes.size() > 0) {
    return cached.bytes;
  }
  v1::JoinReply r;
  r.set_world_size(v.world_size);
  r.set_generation(v.generation);
  // The ring goes once, in membership (JoinReply.members stays empty): at
  // N = 2,048 a formation otherwise sends the ring 2N times.
  FillMembership(job_id, v, r.mutable_membership());
  // The members' first Watch updates are deltas against this ring.
  Remember(job_id, r.membership());
  if (compact) {
    // Deflated once per generation and shared by every reply: the ring is
    // N^2 bytes over a formation (~41 KB a reply at 1,024 members, ~7 KB
    // deflated).
    r.set_membership_deflate(DeflateMembership(r.membership()));
    r.clear_membership();
  }
  r.set_heartbeat_interval_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(state_.options().heartbeat_interval)));
  r.set_heartbeat_timeout_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(state_.options().heartbeat_timeout)));
  cached = {epoch, v.generation, grpc::Slice(r.SerializeAsString())};
  return cached.bytes;
}

void RendezvousService::Deliver() {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    std::swap(out, outbox_);
  }
  for (Outbox::Answer& a : out.answers) {
    if (a.status.ok()) {
      a.call->Answer(a.reply, a.rank);
    } else {
      a.call->Finish(a.status);
    }
  }
  for (Outbox::Update& u : out.updates) {
    u.call->Offer(u.generation, u.membership, u.base, u.delta);
  }
  for (Outbox::End& e : out.ends) e.call->End(e.status);
}

grpc::ServerUnaryReactor* RendezvousService::Join(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* reply) {
  auto* call = new JoinCall(this, reply);
  v1::JoinRequest req;
  if (!ParseMessage(*request, &req)) {
    call->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "join: the request is not a JoinRequest"));
    return call;
  }
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req.job_id()); !s.ok()) {
    call->Finish(s);
    return call;
  }
  JoinArgs& args = call->args;
  args.job_id = req.job_id();
  args.worker_id = req.worker_id();
  args.address = req.address();
  args.device = req.device();
  args.world_size = req.world_size();
  args.min_world_size = req.min_world_size();
  args.max_world_size = req.max_world_size();
  args.requested_rank = req.has_requested_rank() ? req.requested_rank() : -1;
  args.incarnation = req.incarnation();
  call->compact = req.compact_membership();
  const absl::Time now = absl::Now();
  call->deadline = absl::FromChrono(ctx->deadline());
  if (req.wait_timeout_ms() > 0) {
    call->deadline = std::min(call->deadline,
                              now + absl::Milliseconds(req.wait_timeout_ms()));
  }
  grpc::Status refused;
  grpc::Slice answer;
  int rank = -1;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = stopping_ ? absl::UnavailableError(
                                     "rendezvous is shutting down")
                               : state_.Join(args, now);
    if (!s.ok()) {
      refused = ToGrpcStatus(s);
    } else {
      LogInfo(absl::StrCat("join of ", args.worker_id, ": ",
                           state_.DescribeForming(args.job_id, kJoinLogListed)));
      Publish();  // answers the others when this Join formed the ring
      rank = state_.AssignedRank(args.job_id, args.worker_id);
      if (rank >= 0) {
        answer = JoinReplyOf(args.job_id, *state_.AssignmentView(args.job_id),
                             call->compact);
      } else {
        joins_[args.job_id].push_back(call);
      }
    }
  }
  Deliver();
  if (!refused.ok()) {
    call->Finish(refused);
  } else if (rank >= 0) {
    call->Answer(answer, rank);
  }
  return call;
}

grpc::ServerUnaryReactor* RendezvousService::Heartbeat(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* reply) {
  grpc::ServerUnaryReactor* call = ctx->DefaultReactor();
  v1::HeartbeatRequest req;
  grpc::Status s;
  if (!ParseMessage(*request, &req)) {
    s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "heartbeat: the request is not a HeartbeatRequest");
  } else {
    s = CheckCallJobGrpc(*ctx, req.job_id());
  }
  if (s.ok() && (req.job_id().empty() || req.worker_id().empty())) {
    s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "heartbeat: job_id and worker_id are required");
  }
  if (s.ok()) {
    const std::string telemetry = req.telemetry().SerializeAsString();
    v1::HeartbeatReply own;
    grpc::Slice membership;
    {
      absl::MutexLock lock(&mu_);
      s = HeartbeatLocked(req, telemetry, &own);
      // A member behind the current generation gets the membership: the
      // generation's shared bytes as field 3, not a copy per member. Not
      // when its Watch stream was handed this generation already (half the
      // bytes of a change at N members).
      if (s.ok() && own.generation() != req.generation() &&
          !WatchHas(req.job_id(), req.worker_id(), own.generation())) {
        membership = MembershipOf(req.job_id());
      }
    }
    Deliver();
    if (s.ok()) {
      std::string head = own.SerializeAsString();
      if (membership.size() > 0) {
        AppendTag(v1::HeartbeatReply::kMembershipFieldNumber,
                  membership.size(), &head);
      }
      const grpc::Slice parts[2] = {grpc::Slice(head), membership};
      *reply = grpc::ByteBuffer(parts, membership.size() > 0 ? 2 : 1);
    }
  }
  call->Finish(s);
  return call;
}

grpc::Status RendezvousService::HeartbeatLocked(
    const v1::HeartbeatRequest& req, const std::string& telemetry,
    v1::HeartbeatReply* reply) {
  const absl::Time now = absl::Now();
  auto r = state_.Heartbeat(req.job_id(), req.worker_id(), telemetry, now);
  if (r.status().code() == absl::StatusCode::kNotFound && req.has_claim()) {
    // This rendezvous restarted (or forgot the job): rebuild it from the
    // worker's view, at the worker's generation.
    absl::Status restored =
        state_.Restore(req.job_id(), ClaimFrom(req.claim()), now);
    if (!restored.ok()) return ToGrpcStatus(restored);
    Publish();
    r = state_.Heartbeat(req.job_id(), req.worker_id(), telemetry, now);
  }
  if (!r.ok()) return ToGrpcStatus(r.status());
  reply->set_generation(r->generation);
  for (int d : r->dead_ranks) reply->add_dead_ranks(d);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Leave(grpc::ServerContext* ctx,
                                      const v1::LeaveRequest* req,
                                      v1::LeaveReply*) {
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  if (req->job_id().empty() || req->worker_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "leave: job_id and worker_id are required");
  }
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    s = state_.Leave(req->job_id(), req->worker_id(), absl::Now());
    if (s.ok()) Publish();
  }
  Deliver();
  return ToGrpcStatus(s);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RendezvousService::Watch(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  v1::WatchRequest req;
  const bool parsed = ParseMessage(*request, &req);
  auto call = std::make_shared<WatchCall>(this, req.job_id(), req.worker_id(),
                                         ctx->peer(), req.deltas(),
                                         req.known_generation());
  grpc::Status refused;
  if (!parsed) {
    refused = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           "watch: the request is not a WatchRequest");
  } else if (req.job_id().empty()) {
    refused = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           "watch: job_id is required");
  } else {
    refused = CheckCallJobGrpc(*ctx, req.job_id());
  }
  if (refused.ok()) {
    refused = ToGrpcStatus(watches_.Acquire(call->peer));
    call->counted = refused.ok();
  }
  if (refused.ok()) {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      refused = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             "rendezvous is shutting down");
    } else if (!state_.HasJob(req.job_id())) {
      refused = ToGrpcStatus(state_.Health(req.job_id(), absl::Now()).status());
      if (req.known_generation() != 0) {
        refused = grpc::Status(grpc::StatusCode::NOT_FOUND,
                               absl::StrCat("watch: job ", req.job_id(),
                                            " is gone"));
      }
    } else {
      watchers_[req.job_id()].push_back(call);
      ++watching_[{req.job_id(), req.worker_id()}];
      // The first message: the current membership, unless the watcher
      // knows it already.
      const uint64_t g = state_.Generation(req.job_id());
      published_.emplace(req.job_id(), g);
      if (g != req.known_generation()) {
        outbox_.updates.push_back(UpdateFor(req.job_id(), call));
      }
    }
  }
  WatchCall* raw = call.get();
  raw->Hold(std::move(call));
  if (!refused.ok()) raw->End(refused);  // OnDone releases the place
  Deliver();
  return raw;
}

grpc::Status RendezvousService::ReportFailure(
    grpc::ServerContext* ctx, const v1::ReportFailureRequest* req,
    v1::ReportFailureReply* reply) {
  if (req->job_id().empty() || req->worker_id().empty() ||
      req->suspect_worker_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "report: job_id, worker_id and suspect are required");
  }
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  std::string address;
  {
    absl::MutexLock lock(&mu_);
    if (state_.Generation(req->job_id()) != req->generation()) {
      reply->set_verdict("stale report: the generation already changed");
      return grpc::Status::OK;
    }
    address = state_.AddressOf(req->job_id(), req->suspect_worker_id());
  }
  if (address.empty()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("report: ", req->suspect_worker_id(),
                                     " is not a live member of job ",
                                     req->job_id()));
  }
  // The reporter's word alone is not enough (a partition between two
  // healthy workers must not evict one): probe the suspect, outside the
  // lock.
  std::string verdict;
  const bool alive = Answers(address, absl::Seconds(1), &verdict);
  reply->set_verdict(verdict);
  if (alive) return grpc::Status::OK;
  absl::ReleasableMutexLock lock(&mu_);
  absl::Status s = state_.DeclareLost(
      req->job_id(), req->suspect_worker_id(), req->generation(),
      absl::StrCat("lost: ", req->worker_id(), " reported its link broken (",
                   req->reason().substr(0, 200), "); ", verdict),
      absl::Now());
  if (s.ok()) {
    reply->set_declared_lost(true);
    Publish();
  }
  lock.Release();
  Deliver();
  return grpc::Status::OK;
}

grpc::Status RendezvousService::GetRingHealth(grpc::ServerContext* ctx,
                                              const v1::RingHealthRequest* req,
                                              v1::RingHealth* reply) {
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  return BuildHealth(req, reply);
}

std::vector<std::string> RendezvousService::JobIds() {
  absl::MutexLock lock(&mu_);
  return state_.JobIds();
}

grpc::Status RendezvousService::BuildHealth(const v1::RingHealthRequest* req,
                                            v1::RingHealth* reply) {
  if (req->job_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "health: job_id is required");
  }
  absl::StatusOr<MembershipView> h;
  {
    absl::MutexLock lock(&mu_);
    h = state_.Health(req->job_id(), absl::Now());
  }
  if (!h.ok()) return ToGrpcStatus(h.status());
  // The view is a copy: the telemetry parsing and the diagnosis run
  // without the lock, so a health poll does not hold up heartbeats.
  FillRingHealth(req->job_id(), *h, absl::Now(), reply);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::RegisterServer(
    grpc::ServerContext* ctx, const v1::RegisterServerRequest* req,
    v1::RegisterServerReply*) {
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return ToGrpcStatus(state_.RegisterServer(req->job_id(), req->server_id(),
                                            req->address(), req->shard(),
                                            req->shards(), absl::Now()));
}

grpc::Status RendezvousService::LookupServers(
    grpc::ServerContext* ctx, const v1::LookupServersRequest* req,
    v1::LookupServersReply* reply) {
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto servers = state_.LookupServers(req->job_id(), absl::Now());
  if (!servers.ok()) return ToGrpcStatus(servers.status());
  for (const MemberView& m : *servers) FillMember(m, reply->add_servers());
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    const std::string& listen, RendezvousOptions options, int metrics_port) {
  auto creds = ServerCredentialsFor(listen, ServerRole::kMultiJob);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<RendezvousServer> s(new RendezvousServer());
  s->service_ = std::make_unique<RendezvousService>(options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(builder);
  int port = 0;
  builder.AddListeningPort(listen, *creds, &port);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous: cannot listen on ", listen));
  }
  s->address_ = DialableAddress(listen, port, "");
  if (metrics_port != 0) {
    const std::string host = listen.substr(0, listen.rfind(':'));
    auto handlers = RendezvousHttpHandlers(s->service_.get());
    auto http = StartDaemonHttp("rendezvous", host.empty() ? "0.0.0.0" : host,
                                metrics_port, std::move(handlers));
    if (!http.ok()) return http.status();
    s->http_ = std::move(*http);
  }
  return s;
}

std::string RendezvousServer::metrics_address() const {
  return http_ ? http_->address() : "";
}

RendezvousServer::~RendezvousServer() { Shutdown(); }

void RendezvousServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  service_->Stop();
  if (http_) http_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(200));
}

}  // namespace halka
