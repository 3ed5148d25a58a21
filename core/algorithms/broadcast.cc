// Chain broadcast. (The barrier has no file: its fingerprint pass is the
// whole operation.)
#include <algorithm>
#include <vector>

#include "core/algorithms/algorithms.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"

namespace halka {

absl::Status ChainBroadcast(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  const Fingerprint& fp = op.fp();
  const int root = fp.root;
  if (g == 1 || fp.count == 0) return absl::OkStatus();
  const size_t es = DTypeSize(fp.dtype);
  const int succ = op.succ();
  const int pred = op.pred();
  OpBuffer& buf = op.buffer();
  const size_t chunk_elems =
      std::max<size_t>(1, op.config().chunk_bytes / es);
  const std::vector<Range> cs =
      PlanChunks(Range{0, static_cast<size_t>(fp.count)}, chunk_elems);
  // Data flows from the root around the ring (its successor, theirs, ...,
  // its predecessor); step = distance from the root in ring positions.
  const int distance = Mod(op.position() - op.path().position(root), g);
  const bool forward = succ != root;
  if (r != root) {
    // A chunk only moves into place, and nothing touches its range before
    // it arrives: its receive is posted (where the link can, its reader
    // puts it there itself).
    for (const Range& c : cs) {
      op.PostRecv(pred, op.ChunkMeta(Phase::kBroadcast, distance - 1, 0, c));
    }
  }
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    const Range& c = cs[ci];
    op.SetLedger(Phase::kBroadcast, distance, static_cast<int>(ci),
                 static_cast<int>(cs.size()), r == root ? -1 : pred);
    if (r != root) {
      HALKA_ASSIGN_OR_RETURN(
          InFrame in,
          op.AwaitData(pred,
                       op.ChunkMeta(Phase::kBroadcast, distance - 1, 0, c)));
      HALKA_RETURN_IF_ERROR(
          buf.Apply(/*reduce=*/false, c.offset, c.count, in));
    }
    if (forward) {
      HALKA_ASSIGN_OR_RETURN(const uint8_t* p,
                             buf.HostView(c.offset, c.count));
      HALKA_RETURN_IF_ERROR(
          op.Send(succ, op.ChunkMeta(Phase::kBroadcast, distance, 0, c), p,
                  c.count * es, 0));
    }
  }
  return absl::OkStatus();
}

}  // namespace halka
