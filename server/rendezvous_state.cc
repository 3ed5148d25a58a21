#include "server/rendezvous_state.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace halka {

RendezvousState::RendezvousState(RendezvousOptions options)
    : options_(options) {}

std::string DescribeMember(const MemberView& m) {
  return absl::StrCat("rank ", m.rank, " (", m.worker_id, ", ", m.address,
                      ")");
}

namespace {

std::string Names(const std::vector<std::string>& names) {
  return absl::StrJoin(names, ", ");
}

// Change lines name members only up to this many; above it they count them
// (a line per event that lists everyone grows the log as N^2).
constexpr size_t kListedMembers = 8;

std::string Listed(const std::vector<std::string>& names,
                   absl::string_view what) {
  if (names.size() <= kListedMembers) return Names(names);
  return absl::StrCat(names.size(), " ", what);
}

std::string Range(int min, int max) {
  return min == max ? absl::StrCat(max) : absl::StrCat("[", min, ", ", max, "]");
}

// The world-size range [*min, *max] a join asks for, or why its arguments
// are invalid.
absl::Status CheckJoinArgs(const JoinArgs& args,
                           const RendezvousOptions& options, int* min_out,
                           int* max_out) {
  if (args.job_id.empty() || args.worker_id.empty() || args.address.empty()) {
    return absl::InvalidArgumentError(
        "join: job_id, worker_id and address must be non-empty");
  }
  if (args.host.size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "join: host is ", args.host.size(), " bytes long (at most 256)"));
  }
  int min = args.min_world_size;
  int max = args.max_world_size;
  if (max == 0 && min == 0) {
    if (args.world_size < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "join: world_size ", args.world_size, " is not positive"));
    }
    min = max = args.world_size;
  }
  if (min < 1 || min > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "join: world size range [", min, ", ", max,
        "] is invalid: need 1 <= min <= max"));
  }
  if (max > options.max_world_size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "join: a job of ", max, " members exceeds this rendezvous's limit of ",
        options.max_world_size, " members per job"));
  }
  if (args.requested_rank < -1 || args.requested_rank >= max) {
    return absl::InvalidArgumentError(
        absl::StrCat("join: requested rank ", args.requested_rank,
                     " is outside [0, ", max, ")"));
  }
  *min_out = min;
  *max_out = max;
  return absl::OkStatus();
}

// A join from a worker already pending in `job`: refreshed (OK) or refused;
// nullopt when the worker is not pending.
template <typename JobT>
std::optional<absl::Status> JoinAgain(const JoinArgs& args, JobT& job,
                                      absl::Time now) {
  for (auto& p : job.pending) {
    if (job.pending_ids.count(args.worker_id) == 0) break;  // O(1) when new
    if (p.worker_id != args.worker_id) continue;
    if (p.address != args.address) {
      return absl::AlreadyExistsError(absl::StrCat(
          "join: worker id ", args.worker_id, " already joined job ",
          args.job_id, " from ", p.address, " (this call comes from ",
          args.address, ")"));
    }
    p.incarnation = args.incarnation;
    p.device = args.device.empty() ? "cpu" : args.device;
    p.host = args.host;
    p.last_heartbeat = now;
    return absl::OkStatus();
  }
  return std::nullopt;
}

// Whether `job` has room for args' new member: a place, and the rank it asks
// for. (These two are templates: Job is RendezvousState's private type.)
template <typename JobT>
absl::Status CheckRoom(const JoinArgs& args, const JobT& job) {
  if (job.live + static_cast<int>(job.pending.size()) >= job.max) {
    std::vector<std::string> names;
    for (const auto& m : job.members) {
      if (m.alive) names.push_back(m.worker_id);
    }
    for (const auto& m : job.pending) names.push_back(m.worker_id);
    return absl::FailedPreconditionError(absl::StrCat(
        "join: job ", args.job_id, " is already complete with ", job.max,
        " members (", Listed(names, "members"), "); worker ", args.worker_id,
        " cannot join it"));
  }
  if (args.requested_rank >= 0 && job.generation == 0) {
    for (const auto& m : job.pending) {
      if (m.requested_rank == args.requested_rank) {
        return absl::FailedPreconditionError(absl::StrCat(
            "join: rank ", args.requested_rank, " of job ", args.job_id,
            " is already held by worker ", m.worker_id, " at ", m.address,
            "; worker ", args.worker_id, " at ", args.address,
            " asked for it too"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace


RendezvousState::Member* RendezvousState::Find(Job& job,
                                               const std::string& worker_id) {
  auto it = job.rank_of.find(worker_id);
  return it == job.rank_of.end() ? nullptr
                                 : &job.members[static_cast<size_t>(it->second)];
}

const RendezvousState::Member* RendezvousState::Find(
    const Job& job, const std::string& worker_id) {
  return Find(const_cast<Job&>(job), worker_id);
}

void RendezvousState::Index(Job& job) {
  job.rank_of.clear();
  job.live = 0;
  for (size_t i = 0; i < job.members.size(); ++i) {
    job.rank_of[job.members[i].worker_id] = static_cast<int>(i);
    job.live += job.members[i].alive ? 1 : 0;
  }
}

absl::Status RendezvousState::Join(const JoinArgs& args, absl::Time now) {
  int min = 0;
  int max = 0;
  if (absl::Status s = CheckJoinArgs(args, options_, &min, &max); !s.ok()) {
    return s;
  }
  auto it = jobs_.find(args.job_id);
  if (it == jobs_.end()) {
    if (static_cast<int>(jobs_.size()) >= options_.max_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "join: this rendezvous already holds ", jobs_.size(),
          " jobs (the limit)"));
    }
    it = jobs_.emplace(args.job_id, Job{}).first;
    it->second.epoch = ++epochs_;
    it->second.min = min;
    it->second.max = max;
  }
  Job& job = it->second;
  if (job.min != min || job.max != max) {
    return absl::FailedPreconditionError(absl::StrCat(
        "join: worker ", args.worker_id, " says job ", args.job_id,
        " has world size ", Range(min, max), " but it was created with ",
        Range(job.min, job.max)));
  }
  auto same_process = [&](const Member& m) {
    return args.incarnation != 0 ? m.incarnation == args.incarnation
                                 : m.address == args.address;
  };
  if (Member* found = Find(job, args.worker_id);
      found != nullptr && found->alive) {
    Member& m = *found;
    if (m.address != args.address) {
      return absl::AlreadyExistsError(absl::StrCat(
          "join: worker id ", args.worker_id, " is alive in job ",
          args.job_id, " at ", m.address, " (this call comes from ",
          args.address, "); if that process died it is declared lost within "
          "the heartbeat timeout"));
    }
    if (same_process(m)) {
      m.last_heartbeat = now;
      m.grace_from = now;
      return absl::OkStatus();  // a retried join
    }
    // The same id and address from a new process: a restart.
    Lose(args.job_id, job,
         {{m.worker_id, "restarted (a new process joined under its id)"}}, now);
  }
  if (std::optional<absl::Status> again = JoinAgain(args, job, now)) {
    return *again;
  }
  if (absl::Status s = CheckRoom(args, job); !s.ok()) return s;
  Member m;
  m.worker_id = args.worker_id;
  m.address = args.address;
  m.device = args.device.empty() ? "cpu" : args.device;
  m.requested_rank = args.requested_rank;
  m.incarnation = args.incarnation;
  m.host = args.host;
  m.last_heartbeat = now;
  job.pending_ids.insert(m.worker_id);
  job.pending.push_back(std::move(m));
  job.lost.erase(std::remove_if(job.lost.begin(), job.lost.end(),
                                [&](const Member& l) {
                                  return l.worker_id == args.worker_id;
                                }),
                 job.lost.end());
  job.last_join = now;
  Advance(args.job_id, job, now);
  return absl::OkStatus();
}

void RendezvousState::Reform(Job& job, absl::Time now) {
  std::vector<Member> cands;
  for (const Member& m : job.members) {
    if (m.alive) cands.push_back(m);
  }
  const size_t room = static_cast<size_t>(job.max) - cands.size();
  const size_t admit = std::min(room, job.pending.size());
  for (size_t i = 0; i < admit; ++i) {
    Member m = job.pending[i];
    m.rank = -1;
    m.since_generation = job.generation;
    m.grace_from = now;
    cands.push_back(std::move(m));
  }
  for (size_t i = 0; i < admit; ++i) {
    job.pending_ids.erase(job.pending[i].worker_id);
  }
  job.pending.erase(job.pending.begin(),
                    job.pending.begin() + static_cast<std::ptrdiff_t>(admit));
  const size_t g = cands.size();
  std::vector<int> rank(g, -1);
  std::vector<bool> taken(g, false);
  // Asked-for ranks first, then survivors keep theirs, then the rest fill
  // the holes in order.
  for (size_t i = 0; i < g; ++i) {
    const int r = cands[i].requested_rank;
    if (r >= 0 && r < static_cast<int>(g) && !taken[static_cast<size_t>(r)]) {
      rank[i] = r;
      taken[static_cast<size_t>(r)] = true;
    }
  }
  for (size_t i = 0; i < g; ++i) {
    const int r = cands[i].rank;
    if (rank[i] < 0 && r >= 0 && r < static_cast<int>(g) &&
        !taken[static_cast<size_t>(r)]) {
      rank[i] = r;
      taken[static_cast<size_t>(r)] = true;
    }
  }
  size_t next = 0;
  for (size_t i = 0; i < g; ++i) {
    if (rank[i] >= 0) continue;
    while (taken[next]) ++next;
    rank[i] = static_cast<int>(next);
    taken[next] = true;
  }
  std::vector<Member> ordered(g);
  for (size_t i = 0; i < g; ++i) {
    cands[i].rank = rank[i];
    ordered[static_cast<size_t>(rank[i])] = std::move(cands[i]);
  }
  job.members = std::move(ordered);
  Index(job);
  job.active = true;
}

std::string RendezvousState::Lose(
    const std::string& job_id, Job& job,
    const std::vector<std::pair<std::string, std::string>>& who,
    absl::Time now) {
  std::vector<std::string> lines;
  std::vector<Member> lost;
  for (const auto& [id, reason] : who) {
    Member* m = Find(job, id);
    if (m == nullptr || !m->alive) continue;
    m->alive = false;
    --job.live;
    lost.push_back(*m);
    lost.back().left = reason == kLeftReason;
    lines.push_back(absl::StrCat(DescribeMember(View(*m, now)), " ", reason));
  }
  if (lost.empty()) return "";
  const uint64_t before = job.generation;
  ++job.generation;
  job.lost = std::move(lost);
  const int live = Live(job);
  const int pending = static_cast<int>(job.pending.size());
  std::string after;
  if (live + pending >= job.min && live + pending > 0) {
    Reform(job, now);
    after = absl::StrCat("ring re-formed with ", job.members.size(),
                         " members");
  } else {
    job.active = false;
    after = absl::StrCat("waiting: ", live, " of at least ", job.min,
                         " members live, ", job.min - live - pending,
                         " missing");
  }
  // Many members lost at once (a host or a rack): name the first few.
  const size_t named = std::min(lines.size(), kListedMembers);
  std::string more;
  if (lines.size() > named) {
    more = absl::StrCat("; and ", lines.size() - named, " more (",
                        lines.size(), " lost)");
  }
  lines.resize(named);
  job.change = absl::StrCat("generation ", before, "->", job.generation, ": ",
                            absl::StrJoin(lines, "; "), more, "; ", after);
  std::string line = absl::StrCat("job ", job_id, ": ", job.change);
  events_.push_back(line);
  return line;
}

std::string RendezvousState::Advance(const std::string& job_id, Job& job,
                                     absl::Time now) {
  const int live = Live(job);
  const int pending = static_cast<int>(job.pending.size());
  if (pending == 0) return "";
  const bool settled = now - job.last_join >= options_.elastic_settle;
  bool form = false;
  if (job.generation == 0) {
    form = live + pending >= job.max ||
           (elastic(job) && live + pending >= job.min && settled);
  } else if (!job.active) {
    form = live + pending >= job.min;  // the job is down: recover at once
  } else {
    form = live < job.max && (live + pending >= job.max || settled);
  }
  if (!form) return "";
  const uint64_t before = job.generation;
  std::vector<std::string> admitted;
  const size_t admit = std::min(static_cast<size_t>(job.max - live),
                                job.pending.size());
  for (size_t i = 0; i < admit; ++i) {
    admitted.push_back(absl::StrCat(job.pending[i].worker_id, " at ",
                                    job.pending[i].address));
  }
  ++job.generation;
  Reform(job, now);
  job.lost.clear();
  if (before == 0) {
    job.change = absl::StrCat("generation 1: ring formed with ",
                              job.members.size(), " members");
  } else {
    job.change = absl::StrCat("generation ", before, "->", job.generation,
                              ": admitted ", Listed(admitted, "members"),
                              "; ring re-formed with ", job.members.size(),
                              " members");
  }
  std::string line = absl::StrCat("job ", job_id, ": ", job.change);
  events_.push_back(line);
  return line;
}

void RendezvousState::JoinReturned(const std::string& job_id,
                                   const std::string& worker_id,
                                   absl::Time now) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Member* m = Find(it->second, worker_id);
  if (m != nullptr && m->alive) m->grace_from = std::max(m->grace_from, now);
}

void RendezvousState::WithdrawPending(const std::string& job_id,
                                      const std::string& worker_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  auto& ps = it->second.pending;
  if (it->second.pending_ids.erase(worker_id) == 0) return;
  ps.erase(std::remove_if(ps.begin(), ps.end(),
                          [&](const Member& m) {
                            return m.worker_id == worker_id;
                          }),
           ps.end());
  if (ps.empty() && Live(it->second) == 0) jobs_.erase(it);
}

std::string RendezvousState::DescribeForming(const std::string& job_id,
                                             size_t max_listed) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::StrCat("job ", job_id, ": nobody joined");
  const Job& job = it->second;
  const int have = Live(job) + static_cast<int>(job.pending.size());
  // " (w0 at a0, w1 at a1)", or nothing above max_listed members.
  std::string listed;
  if (static_cast<size_t>(have) <= max_listed) {
    std::vector<std::string> who;
    for (const Member& m : job.members) {
      if (m.alive) who.push_back(absl::StrCat(m.worker_id, " at ", m.address));
    }
    for (const Member& m : job.pending) {
      who.push_back(absl::StrCat(m.worker_id, " at ", m.address));
    }
    listed = absl::StrCat(" (", Names(who), ")");
  }
  if (job.generation == 0 && job.min == job.max) {
    return absl::StrCat("job ", job_id, ": ", have, " of ", job.max,
                        " joined", listed, "; ", job.max - have, " missing");
  }
  if (job.generation == 0 || !job.active) {
    return absl::StrCat(
        "job ", job_id, job.generation == 0 ? "" : absl::StrCat(
            " (generation ", job.generation, ", waiting)"),
        ": ", have, " joined", listed, "; the ring needs at least ",
        job.min, job.min > have ? absl::StrCat(", ", job.min - have,
                                               " missing") : std::string(),
        job.min < job.max ? absl::StrCat(" (elastic, at most ", job.max, ")")
                          : std::string());
  }
  return absl::StrCat("job ", job_id, " (generation ", job.generation, ", ",
                      Live(job), " members): ", job.pending.size(),
                      " waiting for admission");
}

}  // namespace halka
