// RendezvousState, part two: liveness. Heartbeats (and the restore of a
// member the rendezvous forgot), leaves, members declared lost, and the
// sweep that loses the silent ones. The membership itself is
// rendezvous_state.cc; the views are rendezvous_views.cc.
#include "server/rendezvous_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace halka {

absl::StatusOr<HeartbeatResult> RendezvousState::Heartbeat(
    const std::string& job_id, const std::string& worker_id,
    const std::string& telemetry, absl::Time now) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("heartbeat: no job ", job_id));
  }
  Job& job = it->second;
  HeartbeatResult out;
  out.generation = job.generation;
  Member* self = Find(job, worker_id);
  if (job.live < static_cast<int>(job.members.size())) {
    for (const Member& m : job.members) {
      if (!m.alive) out.dead_ranks.push_back(m.rank);
    }
  }
  if (self == nullptr && job.pending_ids.count(worker_id) != 0) {
    for (Member& m : job.pending) {
      if (m.worker_id != worker_id) continue;
      m.last_heartbeat = now;
      return out;
    }
  }
  bool was_lost = false;
  for (const Member& m : job.lost) was_lost |= m.worker_id == worker_id;
  if ((self != nullptr && !self->alive) || (self == nullptr && was_lost)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "heartbeat: worker ", worker_id, " was lost from job ", job_id,
        " (generation ", job.generation, "): it must join again"));
  }
  if (self == nullptr) {
    return absl::NotFoundError(absl::StrCat("heartbeat: worker ", worker_id,
                                            " is not a member of job ", job_id));
  }
  if (job.last_heard != absl::InfinitePast() &&
      now - job.last_heard > options_.heartbeat_timeout / 2) {
    // The whole job was silent: this rendezvous was cut off, and the
    // members' heartbeats resume one by one. Count each one's timeout
    // from the end of the blackout, not from its last heartbeat.
    for (Member& m : job.members) m.grace_from = std::max(m.grace_from, now);
  }
  job.last_heard = now;
  self->last_heartbeat = now;
  self->telemetry = telemetry;
  return out;
}

bool RendezvousState::CatchUp(const std::string& job_id,
                              const std::string& worker_id, uint64_t held) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || held <= it->second.generation) return false;
  Job& job = it->second;
  const uint64_t was = job.generation;
  job.generation = held + 1;
  job.change = absl::StrCat(
      "generation ", was, "->", job.generation, ": worker ", worker_id,
      " holds generation ", held, ", newer than the one restored from the "
      "first claim after the rendezvous restarted; every member takes the "
      "next");
  events_.push_back(absl::StrCat("job ", job_id, ": ", job.change));
  return true;
}

absl::Status RendezvousState::Restore(const std::string& job_id,
                                      const RingClaim& claim, absl::Time now) {
  if (jobs_.count(job_id)) return absl::OkStatus();
  const int g = static_cast<int>(claim.members.size());
  if (job_id.empty() || claim.generation == 0 || g < 1 ||
      claim.min_world_size < 1 || claim.min_world_size > claim.max_world_size ||
      claim.max_world_size > options_.max_world_size ||
      g > claim.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "restore: the claim for job ", job_id, " is not a valid ring"));
  }
  for (int i = 0; i < g; ++i) {
    const MemberView& v = claim.members[static_cast<size_t>(i)];
    if (v.rank != i || v.worker_id.empty() || v.address.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "restore: the claim for job ", job_id, " is not in ring order"));
    }
  }
  if (static_cast<int>(jobs_.size()) >= options_.max_jobs) {
    return absl::ResourceExhaustedError("restore: too many jobs");
  }
  Job job;
  job.epoch = ++epochs_;
  job.min = claim.min_world_size;
  job.max = claim.max_world_size;
  job.generation = claim.generation;
  job.active = true;
  job.last_heard = now;
  for (const MemberView& v : claim.members) {
    Member m;
    m.worker_id = v.worker_id;
    m.address = v.address;
    m.device = v.device.empty() ? "cpu" : v.device;
    m.rank = v.rank;
    m.alive = true;
    m.last_heartbeat = now;
    m.since_generation = v.since_generation;
    m.host = v.host;
    job.members.push_back(std::move(m));
  }
  Index(job);
  job.change = absl::StrCat("generation ", job.generation,
                            ": restored from the members' claims after the "
                            "rendezvous restarted");
  if (options_.probe_links && !options_.link_model.has_value() &&
      claim.link_model.has_value() &&
      claim.link_model->measured_generation != 0) {
    // The ring ran with a model its members measured: it holds for them,
    // unless their generation was still measuring them (the model is then
    // the one of the members before: their reports, of this generation,
    // still count).
    job.measured = claim.link_model;
    if (!claim.probe_links) job.measured_for = ProbeKey(job);
    job.measured_at = now;
  } else if (!SameLinkModel(claim.link_model, options_.link_model)) {
    // Every rank of a generation must rank by one model: the claimed ring
    // ran with another, so the restored one is a new generation, which
    // every member rebuilds with this rendezvous's model.
    ++job.generation;
    job.change = absl::StrCat(
        "generation ", claim.generation, "->", job.generation,
        ": restored from the members' claims after the rendezvous "
        "restarted, with another link model (",
        options_.link_model ? DescribeLinkModel(*options_.link_model)
                            : std::string("none"),
        "; the ring ran with ",
        claim.link_model ? DescribeLinkModel(*claim.link_model)
                         : std::string("none"),
        ")");
  }
  events_.push_back(absl::StrCat("job ", job_id, ": ", job.change));
  jobs_.emplace(job_id, std::move(job));
  return absl::OkStatus();
}

absl::Status RendezvousState::Leave(const std::string& job_id,
                                    const std::string& worker_id,
                                    absl::Time now) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("leave: no job ", job_id));
  }
  Job& job = it->second;
  if (job.pending_ids.count(worker_id) != 0) {
    WithdrawPending(job_id, worker_id);
    return absl::OkStatus();
  }
  if (const Member* m = Find(job, worker_id); m != nullptr) {
    if (m->alive) Lose(job_id, job, {{worker_id, kLeftReason}}, now);
    if (Live(job) == 0 && job.pending.empty()) jobs_.erase(it);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("leave: worker ", worker_id,
                                          " is not a member of job ", job_id));
}

absl::Status RendezvousState::DeclareLost(const std::string& job_id,
                                          const std::string& worker_id,
                                          uint64_t generation,
                                          const std::string& reason,
                                          absl::Time now) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id));
  }
  Job& job = it->second;
  if (generation != job.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "report about generation ", generation, " of job ", job_id,
        ", which is at generation ", job.generation));
  }
  if (const Member* m = Find(job, worker_id); m != nullptr && m->alive) {
    Lose(job_id, job, {{worker_id, reason}}, now);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("worker ", worker_id,
                                          " is not a live member of job ",
                                          job_id));
}

std::vector<std::string> RendezvousState::Sweep(absl::Time now) {
  const size_t earlier = events_.size();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& job = it->second;
    std::vector<std::pair<std::string, std::string>> late;
    for (const Member& m : job.members) {
      if (m.alive && Silence(m, now) > options_.heartbeat_timeout) {
        late.emplace_back(m.worker_id,
                          absl::StrCat("lost: no heartbeat for ",
                                       absl::FormatDuration(absl::Trunc(
                                           now - m.last_heartbeat,
                                           absl::Milliseconds(100)))));
      }
    }
    const int live = Live(job);
    bool forget = job.generation > 0 && live == 0 && job.pending.empty();
    // Evidence that this rendezvous still hears the job: a member heard
    // within half the timeout. (In a partition every member went silent
    // within about one interval of the others, so when the first one times
    // out the rest have been silent for nearly the timeout too.)
    bool heard = false;
    for (const Member& m : job.members) {
      heard |= m.alive &&
               now - m.last_heartbeat <= options_.heartbeat_timeout / 2;
    }
    if (!late.empty() && !heard) {
      // The whole job went silent at once: either this rendezvous is cut
      // off from it (a partition) or the whole job ended. Changing the
      // generation would reach nobody, and after a partition it would
      // break a healthy ring: leave the ring alone, and forget the job only
      // once the silence has lasted far beyond the heartbeat timeout.
      absl::Duration newest = absl::InfiniteDuration();
      for (const Member& m : job.members) {
        if (m.alive) newest = std::min(newest, now - m.last_heartbeat);
      }
      forget = newest > options_.heartbeat_timeout * 10 && job.pending.empty();
      late.clear();
    }
    if (!late.empty()) Lose(it->first, job, late, now);
    Advance(it->first, job, now);
    SweepProbe(it->first, job, now, heard);
    if (forget) {
      events_.push_back(absl::StrCat(
          "job ", it->first, ": ", live == 0 ? "no member left" :
          "no member heartbeated for 10 heartbeat timeouts", "; forgotten"));
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  std::vector<std::string> lines(events_.begin() + static_cast<std::ptrdiff_t>(earlier),
                                 events_.end());
  events_.resize(earlier);
  return lines;
}

}  // namespace halka
