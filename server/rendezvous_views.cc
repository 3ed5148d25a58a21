// RendezvousState's views (one file of the class; the membership logic is
// in rendezvous_state.cc): what a member, a Join reply, a Watch and health
// see of a job, with the ring's path over hosts (host_ring.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/rendezvous_state.h"

namespace halka {

MemberView RendezvousState::View(const Member& m, absl::Time now) {
  MemberView v;
  v.rank = m.rank;
  v.worker_id = m.worker_id;
  v.address = m.address;
  v.device = m.device;
  v.alive = m.alive;
  v.heartbeat_age = now - m.last_heartbeat;
  v.telemetry = m.telemetry;
  v.since_generation = m.since_generation;
  v.host = m.host;
  v.left = m.left;
  return v;
}

MembershipView RendezvousState::ViewOf(const Job& job, absl::Time now) const {
  MembershipView v;
  v.generation = job.generation;
  v.min_world_size = job.min;
  v.max_world_size = job.max;
  v.world_size = static_cast<int>(job.members.size());
  v.change = job.change;
  v.link_model = ModelOf(job);
  v.probe_links = job.active && ProbePending(job);
  const int live = Live(job);
  v.state = job.generation == 0 ? JobState::kForming
            : !job.active       ? JobState::kWaiting
            : live == job.max   ? JobState::kHealthy
                                : JobState::kDegraded;
  for (const Member& m : job.members) v.members.push_back(View(m, now));
  for (const Member& m : job.lost) v.lost.push_back(View(m, now));
  if (job.generation > 0) {
    // job.members is by rank: the ring's path follows its hosts.
    std::vector<std::string> hosts;
    hosts.reserve(job.members.size());
    for (const Member& m : job.members) hosts.push_back(m.host);
    HostRing ring = HostRingOrder(hosts);
    v.ring_order = std::move(ring.order);
    v.hosts = std::move(ring.hosts);
  }
  if (job.generation == 0) {
    v.world_size = job.max;
    for (const Member& m : job.pending) v.members.push_back(View(m, now));
  }
  return v;
}

std::optional<Assignment> RendezvousState::GetAssignment(
    const std::string& job_id, const std::string& worker_id) const {
  const int rank = AssignedRank(job_id, worker_id);
  if (rank < 0) return std::nullopt;
  Assignment a;
  a.rank = rank;
  a.view = *AssignmentView(job_id);
  return a;
}

int RendezvousState::AssignedRank(const std::string& job_id,
                                  const std::string& worker_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !it->second.active) return -1;
  const Member* m = Find(it->second, worker_id);
  return m != nullptr && m->alive ? m->rank : -1;
}

std::optional<MembershipView> RendezvousState::AssignmentView(
    const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !it->second.active) return std::nullopt;
  // Ages as of the newest beat in the view: the members' are zero (they
  // are alive), the lost members' count from their last beat.
  absl::Time as_of = absl::InfinitePast();
  for (const Member& m : it->second.members) {
    as_of = std::max(as_of, m.last_heartbeat);
  }
  MembershipView v = ViewOf(it->second, as_of);
  for (MemberView& m : v.members) m.heartbeat_age = absl::ZeroDuration();
  return v;
}

absl::StatusOr<MembershipView> RendezvousState::Health(
    const std::string& job_id, absl::Time now) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("health: no job ", job_id));
  }
  return ViewOf(it->second, now);
}

uint64_t RendezvousState::Generation(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : it->second.generation;
}

std::string RendezvousState::AddressOf(const std::string& job_id,
                                       const std::string& worker_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return "";
  const Member* m = Find(it->second, worker_id);
  return m != nullptr && m->alive ? m->address : "";
}
}  // namespace halka
