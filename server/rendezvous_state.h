// The rendezvous's membership logic as a pure state machine: no threads, no
// clock of its own (every call takes `now`), no gRPC. The service wraps it
// in a mutex and waits on it.
//
// A job forms when world_size workers have joined: ranks requested by
// workers (StatefulSet ordinals) are honoured, the rest are filled in join
// order, and the generation becomes 1. After that, a missed heartbeat
// deadline or a Leave marks a member gone and bumps the generation.
// Thread-safety: none; the caller serialises.
#ifndef HALKA_SERVER_RENDEZVOUS_STATE_H_
#define HALKA_SERVER_RENDEZVOUS_STATE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace halka {

struct RendezvousOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  int max_jobs = 4096;
  int max_world_size = 4096;
};

struct JoinArgs {
  std::string job_id;
  std::string worker_id;
  std::string address;
  std::string device;
  int world_size = 0;
  int requested_rank = -1;  // -1: any
};

// What a worker learns when its job forms, and what health reports.
struct MemberView {
  int rank = -1;
  std::string worker_id;
  std::string address;
  std::string device;
  bool alive = true;
  absl::Duration heartbeat_age;
  std::string telemetry;  // opaque to the state (serialised by the service)
};

struct Assignment {
  int rank = -1;
  int world_size = 0;
  uint64_t generation = 0;
  std::vector<MemberView> members;  // ring order, members[i].rank == i
};

struct HeartbeatResult {
  uint64_t generation = 0;
  std::vector<int> dead_ranks;
};

struct JobHealth {
  std::string state;  // "forming", "healthy", "degraded"
  uint64_t generation = 0;
  int world_size = 0;
  std::vector<MemberView> members;  // forming: in join order, rank -1
};

class RendezvousState {
 public:
  explicit RendezvousState(RendezvousOptions options = {});

  // Registers a worker. Errors: INVALID_ARGUMENT (empty ids/address,
  // world_size out of range, requested rank outside the world),
  // FAILED_PRECONDITION (world size disagrees, rank taken, job complete),
  // ALREADY_EXISTS (same worker id from another address),
  // RESOURCE_EXHAUSTED (too many jobs). Joining again with the same id and
  // address is idempotent.
  absl::Status Join(const JoinArgs& args, absl::Time now);

  // The worker's assignment once its job has formed; nullopt before.
  std::optional<Assignment> GetAssignment(const std::string& job_id,
                                          const std::string& worker_id) const;

  // Withdraws a pending (not yet formed) join, e.g. after the joiner gave
  // up waiting. No-op once the job formed.
  void WithdrawPending(const std::string& job_id, const std::string& worker_id);

  // "job J: 2 of 4 joined (w0 at a0, w1 at a1); 2 missing".
  std::string DescribeForming(const std::string& job_id) const;

  // Errors: NOT_FOUND (job or worker unknown), FAILED_PRECONDITION
  // (the worker was declared dead or left).
  absl::StatusOr<HeartbeatResult> Heartbeat(const std::string& job_id,
                                            const std::string& worker_id,
                                            const std::string& telemetry,
                                            absl::Time now);

  // Errors: NOT_FOUND.
  absl::Status Leave(const std::string& job_id, const std::string& worker_id,
                     absl::Time now);

  // Declares dead every member whose last heartbeat is older than the
  // timeout, bumping its job's generation once per sweep. Returns one line
  // per death. Drops jobs that have no live member left.
  std::vector<std::string> Sweep(absl::Time now);

  // Errors: NOT_FOUND.
  absl::StatusOr<JobHealth> Health(const std::string& job_id,
                                   absl::Time now) const;

  // Parameter-server shards of a job, which may register before or after
  // the workers. Errors: INVALID_ARGUMENT, FAILED_PRECONDITION (shard
  // count differs from an earlier registration), RESOURCE_EXHAUSTED.
  absl::Status RegisterServer(const std::string& job_id,
                              const std::string& server_id,
                              const std::string& address, int shard,
                              int shards, absl::Time now);
  // Every shard in order, or NOT_FOUND saying which are missing.
  absl::StatusOr<std::vector<MemberView>> LookupServers(
      const std::string& job_id, absl::Time now) const;

  const RendezvousOptions& options() const { return options_; }
  // Every job the rendezvous knows, in id order.
  std::vector<std::string> JobIds() const {
    std::vector<std::string> ids;
    for (const auto& [id, job] : jobs_) ids.push_back(id);
    return ids;
  }

 private:
  struct Member {
    std::string worker_id;
    std::string address;
    std::string device;
    int requested_rank = -1;
    int rank = -1;
    bool alive = true;
    absl::Time last_heartbeat;
    std::string telemetry;
  };
  struct Job {
    int world_size = 0;
    bool formed = false;
    uint64_t generation = 0;
    std::vector<Member> members;  // join order until formed, then by rank
  };
  void Form(Job& job);
  static MemberView View(const Member& m, absl::Time now);

  struct Server {
    std::string server_id;
    std::string address;
    absl::Time registered;
  };
  struct ServerSet {
    int shards = 0;
    std::map<int, Server> by_shard;
  };

  RendezvousOptions options_;
  std::map<std::string, Job> jobs_;
  std::map<std::string, ServerSet> servers_;  // by job id
};

}  // namespace halka

#endif  // HALKA_SERVER_RENDEZVOUS_STATE_H_
