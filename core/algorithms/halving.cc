// Halving-doubling all-reduce (Rabenseifner's): a reduce-scatter by
// recursive halving, then an all-gather by recursive doubling, over p
// blocks of the buffer (p the largest power of two <= G). Each rank sends
// 2(p-1)/p of the buffer, as the ring's 2(G-1)/G, in 2 log2 p steps instead
// of 2(G-1).
//
// Round k of the reduce-scatter pairs virtual rank v with v ^ 2^k (nearest
// partners first: on the ring's path a host's ranks are adjacent, so the
// largest halves move inside hosts and only the smallest cross them). Both
// hold the same window of blocks; v keeps the lower half where bit k of v
// is 0, else the upper, sends the other half and reduces the partner's copy
// of the half it keeps into its buffer. After log2 p rounds v holds one
// block, reduced over every rank (AVG divided there, once); the all-gather
// retraces the rounds backwards, each partner sending the window it holds.
// Every element is reduced by one rank only and copied everywhere else: the
// same bits on every rank.
//
// The ranks beyond p fold in first (their whole buffer into their partner,
// reduced there) and take the whole result back at the end (doubling_plan.h).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "core/algorithms/algorithms.h"
#include "core/algorithms/doubling_plan.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"

namespace halka {
namespace {

// Whether a rank's first send reads only its own buffer as the caller left
// it: a rank beyond the power of two sends all of it to its partner first,
// and a rank that takes no fold-in gives half of it in round 0. A rank that
// takes a fold-in reduces it before round 0: nothing of its leaves early.
bool FirstSendIsOwnInput(const DoublingPlan& d) {
  return d.vrank < 0 || d.folds < 0;
}

class HalvingDoubling {
 public:
  explicit HalvingDoubling(OpContext& op)
      : op_(op),
        d_(PlanFor(op.world(), op.position())),
        es_(DTypeSize(op.fp().dtype)),
        chunk_elems_(std::max<size_t>(1, op.config().chunk_bytes / es_)),
        blocks_(PlanSegments(static_cast<size_t>(op.fp().count), d_.p)),
        unit_(SlackUnit(op.timeout())) {}

  // That first send, while the fingerprints are compared: the ledger stays
  // in the fingerprint phase (the wait that follows is theirs).
  absl::Status SendFirst() {
    Prepare();
    if (d_.vrank < 0) {
      return SendWindow(RankAtPosition(d_.folds), Phase::kReduceScatter, 0,
                        kFoldSeg, Whole(), /*ledger=*/false);
    }
    return SendWindow(Partner(0), Phase::kReduceScatter, 1, RsSeg(0),
                      RoundZeroGive(), /*ledger=*/false);
  }

  absl::Status Run() {
    const bool sent_first = op_.first_step_sent();
    if (!sent_first) Prepare();
    if (d_.vrank < 0) return FoldInAndOut(sent_first);
    absl::Duration reduce_time;
    if (d_.folds >= 0) {
      // Step 0: the whole buffer of the rank that folds into this one.
      HALKA_RETURN_IF_ERROR(Receive(RankAtPosition(d_.folds),
                                    Phase::kReduceScatter, 0, kFoldSeg,
                                    Whole(), /*reduce=*/true, 0, &reduce_time));
    }
    int lo = 0;
    int hi = d_.p;
    for (int k = 0; k < d_.rounds; ++k) {
      const int mid = (lo + hi) / 2;
      const bool keep_low = ((d_.vrank >> k) & 1) == 0;
      const Window keep = keep_low ? Window{lo, mid} : Window{mid, hi};
      const Window give = keep_low ? Window{mid, hi} : Window{lo, mid};
      const int partner = Partner(k);
      if (k > 0 || !sent_first) {
        HALKA_RETURN_IF_ERROR(SendWindow(partner, Phase::kReduceScatter, k + 1,
                                         RsSeg(k), give));
      }
      HALKA_RETURN_IF_ERROR(Receive(partner, Phase::kReduceScatter, k + 1,
                                    RsSeg(k), keep, /*reduce=*/true, 1 + k,
                                    &reduce_time));
      lo = keep.lo;
      hi = keep.hi;
    }
    if (op_.fp().op == ReduceOp::kAvg) {
      // The owner divides once, before the all-gather: every rank receives
      // the same bits.
      const Range own = RangeOf(Window{lo, hi});
      if (own.count > 0) {
        HALKA_RETURN_IF_ERROR(
            op_.buffer().FinalizeAvg(own.offset, own.count, op_.world()));
      }
    }
    op_.RecordReduceTotal(reduce_time);
    for (int j = 0; j < d_.rounds; ++j) {
      const int k = d_.rounds - 1 - j;
      const int width = hi - lo;
      const bool low = ((d_.vrank >> k) & 1) == 0;
      const Window theirs = low ? Window{hi, hi + width} : Window{lo - width, lo};
      const int partner = Partner(k);
      // This rank sent that window in the reduce-scatter's round k: the
      // wire must have let go of it before it is written.
      HALKA_RETURN_IF_ERROR(
          AwaitReleased(RsSeg(k), partner, Phase::kAllGather, j));
      PostRecvs(partner, j, AgSeg(k), theirs);
      HALKA_RETURN_IF_ERROR(SendWindow(partner, Phase::kAllGather, j, AgSeg(k),
                                       Window{lo, hi}));
      HALKA_RETURN_IF_ERROR(Receive(partner, Phase::kAllGather, j, AgSeg(k),
                                    theirs, /*reduce=*/false,
                                    1 + d_.rounds + j, nullptr));
      lo = std::min(lo, theirs.lo);
      hi = std::max(hi, theirs.hi);
    }
    if (d_.folds >= 0) {
      HALKA_RETURN_IF_ERROR(SendWindow(RankAtPosition(d_.folds),
                                       Phase::kAllGather, d_.rounds, BackSeg(),
                                       Whole()));
    }
    op_.set_wait_slack(absl::ZeroDuration());
    return absl::OkStatus();
  }

 private:
  static constexpr int kFoldSeg = 0;
  // Blocks [lo, hi): one contiguous range of the buffer.
  struct Window {
    int lo;
    int hi;
  };

  // Segments: 0 the fold-in, 1 + k the reduce-scatter's round k,
  // 1 + rounds + k the all-gather's round k, 1 + 2 rounds the result back
  // to a rank that folded in; and the partners this rank hears from.
  void Prepare() {
    op_.TrackSegments(static_cast<size_t>(2 + 2 * d_.rounds));
    if (d_.folds >= 0) op_.Watch(RankAtPosition(d_.folds));
    for (int k = 0; k < d_.rounds && d_.vrank >= 0; ++k) op_.Watch(Partner(k));
  }
  // What a rank that took no fold-in gives in round 0: the half of the
  // whole buffer it does not keep (as the loop in Run cuts it).
  Window RoundZeroGive() const {
    const int mid = d_.p / 2;
    return (d_.vrank & 1) == 0 ? Window{mid, d_.p} : Window{0, mid};
  }

  int RsSeg(int k) const { return 1 + k; }
  int AgSeg(int k) const { return 1 + d_.rounds + k; }
  int BackSeg() const { return 1 + 2 * d_.rounds; }
  Window Whole() const { return Window{0, d_.p}; }
  int RankAtPosition(int pos) const { return op_.path().rank_at(pos); }
  int Partner(int k) const {
    return RankAtPosition(RealRank(d_, d_.vrank ^ (1 << k)));
  }
  Range RangeOf(Window w) const {
    const Range& first = blocks_[static_cast<size_t>(w.lo)];
    const Range& last = blocks_[static_cast<size_t>(w.hi - 1)];
    return Range{first.offset, last.offset + last.count - first.offset};
  }
  // A window's chunks: each block's, in order, so that both sides of a
  // pair cut a window alike whichever halves it came from.
  std::vector<Range> ChunksOf(Window w) const {
    std::vector<Range> out;
    for (int b = w.lo; b < w.hi; ++b) {
      for (const Range& c :
           PlanChunks(blocks_[static_cast<size_t>(b)], chunk_elems_)) {
        out.push_back(c);
      }
    }
    return out;
  }

  absl::Status SendWindow(int to, Phase phase, int step, int seg, Window w,
                          bool ledger = true) {
    const std::vector<Range> cs = ChunksOf(w);
    if (ledger) op_.SetLedger(phase, step, 0, static_cast<int>(cs.size()), -1);
    for (const Range& c : cs) {
      HALKA_ASSIGN_OR_RETURN(const uint8_t* p,
                             op_.buffer().HostView(c.offset, c.count));
      HALKA_RETURN_IF_ERROR(op_.Send(to, op_.ChunkMeta(phase, step, seg, c), p,
                                     c.count * es_, seg));
    }
    return absl::OkStatus();
  }

  // Lets the link write the all-gather's chunks of `w` from `from` straight
  // into place.
  void PostRecvs(int from, int step, int seg, Window w) {
    for (const Range& c : ChunksOf(w)) {
      op_.PostRecv(from, op_.ChunkMeta(Phase::kAllGather, step, seg, c));
    }
  }

  // Takes `from`'s chunks of `w`, reducing them into the buffer or copying
  // them there. `order`: the wait's place in the operation, for its slack.
  absl::Status Receive(int from, Phase phase, int step, int seg, Window w,
                       bool reduce, int order, absl::Duration* reduce_time) {
    const std::vector<Range> cs = ChunksOf(w);
    op_.set_wait_slack(unit_ * order);
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      const Range& c = cs[ci];
      op_.SetLedger(phase, step, static_cast<int>(ci),
                    static_cast<int>(cs.size()), from);
      HALKA_ASSIGN_OR_RETURN(
          InFrame in, op_.AwaitData(from, op_.ChunkMeta(phase, step, seg, c)));
      const absl::Time t0 = halka::Now();
      HALKA_RETURN_IF_ERROR(op_.buffer().Apply(reduce, c.offset, c.count, in));
      if (reduce_time != nullptr) {
        *reduce_time += op_.RecordReduce(from, halka::Now() - t0);
      }
    }
    return absl::OkStatus();
  }

  // Waits until the wire let go of what this rank sent `peer` in segment
  // `seg`, before (phase, step) writes there: never overwrite memory the
  // wire may still be reading.
  absl::Status AwaitReleased(int seg, int peer, Phase phase, int step) {
    op_.SetLedger(phase, step, 0, 1, peer);
    if (op_.WaitForReleases(seg, op_.release_deadline())) {
      return absl::OkStatus();
    }
    return absl::DeadlineExceededError(absl::StrCat(
        op_.Where(), ": deadline exceeded waiting for ", op_.Who(peer),
        " to take segment ", seg, ", which this rank sent it, before ",
        PhaseName(phase), " step ", step, " writes there"));
  }

  // A rank beyond the power of two: its whole buffer to its partner (unless
  // it left early: `sent`), the whole result back.
  absl::Status FoldInAndOut(bool sent) {
    const int partner = RankAtPosition(d_.folds);
    if (!sent) {
      HALKA_RETURN_IF_ERROR(
          SendWindow(partner, Phase::kReduceScatter, 0, kFoldSeg, Whole()));
    }
    HALKA_RETURN_IF_ERROR(
        AwaitReleased(kFoldSeg, partner, Phase::kAllGather, d_.rounds));
    PostRecvs(partner, d_.rounds, BackSeg(), Whole());
    HALKA_RETURN_IF_ERROR(Receive(partner, Phase::kAllGather, d_.rounds,
                                  BackSeg(), Whole(), /*reduce=*/false,
                                  1 + 2 * d_.rounds, nullptr));
    op_.set_wait_slack(absl::ZeroDuration());
    return absl::OkStatus();
  }

  OpContext& op_;
  const DoublingPlan d_;
  const size_t es_;
  const size_t chunk_elems_;
  const std::vector<Range> blocks_;  // block b: virtual rank bitrev(b)'s
  const absl::Duration unit_;
};

}  // namespace

absl::Status HalvingDoublingAllReduce(OpContext& op) {
  if (op.world() == 1 || op.fp().count == 0) return absl::OkStatus();
  return HalvingDoubling(op).Run();
}

bool HalvingCanSendEarly(const OpContext& op) {
  return op.fp().kind == OpKind::kAllReduce &&
         op.algorithm() == Algorithm::kHalvingDoubling && op.all_to_all() &&
         op.world() > 1 && op.fp().count > 0 &&
         FirstSendIsOwnInput(PlanFor(op.world(), op.position()));
}

absl::Status HalvingSendFirstStep(OpContext& op) {
  HALKA_RETURN_IF_ERROR(HalvingDoubling(op).SendFirst());
  op.set_first_step_sent();
  return absl::OkStatus();
}

}  // namespace halka
