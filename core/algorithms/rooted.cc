// Reduce, gather and scatter to or from one root, and all-to-all: the
// collectives whose data goes straight between two ranks (one hop) instead
// of around the ring, so that no rank carries bytes meant for another.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "core/algorithms/algorithms.h"
#include "core/payload.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"

namespace halka {

namespace {

size_t ChunkElems(const OpContext& op) {
  return std::max<size_t>(1, op.config().chunk_bytes / DTypeSize(op.fp().dtype));
}

// The slice every rank owns in a buffer of world x slice elements.
size_t SliceOf(const OpContext& op) {
  return static_cast<size_t>(op.fp().count) / static_cast<size_t>(op.world());
}

// Ranks in ring order starting after this one: the order this rank sends
// in, so that at each moment the ranks send to different peers.
std::vector<int> OthersFromHere(const OpContext& op) {
  std::vector<int> out;
  for (int i = 1; i < op.world(); ++i) {
    out.push_back(op.path().rank_at(op.position() + i));
  }
  return out;
}

// Sends `from_range` of the buffer to `to` as the chunks of `at` (the
// range the receiver expects it in; same length), segment `segment`.
absl::Status SendRange(OpContext& op, int to, Phase phase, int step,
                       int segment, const Range& from_range,
                       const Range& at) {
  const size_t es = DTypeSize(op.fp().dtype);
  for (const Range& c : PlanChunks(at, ChunkElems(op))) {
    const size_t src = from_range.offset + (c.offset - at.offset);
    HALKA_ASSIGN_OR_RETURN(const uint8_t* p,
                           op.buffer().HostView(src, c.count));
    HALKA_RETURN_IF_ERROR(op.Send(to, op.ChunkMeta(phase, step, segment, c),
                                  p, c.count * es, segment));
  }
  return absl::OkStatus();
}

// Takes `range` of the buffer from `from` (segment `segment`), chunk by
// chunk, reducing into it or writing it in place.
absl::Status TakeRange(OpContext& op, int from, Phase phase, int step,
                       int segment, const Range& range, bool reduce,
                       absl::Duration* reduce_time) {
  const std::vector<Range> cs = PlanChunks(range, ChunkElems(op));
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    op.SetLedger(phase, step, static_cast<int>(ci),
                 static_cast<int>(cs.size()), from);
    HALKA_ASSIGN_OR_RETURN(
        InFrame in,
        op.AwaitData(from, op.ChunkMeta(phase, step, segment, cs[ci])));
    const absl::Time t0 = halka::Now();
    HALKA_RETURN_IF_ERROR(
        op.buffer().Apply(reduce, cs[ci].offset, cs[ci].count, in));
    *reduce_time += op.RecordReduce(from, halka::Now() - t0);
  }
  return absl::OkStatus();
}

// Posts the receives of `range` from `from` (landed in place where the
// link can).
void PostRange(OpContext& op, int from, Phase phase, int step, int segment,
               const Range& range) {
  for (const Range& c : PlanChunks(range, ChunkElems(op))) {
    op.PostRecv(from, op.ChunkMeta(phase, step, segment, c));
  }
}

absl::Status DeadlineBeforeRelease(OpContext& op, const std::string& what) {
  return absl::DeadlineExceededError(absl::StrCat(
      op.Where(), ": deadline exceeded before the wire let go of ", what));
}

}  // namespace

absl::Status RootedReduce(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  const int root = op.fp().root;
  const size_t count = static_cast<size_t>(op.fp().count);
  if (g == 1 || count == 0) return absl::OkStatus();
  absl::Duration reduce_time;
  if (op.algorithm() != Algorithm::kRing) {
    // Direct: every other rank's whole buffer goes to the root, which
    // reduces them into its own in rank order.
    const Range all{0, count};
    if (r != root) {
      op.Watch(root);
      op.SetLedger(Phase::kGather, 0, 0, 1, -1);
      return SendRange(op, root, Phase::kGather, 0, r, all, all);
    }
    for (int k = 0; k < g; ++k) {
      if (k == r) continue;
      op.Watch(k);
      HALKA_RETURN_IF_ERROR(TakeRange(op, k, Phase::kGather, 0, k, all,
                                      /*reduce=*/true, &reduce_time));
    }
    if (op.fp().op == ReduceOp::kAvg) {
      HALKA_RETURN_IF_ERROR(op.buffer().FinalizeAvg(0, count, g));
    }
    op.RecordReduceTotal(reduce_time);
    return absl::OkStatus();
  }
  // Ring: a reduce-scatter leaves rank k with the reduction of segment k
  // (AVG divided there); each sends it to the root. Every rank sends about
  // (G-1)/G of the buffer plus its segment, and the root takes (G-1)/G.
  HALKA_RETURN_IF_ERROR(RingReduceScatter(op));
  const std::vector<Range> segs = PlanSegments(count, g);
  if (r != root) {
    op.Watch(root);
    op.SetLedger(Phase::kGather, 0, 0, 1, -1);
    const Range& mine = segs[static_cast<size_t>(r)];
    return SendRange(op, root, Phase::kGather, 0, r, mine, mine);
  }
  for (int k = 0; k < g; ++k) {
    if (k == r) continue;
    op.Watch(k);
    // The reduce-scatter sent partial sums of segment k from here.
    if (!op.WaitForReleases(k, op.deadline())) {
      return DeadlineBeforeRelease(op, absl::StrCat("segment ", k));
    }
    PostRange(op, k, Phase::kGather, 0, k, segs[static_cast<size_t>(k)]);
  }
  for (int k = 0; k < g; ++k) {
    if (k == r) continue;
    HALKA_RETURN_IF_ERROR(TakeRange(op, k, Phase::kGather, 0, k,
                                    segs[static_cast<size_t>(k)],
                                    /*reduce=*/false, &reduce_time));
  }
  return absl::OkStatus();
}

absl::Status DirectGather(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  const int root = op.fp().root;
  const size_t slice = SliceOf(op);
  if (g == 1 || slice == 0) {
    if (slice > 0 && op.input_slice() != r) {
      HALKA_ASSIGN_OR_RETURN(
          const uint8_t* in,
          op.buffer().HostView(static_cast<size_t>(op.input_slice()) * slice,
                               slice));
      return op.buffer().WriteBack(in, static_cast<size_t>(r) * slice, slice);
    }
    return absl::OkStatus();
  }
  const Range own{static_cast<size_t>(op.input_slice()) * slice, slice};
  auto slot = [&](int k) {
    return Range{static_cast<size_t>(k) * slice, slice};
  };
  if (r != root) {
    op.Watch(root);
    op.SetLedger(Phase::kGather, 0, 0, 1, -1);
    return SendRange(op, root, Phase::kGather, 0, r, own, slot(r));
  }
  if (own.offset != slot(r).offset) {
    // The root's contribution moves to its slot before another rank's
    // data may land where it waits.
    HALKA_ASSIGN_OR_RETURN(const uint8_t* in,
                           op.buffer().HostView(own.offset, slice));
    HALKA_RETURN_IF_ERROR(
        op.buffer().WriteBack(in, slot(r).offset, slice));
  }
  for (int k = 0; k < g; ++k) {
    if (k == r) continue;
    op.Watch(k);
    PostRange(op, k, Phase::kGather, 0, k, slot(k));
  }
  absl::Duration unused;
  for (int k = 0; k < g; ++k) {
    if (k == r) continue;
    HALKA_RETURN_IF_ERROR(TakeRange(op, k, Phase::kGather, 0, k, slot(k),
                                    /*reduce=*/false, &unused));
  }
  return absl::OkStatus();
}

absl::Status DirectScatter(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  const int root = op.fp().root;
  const size_t slice = SliceOf(op);
  if (g == 1 || slice == 0) return absl::OkStatus();
  auto slot = [&](int k) {
    return Range{static_cast<size_t>(k) * slice, slice};
  };
  if (r == root) {
    for (int k : OthersFromHere(op)) {
      op.Watch(k);
      op.SetLedger(Phase::kScatter, 0, 0, 1, -1);
      HALKA_RETURN_IF_ERROR(
          SendRange(op, k, Phase::kScatter, 0, k, slot(k), slot(k)));
    }
    return absl::OkStatus();
  }
  op.Watch(root);
  PostRange(op, root, Phase::kScatter, 0, r, slot(r));
  absl::Duration unused;
  return TakeRange(op, root, Phase::kScatter, 0, r, slot(r),
                   /*reduce=*/false, &unused);
}

absl::Status PairwiseAllToAll(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  const size_t slice = SliceOf(op);
  if (g == 1 || slice == 0) return absl::OkStatus();
  const DType dt = op.fp().dtype;
  const size_t es = DTypeSize(dt);
  auto slot = [&](int k) {
    return Range{static_cast<size_t>(k) * slice, slice};
  };
  // Slice k goes to rank k, where it lands in slice r (the frames name
  // that place); what comes from rank k belongs in slice k, which this rank
  // may still be sending from: it waits in scratch until every send is
  // released.
  const std::vector<int> to = OthersFromHere(op);
  for (int k : to) {
    op.Watch(k);
    op.SetLedger(Phase::kAllToAll, 0, 0, 1, -1);
    HALKA_RETURN_IF_ERROR(
        SendRange(op, k, Phase::kAllToAll, 0, r, slot(k), slot(r)));
  }
  std::vector<uint8_t> scratch(static_cast<size_t>(g) * slice * es);
  // Receive in the reverse order of sending: rank k's first send is to the
  // rank after it, which is this rank when k is just before it.
  for (int i = 1; i < g; ++i) {
    const int k = op.path().rank_at(op.position() - i);
    // Frame offsets name where the piece lands here: slice k.
    const std::vector<Range> cs = PlanChunks(slot(k), ChunkElems(op));
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      op.SetLedger(Phase::kAllToAll, 0, static_cast<int>(ci),
                   static_cast<int>(cs.size()), k);
      HALKA_ASSIGN_OR_RETURN(
          InFrame in,
          op.AwaitData(k, op.ChunkMeta(Phase::kAllToAll, 0, k, cs[ci])));
      ApplyPayload(dt, op.fp().op, /*reduce=*/false,
                   scratch.data() + cs[ci].offset * es, in);
    }
  }
  if (!op.WaitForReleases(-1, op.deadline())) {
    return DeadlineBeforeRelease(op, "this rank's slices");
  }
  for (int k = 0; k < g; ++k) {
    if (k == r) continue;
    HALKA_RETURN_IF_ERROR(op.buffer().WriteBack(
        scratch.data() + static_cast<size_t>(k) * slice * es,
        static_cast<size_t>(k) * slice, slice));
  }
  return absl::OkStatus();
}

}  // namespace halka
