// The probe of a worker's ring links (halka-rendezvous --link_model=probe,
// Membership.probe_links): what one message costs on each of this rank's
// two ring edges, on the job's own data path (shared memory, the wire or
// the gRPC stream, whichever the link negotiated), as the job's link
// model wants it: alpha, the time of a message of a few bytes, and B, the
// rate of a large one.
//
// Each edge is probed as a group of its two ranks (Ring::Group, tag
// kLinkProbeTag) with numbering of its own, so a probe takes no number of
// the caller's calls and may run beside them. Per edge: 2 warm-up
// all-reduces, then `small_reps` of 8 bytes and `big_reps` of `big_bytes`
// (recursive doubling: one swap each way, its fingerprint riding on the
// data); alpha is the median small one, and B = big_bytes / (median big
// - alpha). An edge is `local` where both ends are on one host
// (Ring::hosts), `net` otherwise (hosts not known included); each level's
// value is the median over this rank's edges of it.
//
// The edges are probed in rounds (PlanProbeRounds), every rank passing
// each round with a barrier of all ranks (a group of every rank, same
// tag), so that no two edges that share a rank, or a host's NIC (two net
// edges next to each other in the ring), are probed at once: a probe that
// shares a link with another measures half its rate and the other's
// queue as alpha.
#ifndef HALKA_WORKER_LINK_PROBE_H_
#define HALKA_WORKER_LINK_PROBE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/time/time.h"
#include "halka/v1/common.pb.h"
#include "worker/ring_book.h"

namespace halka {

// The probe groups' tag (OpSpec.group_tag space; no user group of the
// same two ranks takes it in practice: a caller's tags are small).
inline constexpr uint64_t kLinkProbeTag = 0x686c6b2d70726f62ULL;

struct LinkProbeOptions {
  int small_reps = 15;
  int big_reps = 5;
  size_t big_bytes = size_t{1} << 20;
  // Each all-reduce's deadline (a peer that does not take part fails the
  // edge's probe within it; a link too slow to carry big_bytes within it,
  // under about 1 Mbit/s, is not measured), and each barrier's (the
  // round's other edges run meanwhile).
  absl::Duration timeout = absl::Seconds(10);
  absl::Duration barrier_timeout = absl::Seconds(30);
};

// One ring edge, between ranks a and b (a before b in the ring), and the
// round it is probed in: 0 and 1 the local edges by the parity of their
// place in the ring, 2 and 3 the net edges by the parity of their place
// among the net edges, 4 and 5 the last local or net edge of an odd cycle
// (it meets the first).
struct ProbeEdge {
  int a = -1;
  int b = -1;
  bool local = false;
  int round = 0;
};
inline constexpr int kProbeRounds = 6;
// The edges of the ring `order` (ranks in ring order) on `hosts`, each
// once (two ranks: one edge), with their rounds.
std::vector<ProbeEdge> PlanProbeRounds(
    const std::vector<int>& order, const std::vector<std::vector<int>>& hosts);

// Probes `ring`'s edges of this rank. Never fails as a call: a probe that
// measured no edge says why in LinkProbe.error (a world of 1 measures
// none and says so). `cancelled` (may be empty) is asked before each
// round and edge: true stops the probe there (the generation moved on,
// the worker stops), with what it measured so far.
v1::LinkProbe ProbeRingLinks(Ring& ring, const LinkProbeOptions& options = {},
                             const std::function<bool()>& cancelled = {});

// The level of the edge between ranks a and b on `hosts` (Ring::hosts):
// true for local (both on one host).
bool SameHost(const std::vector<std::vector<int>>& hosts, int a, int b);

}  // namespace halka

#endif  // HALKA_WORKER_LINK_PROBE_H_
