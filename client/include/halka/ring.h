// What the SDK reports about the ring, in plain C++ types: the worker's
// view of its job (Client::Info) and the job's health as the rendezvous
// sees it (Client::RingHealth). They carry the wire's (halka.v1) figures
// field for field, under the same names, and name no generated type.
#ifndef HALKA_CLIENT_RING_H_
#define HALKA_CLIENT_RING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "halka/types.h"

namespace halka {

// A ring member as the rendezvous knows it.
struct Member {
  int rank = 0;
  std::string worker_id;
  std::string address;             // host:port of its peer/worker server
  bool alive = false;
  double last_heartbeat_age_s = 0;
  std::string device;              // "cpu" or "cuda:N"
  uint64_t since_generation = 0;   // the generation it entered the ring
  std::string host;                // the host it runs on; "": unknown
};

// This worker's rank, world and members (Client::Info).
struct WorkerInfo {
  std::string job_id;
  std::string worker_id;
  int rank = 0;
  int world_size = 0;
  uint64_t generation = 0;
  std::vector<Member> members;     // by rank: members[i].rank == i
  std::string device;
  std::string change;              // why the generation last changed
  // The newest generation this worker knows of (it switches rings between
  // operations, so it may be ahead of `generation`), and whether it is a
  // live member of it.
  uint64_t membership_generation = 0;
  bool in_ring = false;
  JobState job_state = JobState::kUnspecified;
};

// Payload bytes between a worker and one peer since the worker started;
// peer >= world_size is parameter-server shard (peer - world_size).
struct LinkTelemetry {
  int peer = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

// What a worker reported with its last heartbeat.
struct WorkerTelemetry {
  uint64_t ops_completed = 0;
  uint64_t ops_failed = 0;
  uint64_t bytes_sent = 0;         // payload bytes, all links
  uint64_t bytes_received = 0;
  double send_seconds = 0;         // handing frames to the wire
  double wait_seconds = 0;         // blocked waiting for the predecessor
  double reduce_seconds = 0;
  std::string current_op;          // "" when idle, else e.g. "all_reduce #12"
  std::string phase;               // "fingerprint", "reduce-scatter", ...
  int step = 0;
  int awaited_rank = -1;           // -1 when not waiting
  double waiting_for_s = 0;
  int chunk = 0;                   // 1-based chunk of the step awaited
  int chunks = 0;                  // chunks in that step
  std::string last_error;
  std::vector<LinkTelemetry> links;
};

// One directed edge over the last minute.
struct EdgeHealth {
  int from = 0;
  int to = 0;
  uint64_t bytes = 0;              // payload in the window
  double throughput_bps = 0;       // bytes / wire_seconds
  double wait_seconds = 0;         // the receiver blocked on `from`
  double added_wait_seconds = 0;   // wait not explained by `from` waiting
  double wait_p50_seconds = 0;
  double wait_p99_seconds = 0;
  uint64_t errors = 0;
  bool ring = false;               // a ring edge (rank -> ring successor)
  double wire_seconds = 0;         // the sender's link writing its frames
};

// The rendezvous's verdict on who slows the ring, and why it fails.
struct Diagnosis {
  bool has_straggler = false;
  int straggler_rank = -1;         // the rank the others wait on
  int slowest_from = -1;           // the slowest ring edge
  int slowest_to = -1;
  std::string summary;             // one sentence with the evidence
  std::string failure;             // set while RingHealth::failing
  int late_rank = -1;              // calls reach the ring late
  int stalled_rank = -1;           // its process stalled
};

// One rank's own figures over the window.
struct RankHealth {
  int rank = 0;
  double arrival_lag_p50_seconds = 0;  // after the ring's first caller
  double arrival_lag_p99_seconds = 0;
  uint64_t arrival_ops = 0;
  double stall_seconds = 0;            // its process did not run
  double ring_seconds = 0;             // its operations after fingerprints
  double op_seconds = 0;
};

// A job's health (Client::RingHealth).
struct RingHealth {
  std::string job_id;
  uint64_t generation = 0;
  int world_size = 0;
  int min_world_size = 0;
  int max_world_size = 0;
  JobState job_state = JobState::kUnspecified;
  // True while the last operation that ended on any live member failed;
  // diagnosis.failure says why. A failing job is not healthy.
  bool failing = false;
  std::string change;                    // why the generation last changed
  std::vector<Member> members;
  std::vector<Member> lost;              // lost in the last change
  std::vector<WorkerTelemetry> telemetry;  // parallel to members
  std::vector<EdgeHealth> edges;         // over the last minute
  std::vector<RankHealth> ranks;         // per live rank with telemetry
  Diagnosis diagnosis;
  std::string last_algorithm;            // what the last operations used
  uint64_t last_chunk_bytes = 0;
  // The last operation's time on the member that reported it, and what
  // the job's link model predicted for it (0: no model or no prediction).
  double last_op_seconds = 0;
  double last_model_seconds = 0;
  // The ring's path: ring_order[p] is the rank at ring position p (each
  // host's ranks adjacent; rank order when a member named no host), and
  // the hosts in ring order with their ranks (empty: a member named none).
  std::vector<int> ring_order;
  std::vector<HostGroup> hosts;
  // The job's link model, as auto uses it ("local: alpha 5.0 us, B 8.000
  // GB/s; net: ..."); "": none (auto's counting rules).
  std::string link_model;
};

}  // namespace halka

#endif  // HALKA_CLIENT_RING_H_
