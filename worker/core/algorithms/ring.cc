// Ring all-reduce, and its two halves as reduce-scatter and all-gather,
// pipelined by chunk.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/core/algorithms/algorithms.h"
#include "worker/core/ring_plan.h"
#include "worker/core/status_macros.h"

namespace halka {

namespace {

// Ring steps [first, end) of the 2(G-1) steps of an all-reduce (0..G-2
// reduce-scatter, G-1..2G-3 all-gather), pipelined by chunk: step t sends
// the segment received (and reduced) at step t-1, so a chunk moves on as
// soon as it is ready; step `first` sends this rank's own data. Segments
// are planned as for rank `plan_rank`: rank r finishes reducing segment
// plan_rank+1 and starts the all-gather with it.
absl::Status RingSteps(OpContext& op, int first, int end, int plan_rank) {
  const int g = op.world();
  const int r = plan_rank;
  const Fingerprint& fp = op.fp();
  const size_t es = DTypeSize(fp.dtype);
  if (g == 1 || fp.count == 0 || first >= end) return absl::OkStatus();
  const int succ = Mod(op.rank() + 1, g);
  const int pred = Mod(op.rank() - 1, g);
  OpBuffer& buf = op.buffer();
  const size_t chunk_elems =
      std::max<size_t>(1, op.config().chunk_bytes / es);
  const std::vector<Range> segments = PlanSegments(fp.count, g);
  std::vector<std::vector<Range>> chunks(static_cast<size_t>(g));
  for (int i = 0; i < g; ++i) {
    chunks[static_cast<size_t>(i)] =
        PlanChunks(segments[static_cast<size_t>(i)], chunk_elems);
  }

  auto send_chunk = [&](Phase phase, int step, int seg,
                        const Range& c) -> absl::Status {
    absl::StatusOr<const uint8_t*> p = buf.HostView(c.offset, c.count);
    if (!p.ok()) return p.status();
    return op.Send(succ, op.ChunkMeta(phase, step, seg, c), *p, c.count * es,
                   seg);
  };

  auto phase_of = [g](int t) {
    return t < g - 1 ? Phase::kReduceScatter : Phase::kAllGather;
  };
  auto step_in_phase = [g](int t) { return t < g - 1 ? t : t - (g - 1); };
  auto send_seg = [g, r](int t) {
    return t < g - 1 ? RsSendSegment(r, g, t)
                     : AgSendSegment(r, g, t - (g - 1));
  };
  auto recv_seg = [g, r](int t) {
    return t < g - 1 ? RsRecvSegment(r, g, t)
                     : AgRecvSegment(r, g, t - (g - 1));
  };

  {
    const int seg = send_seg(first);
    const auto& cs = chunks[static_cast<size_t>(seg)];
    op.SetLedger(phase_of(first), step_in_phase(first), 0,
                 static_cast<int>(cs.size()), -1);
    for (const Range& c : cs) {
      HALKA_RETURN_IF_ERROR(
          send_chunk(phase_of(first), step_in_phase(first), seg, c));
    }
  }
  absl::Duration reduce_time;
  for (int t = first; t < end; ++t) {
    const Phase phase = phase_of(t);
    const int step = step_in_phase(t);
    const int seg = recv_seg(t);
    const bool reduce = phase == Phase::kReduceScatter;
    const bool last_rs = t == g - 2;
    const auto& cs = chunks[static_cast<size_t>(seg)];
    if (!reduce && !op.WaitForReleases(seg, op.deadline())) {
      // Never overwrite memory the wire may still be reading.
      return absl::DeadlineExceededError(absl::StrCat(
          op.Where(), ": deadline exceeded waiting for ", op.Who(succ),
          " to take segment ", seg, " before all-gather step ", step));
    }
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      const Range& c = cs[ci];
      op.SetLedger(phase, step, static_cast<int>(ci),
                   static_cast<int>(cs.size()), pred);
      HALKA_ASSIGN_OR_RETURN(
          InFrame in, op.AwaitData(pred, op.ChunkMeta(phase, step, seg, c)));
      const absl::Time t0 = absl::Now();
      HALKA_RETURN_IF_ERROR(buf.Apply(reduce, c.offset, c.count, in));
      if (last_rs && fp.op == ReduceOp::kAvg) {
        // The owner divides once, before the all-gather, so every rank
        // receives the same bits.
        HALKA_RETURN_IF_ERROR(buf.FinalizeAvg(c.offset, c.count, g));
      }
      reduce_time += op.RecordReduce(pred, absl::Now() - t0);
      if (t + 1 < end) {
        HALKA_RETURN_IF_ERROR(
            send_chunk(phase_of(t + 1), step_in_phase(t + 1), seg, c));
      }
    }
  }
  op.RecordReduceTotal(reduce_time);
  return absl::OkStatus();
}

}  // namespace

absl::Status RingAllReduce(OpContext& op) {
  return RingSteps(op, 0, 2 * (op.world() - 1), op.rank());
}

// The two halves plan segments as rank r-1 would in an all-reduce, so that
// rank r owns segment r: the all-reduce's rank r-1 finishes segment r.
absl::Status RingReduceScatter(OpContext& op) {
  return RingSteps(op, 0, op.world() - 1, Mod(op.rank() - 1, op.world()));
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
  return RingSteps(op, g - 1, 2 * (g - 1), Mod(r - 1, g));
}

}  // namespace halka
