#include "server/rendezvous_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace halka {

RendezvousState::RendezvousState(RendezvousOptions options)
    : options_(options) {}

absl::Status RendezvousState::Join(const JoinArgs& args, absl::Time now) {
  if (args.job_id.empty() || args.worker_id.empty() || args.address.empty()) {
    return absl::InvalidArgumentError(
        "join: job_id, worker_id and address must be non-empty");
  }
  if (args.world_size < 1 || args.world_size > options_.max_world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("join: world_size ", args.world_size, " is outside [1, ",
                     options_.max_world_size, "]"));
  }
  if (args.requested_rank < -1 || args.requested_rank >= args.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("join: requested rank ", args.requested_rank,
                     " is outside [0, ", args.world_size, ")"));
  }
  auto it = jobs_.find(args.job_id);
  if (it == jobs_.end()) {
    if (static_cast<int>(jobs_.size()) >= options_.max_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "join: this rendezvous already holds ", jobs_.size(),
          " jobs (the limit)"));
    }
    it = jobs_.emplace(args.job_id, Job{}).first;
    it->second.world_size = args.world_size;
  }
  Job& job = it->second;
  if (job.world_size != args.world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "join: worker ", args.worker_id, " says job ", args.job_id,
        " has world size ", args.world_size, " but it was created with ",
        job.world_size));
  }
  for (Member& m : job.members) {
    if (m.worker_id != args.worker_id) continue;
    if (m.address != args.address) {
      return absl::AlreadyExistsError(absl::StrCat(
          "join: worker id ", args.worker_id, " already joined job ",
          args.job_id, " from ", m.address, " (this call comes from ",
          args.address, ")"));
    }
    if (!m.alive) {
      return absl::FailedPreconditionError(absl::StrCat(
          "join: worker ", args.worker_id, " was declared dead in job ",
          args.job_id, " (generation ", job.generation,
          "); this job does not re-admit members"));
    }
    m.last_heartbeat = now;
    return absl::OkStatus();  // a retried join
  }
  if (job.formed) {
    std::vector<std::string> names;
    for (const Member& m : job.members) names.push_back(m.worker_id);
    return absl::FailedPreconditionError(absl::StrCat(
        "join: job ", args.job_id, " is already complete with ",
        job.world_size, " members (", absl::StrJoin(names, ", "),
        "); worker ", args.worker_id, " cannot join it"));
  }
  if (args.requested_rank >= 0) {
    for (const Member& m : job.members) {
      if (m.requested_rank == args.requested_rank) {
        return absl::FailedPreconditionError(absl::StrCat(
            "join: rank ", args.requested_rank, " of job ", args.job_id,
            " is already held by worker ", m.worker_id, " at ", m.address,
            "; worker ", args.worker_id, " at ", args.address,
            " asked for it too"));
      }
    }
  }
  Member m;
  m.worker_id = args.worker_id;
  m.address = args.address;
  m.device = args.device.empty() ? "cpu" : args.device;
  m.requested_rank = args.requested_rank;
  m.last_heartbeat = now;
  job.members.push_back(std::move(m));
  if (static_cast<int>(job.members.size()) == job.world_size) Form(job);
  return absl::OkStatus();
}

void RendezvousState::Form(Job& job) {
  const size_t g = static_cast<size_t>(job.world_size);
  std::vector<Member> ordered(g);
  std::vector<bool> taken(g, false);
  for (Member& m : job.members) {
    if (m.requested_rank >= 0) {
      m.rank = m.requested_rank;
      taken[static_cast<size_t>(m.rank)] = true;
    }
  }
  size_t next = 0;
  for (Member& m : job.members) {
    if (m.rank >= 0) continue;
    while (taken[next]) ++next;
    m.rank = static_cast<int>(next);
    taken[next] = true;
  }
  for (Member& m : job.members) ordered[static_cast<size_t>(m.rank)] = m;
  job.members = std::move(ordered);
  job.formed = true;
  job.generation = 1;
}

MemberView RendezvousState::View(const Member& m,
                                                  absl::Time now) {
  MemberView v;
  v.rank = m.rank;
  v.worker_id = m.worker_id;
  v.address = m.address;
  v.device = m.device;
  v.alive = m.alive;
  v.heartbeat_age = now - m.last_heartbeat;
  v.telemetry = m.telemetry;
  return v;
}

std::optional<Assignment> RendezvousState::GetAssignment(
    const std::string& job_id, const std::string& worker_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !it->second.formed) return std::nullopt;
  const Job& job = it->second;
  Assignment a;
  a.world_size = job.world_size;
  a.generation = job.generation;
  for (const Member& m : job.members) {
    if (m.worker_id == worker_id) a.rank = m.rank;
    a.members.push_back(View(m, m.last_heartbeat));
  }
  if (a.rank < 0) return std::nullopt;
  return a;
}

void RendezvousState::WithdrawPending(const std::string& job_id,
                                      const std::string& worker_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.formed) return;
  auto& ms = it->second.members;
  ms.erase(std::remove_if(ms.begin(), ms.end(),
                          [&](const Member& m) {
                            return m.worker_id == worker_id;
                          }),
           ms.end());
  if (ms.empty()) jobs_.erase(it);
}

std::string RendezvousState::DescribeForming(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::StrCat("job ", job_id, ": nobody joined");
  const Job& job = it->second;
  std::vector<std::string> who;
  for (const Member& m : job.members) {
    who.push_back(absl::StrCat(m.worker_id, " at ", m.address));
  }
  return absl::StrCat("job ", job_id, ": ", job.members.size(), " of ",
                      job.world_size, " joined (", absl::StrJoin(who, ", "),
                      "); ", job.world_size - static_cast<int>(job.members.size()),
                      " missing");
}

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
  Member* self = nullptr;
  for (Member& m : job.members) {
    if (m.worker_id == worker_id) self = &m;
    if (!m.alive) out.dead_ranks.push_back(m.rank);
  }
  if (self == nullptr) {
    return absl::NotFoundError(absl::StrCat("heartbeat: worker ", worker_id,
                                            " is not a member of job ", job_id));
  }
  if (!self->alive) {
    return absl::FailedPreconditionError(absl::StrCat(
        "heartbeat: worker ", worker_id, " was declared dead in job ", job_id,
        " (generation ", job.generation, ")"));
  }
  self->last_heartbeat = now;
  self->telemetry = telemetry;
  return out;
}

absl::Status RendezvousState::Leave(const std::string& job_id,
                                    const std::string& worker_id,
                                    absl::Time now) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("leave: no job ", job_id));
  }
  Job& job = it->second;
  if (!job.formed) {
    for (const Member& m : job.members) {
      if (m.worker_id == worker_id) {
        WithdrawPending(job_id, worker_id);
        return absl::OkStatus();
      }
    }
    return absl::NotFoundError(absl::StrCat(
        "leave: worker ", worker_id, " has not joined job ", job_id));
  }
  for (Member& m : job.members) {
    if (m.worker_id != worker_id) continue;
    if (m.alive) {
      m.alive = false;
      m.last_heartbeat = now;
      ++job.generation;
    }
    bool any_alive = false;
    for (const Member& o : job.members) any_alive |= o.alive;
    if (!any_alive) jobs_.erase(it);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("leave: worker ", worker_id,
                                          " is not a member of job ", job_id));
}

std::vector<std::string> RendezvousState::Sweep(absl::Time now) {
  std::vector<std::string> lines;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& job = it->second;
    if (!job.formed) {
      ++it;
      continue;
    }
    bool died = false;
    bool any_alive = false;
    for (Member& m : job.members) {
      if (m.alive && now - m.last_heartbeat > options_.heartbeat_timeout) {
        m.alive = false;
        died = true;
        lines.push_back(absl::StrCat(
            "job ", it->first, ": rank ", m.rank, " (", m.worker_id, ", ",
            m.address, ") lost: no heartbeat for ",
            absl::FormatDuration(now - m.last_heartbeat)));
      }
      any_alive |= m.alive;
    }
    if (died) ++job.generation;
    if (!any_alive) {
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  return lines;
}

absl::StatusOr<JobHealth> RendezvousState::Health(const std::string& job_id,
                                                  absl::Time now) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("health: no job ", job_id));
  }
  const Job& job = it->second;
  JobHealth h;
  h.generation = job.generation;
  h.world_size = job.world_size;
  bool all_alive = true;
  for (const Member& m : job.members) {
    h.members.push_back(View(m, now));
    all_alive &= m.alive;
  }
  h.state = !job.formed ? "forming" : all_alive ? "healthy" : "degraded";
  return h;
}

absl::Status RendezvousState::RegisterServer(const std::string& job_id,
                                             const std::string& server_id,
                                             const std::string& address,
                                             int shard, int shards,
                                             absl::Time now) {
  if (job_id.empty() || server_id.empty() || address.empty()) {
    return absl::InvalidArgumentError(
        "register server: job_id, server_id and address must be non-empty");
  }
  if (shards < 1 || shards > 1024 || shard < 0 || shard >= shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register server: shard ", shard, " of ", shards, " is out of range"));
  }
  auto it = servers_.find(job_id);
  if (it == servers_.end()) {
    if (static_cast<int>(servers_.size()) >= options_.max_jobs) {
      return absl::ResourceExhaustedError(
          "register server: too many jobs with parameter servers");
    }
    it = servers_.emplace(job_id, ServerSet{}).first;
    it->second.shards = shards;
  }
  ServerSet& set = it->second;
  if (set.shards != shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "register server: job ", job_id, " has ", set.shards,
        " parameter-server shards, ", server_id, " says ", shards));
  }
  set.by_shard[shard] = Server{server_id, address, now};
  return absl::OkStatus();
}

absl::StatusOr<std::vector<MemberView>> RendezvousState::LookupServers(
    const std::string& job_id, absl::Time now) const {
  auto it = servers_.find(job_id);
  if (it == servers_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "waiting for parameter server of job ", job_id,
        ": none has registered"));
  }
  const ServerSet& set = it->second;
  std::vector<MemberView> out;
  std::vector<std::string> missing;
  for (int k = 0; k < set.shards; ++k) {
    auto s = set.by_shard.find(k);
    if (s == set.by_shard.end()) {
      missing.push_back(absl::StrCat(k));
      continue;
    }
    MemberView v;
    v.rank = k;
    v.worker_id = s->second.server_id;
    v.address = s->second.address;
    v.device = "ps";
    v.heartbeat_age = now - s->second.registered;
    out.push_back(v);
  }
  if (!missing.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "waiting for parameter server of job ", job_id, ": shard ",
        absl::StrJoin(missing, ", "), " of ", set.shards, " missing"));
  }
  return out;
}

}  // namespace halka
