// What the peer links of one worker, or of every worker of a LocalCluster,
// did (WorkerNode::link_counters, core/link_counters.h), as plain
// numbers: each worker counts its own links only, so these never include
// what another cluster or worker of the test's process did.
#ifndef HALKA_TESTS_TESTING_LINK_COUNTS_H_
#define HALKA_TESTS_TESTING_LINK_COUNTS_H_

#include <cstdint>

#include "halka/local_cluster.h"
#include "core/link_counters.h"
#include "worker/worker_node.h"

namespace halka::testing {

struct LinkCounts {
  uint64_t shm_accepted = 0;
  uint64_t shm_refused = 0;
  uint64_t wire_accepted = 0;
  uint64_t wire_refused = 0;
  uint64_t wire_fell_back = 0;
  uint64_t wire_landed = 0;
  uint64_t wire_evicted = 0;
  uint64_t missed_wakeups = 0;
  uint64_t grpc_frames_batched = 0;

  LinkCounts& operator+=(const LinkCounts& o) {
    shm_accepted += o.shm_accepted;
    shm_refused += o.shm_refused;
    wire_accepted += o.wire_accepted;
    wire_refused += o.wire_refused;
    wire_fell_back += o.wire_fell_back;
    wire_landed += o.wire_landed;
    wire_evicted += o.wire_evicted;
    missed_wakeups += o.missed_wakeups;
    grpc_frames_batched += o.grpc_frames_batched;
    return *this;
  }
};

inline LinkCounts CountsOf(const LinkCounters& c) {
  LinkCounts n;
  n.shm_accepted = c.shm.accepted.load();
  n.shm_refused = c.shm.refused.load();
  n.wire_accepted = c.wire.accepted.load();
  n.wire_refused = c.wire.refused.load();
  n.wire_fell_back = c.wire.fell_back.load();
  n.wire_landed = c.wire.landed.load();
  n.wire_evicted = c.wire.evicted.load();
  n.missed_wakeups = c.missed_wakeups.load();
  n.grpc_frames_batched = c.grpc_frames_batched.load();
  return n;
}

inline LinkCounts CountsOf(const WorkerNode& worker) {
  return CountsOf(worker.link_counters());
}

// Summed over the cluster's live workers.
inline LinkCounts CountsOf(const LocalCluster& cluster) {
  LinkCounts sum;
  for (int r = 0; r < cluster.size(); ++r) {
    if (const WorkerNode* w = cluster.worker(r)) sum += CountsOf(*w);
  }
  return sum;
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_LINK_COUNTS_H_
