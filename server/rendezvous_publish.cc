// The rendezvous's publication: after every change of state, what each
// waiting Join and open Watch gets (a generation's Join reply and
// membership serialised once and shared; Watch deltas against the
// generation a watcher holds, kept for a job's last generations), queued
// under the service's lock and delivered outside it.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/rendezvous_calls.h"
#include "server/rendezvous_report.h"
#include "server/rendezvous_service.h"
#include "codec/membership_codec.h"

namespace halka {
namespace {

// Erases the entries of a map by job whose job fails `keep`.
template <typename Map, typename Keep>
void EraseUnless(Map& map, const Keep& keep) {
  for (auto it = map.begin(); it != map.end();) {
    it = keep(it->first) ? std::next(it) : map.erase(it);
  }
}

}  // namespace

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

void RendezvousService::ReleasePacedLocked(
    absl::Time now, std::vector<Outbox::Answer>* answers) {
  const RendezvousOptions& o = state_.options();
  for (auto it = unacked_.begin(); it != unacked_.end();) {
    it = now - it->second >= o.join_answer_ack_wait ? unacked_.erase(it)
                                                     : std::next(it);
  }
  while (!paced_.empty() &&
         (stopping_ || o.join_answer_window <= 0 ||
          unacked_.size() < static_cast<size_t>(o.join_answer_window))) {
    Outbox::Answer& a = paced_.front();
    if (o.join_answer_window > 0) {
      unacked_[{a.call->args.job_id, a.call->args.worker_id}] = now;
    }
    answers->push_back(std::move(a));
    paced_.pop_front();
  }
}

void RendezvousService::Deliver() {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    std::swap(out, outbox_);
    // Refusals go at once; rings are handed out in waves.
    auto rings = std::stable_partition(
        out.answers.begin(), out.answers.end(),
        [](const Outbox::Answer& a) { return !a.status.ok(); });
    for (auto it = rings; it != out.answers.end(); ++it) {
      paced_.push_back(std::move(*it));
    }
    out.answers.erase(rings, out.answers.end());
    if (!paced_.empty()) ReleasePacedLocked(absl::Now(), &out.answers);
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

}  // namespace halka
