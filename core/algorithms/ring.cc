// Ring all-reduce, and its two halves as reduce-scatter and all-gather,
// pipelined by chunk.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/algorithms/algorithms.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"

namespace halka {

namespace {

// The segments and chunks of one ring operation, planned as for ring
// position `plan_position`: this rank finishes reducing the segment of
// position plan_position+1 and starts the all-gather with it. Steps count
// in positions; a step's segment is the rank at that position
// (RingPath::rank_at), so that segment r is rank r's slice in any order.
struct RingPlan {
  RingPlan(OpContext& op, int plan_position)
      : g(op.world()),
        r(plan_position),
        es(DTypeSize(op.fp().dtype)),
        succ(op.succ()),
        pred(op.pred()),
        path(op.path()) {
    const size_t chunk_elems =
        std::max<size_t>(1, op.config().chunk_bytes / es);
    const std::vector<Range> segments = PlanSegments(op.fp().count, g);
    chunks.resize(static_cast<size_t>(g));
    for (int i = 0; i < g; ++i) {
      chunks[static_cast<size_t>(i)] =
          PlanChunks(segments[static_cast<size_t>(i)], chunk_elems);
    }
  }
  // Step t of the 2(G-1): its phase, its number within the phase, the
  // segment it sends and the one it receives.
  Phase phase_of(int t) const {
    return t < g - 1 ? Phase::kReduceScatter : Phase::kAllGather;
  }
  int step_in_phase(int t) const { return t < g - 1 ? t : t - (g - 1); }
  int send_seg(int t) const {
    return path.rank_at(t < g - 1 ? RsSendSegment(r, g, t)
                                  : AgSendSegment(r, g, t - (g - 1)));
  }
  int recv_seg(int t) const {
    return path.rank_at(t < g - 1 ? RsRecvSegment(r, g, t)
                                  : AgRecvSegment(r, g, t - (g - 1)));
  }
  const std::vector<Range>& chunks_of(int seg) const {
    return chunks[static_cast<size_t>(seg)];
  }

  const int g;
  const int r;
  const size_t es;
  const int succ;
  const int pred;
  const RingPath& path;
  std::vector<std::vector<Range>> chunks;
};

absl::Status SendChunk(OpContext& op, const RingPlan& plan, int t, int seg,
                       const Range& c) {
  absl::StatusOr<const uint8_t*> p = op.buffer().HostView(c.offset, c.count);
  if (!p.ok()) return p.status();
  return op.Send(plan.succ,
                 op.ChunkMeta(plan.phase_of(t), plan.step_in_phase(t), seg, c),
                 *p, c.count * plan.es, seg);
}

// Step `first` sends this rank's own data, segment by chunk.
absl::Status SendFirst(OpContext& op, const RingPlan& plan, int first,
                       bool ledger) {
  const int seg = plan.send_seg(first);
  const auto& cs = plan.chunks_of(seg);
  if (ledger) {
    op.SetLedger(plan.phase_of(first), plan.step_in_phase(first), 0,
                 static_cast<int>(cs.size()), -1);
  }
  for (const Range& c : cs) {
    HALKA_RETURN_IF_ERROR(SendChunk(op, plan, first, seg, c));
  }
  return absl::OkStatus();
}

// Posts the receives of all-gather steps [t, end) in order while the wire
// holds nothing of a step's segment: every send of it left in the
// reduce-scatter, and this rank does not touch it again until its chunks
// arrive. Returns the first step not posted.
int PostRecvs(OpContext& op, const RingPlan& plan, int t, int end) {
  for (; t < end; ++t) {
    const int seg = plan.recv_seg(t);
    if (!op.SegmentReleased(seg)) break;
    for (const Range& c : plan.chunks_of(seg)) {
      op.PostRecv(plan.pred, op.ChunkMeta(Phase::kAllGather,
                                          plan.step_in_phase(t), seg, c));
    }
  }
  return t;
}

// Ring steps [first, end) of the 2(G-1) steps of an all-reduce (0..G-2
// reduce-scatter, G-1..2G-3 all-gather), pipelined by chunk: step t sends
// the segment received (and reduced) at step t-1, so a chunk moves on as
// soon as it is ready; step `first` sends this rank's own data (unless it
// already left while the fingerprints were in flight).
absl::Status RingSteps(OpContext& op, int first, int end, int plan_position) {
  const Fingerprint& fp = op.fp();
  if (op.world() == 1 || fp.count == 0 || first >= end) {
    return absl::OkStatus();
  }
  const RingPlan plan(op, plan_position);
  const int g = plan.g;
  OpBuffer& buf = op.buffer();
  if (!op.first_step_sent()) {
    HALKA_RETURN_IF_ERROR(SendFirst(op, plan, first, /*ledger=*/true));
  }
  absl::Duration reduce_time;
  int offered = g - 1;  // the first all-gather step not offered yet
  for (int t = first; t < end; ++t) {
    const Phase phase = plan.phase_of(t);
    const int step = plan.step_in_phase(t);
    const int seg = plan.recv_seg(t);
    const bool reduce = phase == Phase::kReduceScatter;
    const bool last_rs = t == g - 2;
    const auto& cs = plan.chunks_of(seg);
    if (!reduce && !op.WaitForReleases(seg, op.deadline())) {
      // Never overwrite memory the wire may still be reading.
      return absl::DeadlineExceededError(absl::StrCat(
          op.Where(), ": deadline exceeded waiting for ", op.Who(plan.succ),
          " to take segment ", seg, " before all-gather step ", step));
    }
    if (!reduce) {
      // The all-gather's chunks only move into place: where the link can,
      // its reader puts them there itself.
      offered = PostRecvs(op, plan, std::max(offered, t), end);
    }
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      const Range& c = cs[ci];
      op.SetLedger(phase, step, static_cast<int>(ci),
                   static_cast<int>(cs.size()), plan.pred);
      HALKA_ASSIGN_OR_RETURN(
          InFrame in,
          op.AwaitData(plan.pred, op.ChunkMeta(phase, step, seg, c)));
      const absl::Time t0 = absl::Now();
      HALKA_RETURN_IF_ERROR(buf.Apply(reduce, c.offset, c.count, in));
      if (last_rs && fp.op == ReduceOp::kAvg) {
        // The owner divides once, before the all-gather, so every rank
        // receives the same bits.
        HALKA_RETURN_IF_ERROR(buf.FinalizeAvg(c.offset, c.count, g));
      }
      reduce_time += op.RecordReduce(plan.pred, absl::Now() - t0);
      if (t + 1 < end) {
        HALKA_RETURN_IF_ERROR(SendChunk(op, plan, t + 1, seg, c));
      }
    }
  }
  op.RecordReduceTotal(reduce_time);
  return absl::OkStatus();
}

// The ring position whose all-reduce plan an operation follows (see below).
int PlanPosition(const OpContext& op) {
  return op.fp().kind == OpKind::kAllReduce
             ? op.position()
             : Mod(op.position() - 1, op.world());
}

}  // namespace

absl::Status RingAllReduce(OpContext& op) {
  return RingSteps(op, 0, 2 * (op.world() - 1), op.position());
}

// The two halves plan segments as the rank before this one in the ring
// (position p-1) would in an all-reduce, so that rank r owns segment r:
// the all-reduce's position p-1 finishes the segment of position p, r's.
absl::Status RingReduceScatter(OpContext& op) {
  return RingSteps(op, 0, op.world() - 1, PlanPosition(op));
}

bool RingCanSendEarly(const OpContext& op) {
  const OpKind kind = op.fp().kind;
  const bool ring_kind =
      (kind == OpKind::kAllReduce && op.algorithm() == Algorithm::kRing) ||
      kind == OpKind::kReduceScatter;
  return ring_kind && op.all_to_all() && op.world() > 1 && op.fp().count > 0;
}

absl::Status RingSendFirstStep(OpContext& op) {
  const RingPlan plan(op, PlanPosition(op));
  // The ledger stays in the fingerprint phase: this send happens while the
  // fingerprints are compared, and the wait that follows is theirs.
  HALKA_RETURN_IF_ERROR(SendFirst(op, plan, 0, /*ledger=*/false));
  op.set_first_step_sent();
  return absl::OkStatus();
}

absl::Status RingAllGather(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  const size_t slice = static_cast<size_t>(op.fp().count) / static_cast<size_t>(g);
  const int from = op.input_slice();
  if (slice > 0 && from != r) {
    // This rank's contribution waits in slice `from`: it goes to slice r
    // before the ring moves it (the slices are disjoint).
    HALKA_ASSIGN_OR_RETURN(
        const uint8_t* in,
        op.buffer().HostView(static_cast<size_t>(from) * slice, slice));
    HALKA_RETURN_IF_ERROR(
        op.buffer().WriteBack(in, static_cast<size_t>(r) * slice, slice));
  }
  return RingSteps(op, g - 1, 2 * (g - 1), Mod(op.position() - 1, g));
}

}  // namespace halka
