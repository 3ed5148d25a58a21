// RendezvousState's registry of parameter-server shards (one file of the
// class; the membership logic is in rendezvous_state.cc).
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/rendezvous_state.h"

namespace halka {

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
