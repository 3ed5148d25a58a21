// Naive (all-to-all) all-reduce: one hop, for small buffers.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "core/algorithms/algorithms.h"
#include "core/payload.h"
#include "core/reduce.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"

namespace halka {

absl::Status NaiveAllReduce(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  const Fingerprint& fp = op.fp();
  const DType dt = fp.dtype;
  const size_t es = DTypeSize(dt);
  const size_t count = static_cast<size_t>(fp.count);
  if (g == 1 || count == 0) return absl::OkStatus();
  std::vector<InFrame>& kept = op.eager();
  const bool eager = !kept.empty();
  // This rank's own contribution, readable on the host for the whole
  // operation (it is only overwritten at the end).
  HALKA_ASSIGN_OR_RETURN(const uint8_t* own, op.buffer().HostView(0, count));
  const std::vector<Range> cs =
      eager ? std::vector<Range>{Range{0, count}}
            : PlanChunks(Range{0, count},
                         std::max<size_t>(1, op.config().chunk_bytes / es));
  if (!eager) {
    for (const Range& c : cs) {
      const FrameMeta m = op.ChunkMeta(Phase::kNaive, 0, 0, c);
      for (int i = 1; i < g; ++i) {
        HALKA_RETURN_IF_ERROR(op.Send(op.path().rank_at(op.position() + i), m,
                                      own + c.offset * es,
                                      c.count * es, -1));
      }
    }
  }
  // Reduce all G copies in rank order into scratch, so that every rank
  // computes the same bits; the own buffer is still being sent from.
  std::vector<uint8_t> scratch(count * es);
  absl::Duration reduce_time;
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    const Range& c = cs[ci];
    uint8_t* dst = scratch.data() + c.offset * es;
    for (int k = 0; k < g; ++k) {
      const bool reduce = k > 0;
      op.SetLedger(Phase::kNaive, 0, static_cast<int>(ci),
                   static_cast<int>(cs.size()), k == r ? -1 : k);
      if (k == r) {
        const absl::Time t0 = halka::Now();
        if (reduce) {
          ReduceInto(dt, fp.op, dst, own + c.offset * es, c.count);
        } else {
          std::memcpy(dst, own + c.offset * es, c.count * es);
        }
        reduce_time += halka::Now() - t0;
        continue;
      }
      InFrame in;
      if (eager) {
        in = std::move(kept[static_cast<size_t>(k)]);
      } else {
        HALKA_ASSIGN_OR_RETURN(
            in, op.AwaitData(k, op.ChunkMeta(Phase::kNaive, 0, 0, c)));
      }
      const absl::Time t0 = halka::Now();
      ApplyPayload(dt, fp.op, reduce, dst, in);
      reduce_time += op.RecordReduce(k, halka::Now() - t0);
    }
  }
  if (fp.op == ReduceOp::kAvg) FinalizeAvg(dt, scratch.data(), count, g);
  if (!op.WaitForReleases(-1, op.deadline())) {
    return absl::DeadlineExceededError(absl::StrCat(
        op.Where(), ": deadline exceeded before the peers took this rank's "
                    "buffer"));
  }
  HALKA_RETURN_IF_ERROR(op.buffer().WriteBack(scratch.data(), 0, count));
  op.RecordReduceTotal(reduce_time);
  return absl::OkStatus();
}

}  // namespace halka
