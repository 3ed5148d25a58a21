// The vocabulary a Communicator shares with its operations: who the peers
// are, how the communicator is configured, what an operation returns and
// what it is doing right now. Plain structs, no logic.
#ifndef HALKA_CORE_COMM_TYPES_H_
#define HALKA_CORE_COMM_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/cost_model.h"
#include "core/frame.h"

namespace halka {

struct PeerInfo {
  int rank = -1;
  std::string worker_id;
  std::string address;
};
// "rank 2 (worker-2, 127.0.0.1:7002)".
std::string DescribePeer(const PeerInfo& peer);

struct CommConfig {
  int rank = 0;
  int world_size = 1;
  uint64_t generation = 1;
  std::vector<PeerInfo> members;  // members[i].rank == i
  // The ranks in ring order (Membership.ring_order; RingPath): each rank
  // sends to the rank after it. Empty: rank order. Every rank of a ring
  // must hold the same order.
  std::vector<int> ring_order;
  // The hosts in ring order, each with its ranks in ring order
  // (Membership.hosts). Empty: not known (a member named no host).
  std::vector<std::vector<int>> hosts;
  size_t chunk_bytes = size_t{1} << 20;
  absl::Duration default_timeout = kDefaultOpTimeout;
  // Largest buffer one operation may carry (RESOURCE_EXHAUSTED above it).
  uint64_t max_op_bytes = uint64_t{16} << 30;
  // Up to this world size, fingerprints go to every rank at once (one hop
  // instead of G-1), and AUTO all-reduces of at most eager_bytes run
  // recursive doubling (the fingerprints riding on its frames); on larger
  // worlds AUTO all-reduces of at most eager_bytes run the tree.
  int all_to_all_max_world = 16;
  size_t eager_bytes = 64 << 10;
  // On a ring without usable hosts (no two-level) of at most
  // all_to_all_max_world ranks, AUTO all-reduces above eager_bytes and up to
  // this size run recursive doubling too: log2 G steps of the whole buffer
  // cost less than the ring's 2(G-1) steps of 1/G of it there
  // (docs/performance.md: G = 2-8, 128-256 KiB, TCP and same-host), except
  // on two ranks on one host (ResolveAlgorithm: the ring from eager_bytes).
  size_t doubling_bytes = 256 << 10;
  // Above that, and up to this size, AUTO all-reduces on such a ring of 4
  // or 8 ranks run halving-doubling (its 2 log2 G steps against the ring's
  // 2(G-1), the same bytes; measured faster from 512 KiB to 2 MiB over
  // TCP, and at 4 MiB on 8 ranks, the ring faster at 16 MiB on 8:
  // docs/performance.md). Elsewhere the ring.
  size_t halving_bytes = 4 << 20;
  // The job's link model (Membership.link_model), the same on every rank:
  // set, AUTO all-reduces, reduce-scatters, all-gathers and broadcasts run the
  // algorithm it predicts fastest among those that may run here
  // (ResolveAlgorithm); unset, the rules above.
  std::optional<LinkModel> link_model;
  // FOR TESTS ONLY: sleeps this long per received data chunk while reducing
  // it, to make this rank a straggler on purpose (worker flag
  // --test_reduce_delay).
  absl::Duration test_reduce_delay = absl::ZeroDuration();
  // Sequence number of the first operation. Rings of later generations
  // continue the numbering of the ring they replace, so that every rank
  // numbers the same call the same way across membership changes. 0: this
  // rank is new in a running ring and adopts the number of the first
  // operation its peers start.
  uint64_t first_op_seq = 1;
};

// A failed operation whose status carries this payload failed before it
// modified the caller's buffer or sent any of its data (the ranks were
// still comparing fingerprints). No rank can have completed it (each needs
// this rank's data), so it may be run again on the next generation's ring.
// The payload is the operation's sequence number.
inline constexpr char kUntouchedPayload[] = "halka.dev/untouched-op-seq";

struct OpResult {
  uint64_t op_seq = 0;
  std::string algorithm;  // "ring"
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  absl::Duration elapsed;
  uint64_t generation = 0;
  int rank = 0;
  int world_size = 1;
  int peer = -1;  // Send: the rank it went to; Recv: the rank it came from
  // What the job's link model (CommConfig::link_model) predicted for the
  // algorithm that ran, in seconds; 0: no model, or no prediction for it.
  double model_seconds = 0;
};

// The progress ledger: what the current operation is doing right now.
struct Progress {
  bool busy = false;
  std::string op;  // fingerprint text
  Phase phase = Phase::kFingerprint;
  int step = 0;
  int chunk = 0;
  int chunks = 0;
  int awaited_rank = -1;
  absl::Time waiting_since = absl::InfinitePast();
};

}  // namespace halka

#endif  // HALKA_CORE_COMM_TYPES_H_
