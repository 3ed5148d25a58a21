// Recursive-doubling all-reduce for small buffers: floor(log2 G) rounds of
// whole-buffer swaps with one partner each (plus one round in and one out
// for the ranks beyond the largest power of two), and the fingerprints
// riding on every frame, so that the agreement costs no round of its own.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "core/algorithms/algorithms.h"
#include "core/algorithms/doubling_plan.h"
#include "core/payload.h"
#include "core/reduce.h"
#include "core/status_macros.h"

namespace halka {
namespace {

// The frame's step: 0 the fold-in, 1..rounds the swaps, rounds + 1 the
// result back to a rank that folded in.
constexpr int kFoldIn = 0;

// What every frame of this operation from `from` at `step` must be: the
// peer's fingerprint (the same call, run alike) with its partial result.
absl::Status CheckFrame(OpContext& op, int from, int step, size_t bytes,
                        const InFrame& in) {
  // A fingerprint of that rank is compared first: a rank that runs another
  // algorithm sends other steps, and that is what to name.
  if (in.meta.kind == FrameKind::kFingerprint && in.meta.origin_rank == from) {
    HALKA_RETURN_IF_ERROR(CheckFingerprintPair(op, from, in.meta.fingerprint));
  }
  if (in.meta.kind != FrameKind::kFingerprint || in.meta.origin_rank != from ||
      in.meta.step != step) {
    return absl::DataLossError(absl::StrCat(
        op.Where(), ": expected the fingerprint of ", op.Who(from),
        " at step ", step, ", got a frame of kind ",
        static_cast<int>(in.meta.kind), " from origin ", in.meta.origin_rank,
        " at step ", in.meta.step));
  }
  if (in.PayloadBytes() != bytes || in.meta.dtype != op.fp().dtype) {
    return absl::DataLossError(absl::StrCat(
        op.Where(), ": the partial result of ", op.Who(from), " has ",
        in.PayloadBytes(), " bytes, expected ", bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DoublingExchange(OpContext& op) {
  const int g = op.world();
  const int pos = op.position();
  const Fingerprint& fp = op.fp();
  const DType dt = fp.dtype;
  const size_t count = static_cast<size_t>(fp.count);
  const size_t bytes = count * DTypeSize(dt);
  if (g == 1) return absl::OkStatus();
  const DoublingPlan d = PlanFor(g, pos);
  auto rank_at = [&](int p) { return op.path().rank_at(p); };
  // A failure anywhere reaches every rank: each tells its partners, who
  // tell theirs (the rounds' pairs connect every rank).
  //
  // A rank that waits at step t waits on a partner that already sent its
  // frames of every step before t, so, should that partner be stuck, it is
  // stuck at a step before t: the wait nearest the cause (a rank that never
  // called, or is slow) has the lowest step. So a wait at step t ends t
  // slack units past the deadline: the one nearest the cause fails first,
  // and its ABORT, naming the cause, reaches the others before their own
  // deadlines (as long as the ranks called within a unit of each other).
  const absl::Duration unit = SlackUnit(op.timeout());
  if (d.folds >= 0) op.Watch(rank_at(d.folds));
  for (int k = 0; k < d.rounds && d.vrank >= 0; ++k) {
    op.Watch(rank_at(RealRank(d, d.vrank ^ (1 << k))));
  }
  // Two halves of send_scratch (which outlives the frames that point into
  // it): the partial result of the last round, sent from and never written
  // while a frame holds it, and the next one, made from it and the
  // partner's.
  std::vector<uint8_t>& scratch = op.send_scratch();
  // Every byte is written before it is read (the copy of the caller's
  // buffer, then each round's result): no zeroing (the scratch may be the
  // last operation's, lent again).
  scratch.resize(2 * bytes);
  uint8_t* half[2] = {scratch.data(), scratch.data() + bytes};
  int cur = 0;
  if (bytes > 0) {
    HALKA_ASSIGN_OR_RETURN(const uint8_t* own, op.buffer().HostView(0, count));
    std::memcpy(half[cur], own, bytes);
  }
  FrameMeta meta = op.FingerprintMeta();
  meta.count = fp.count;
  absl::Duration reduce_time;
  // Sends half[cur] to position `to` at `step` (segment cur: the half it
  // holds).
  auto send = [&](int to, int step) {
    FrameMeta m = meta;
    m.step = step;
    return op.Send(rank_at(to), m, half[cur], bytes, cur);
  };
  // Takes position at's partial result at `step` and makes the next one,
  // the lower position's first (lo op hi on both sides: the same bits).
  auto swap = [&](int at, int step, const std::string& what) -> absl::Status {
    const int from = rank_at(at);
    op.SetLedger(Phase::kFingerprint, step, 0, 1, from);
    op.set_wait_slack(unit * step);
    HALKA_ASSIGN_OR_RETURN(InFrame in, op.Await(from, what));
    HALKA_RETURN_IF_ERROR(CheckFrame(op, from, step, bytes, in));
    const int next = 1 - cur;
    // The next half last held what went out two rounds ago.
    if (!op.WaitForReleases(next, op.release_deadline())) {
      return absl::DeadlineExceededError(absl::StrCat(
          op.Where(), ": deadline exceeded before a link let go of this "
                      "rank's partial result"));
    }
    const absl::Time t0 = halka::Now();
    if (at > pos) {
      std::memcpy(half[next], half[cur], bytes);
      ApplyPayload(dt, fp.op, /*reduce=*/true, half[next], in);
    } else {
      ApplyPayload(dt, fp.op, /*reduce=*/false, half[next], in);
      ReduceInto(dt, fp.op, half[next], half[cur], count);
    }
    reduce_time += op.RecordReduce(from, halka::Now() - t0);
    cur = next;
    return absl::OkStatus();
  };
  if (d.vrank < 0) {
    // Beyond the power of two: fold in, take the result back.
    op.SetLedger(Phase::kFingerprint, kFoldIn, 0, 1, -1);
    HALKA_RETURN_IF_ERROR(send(d.folds, kFoldIn));
    const int from = rank_at(d.folds);
    // The partner's fingerprint alone first (see below).
    op.SetLedger(Phase::kFingerprint, kFoldIn, 0, 1, from);
    op.set_wait_slack(absl::ZeroDuration());
    HALKA_ASSIGN_OR_RETURN(InFrame hello, op.Await(from, "its fingerprint"));
    HALKA_RETURN_IF_ERROR(CheckFrame(op, from, kFoldIn, 0, hello));
    const int back = d.rounds + 1;
    op.SetLedger(Phase::kFingerprint, back, 0, 1, from);
    op.set_wait_slack(unit * back);
    HALKA_ASSIGN_OR_RETURN(InFrame in, op.Await(from, "the all-reduce's result"));
    HALKA_RETURN_IF_ERROR(CheckFrame(op, from, back, bytes, in));
    const int next = 1 - cur;
    ApplyPayload(dt, fp.op, /*reduce=*/false, half[next], in);
    cur = next;
  } else {
    if (d.folds >= 0) {
      // Its fingerprint alone to the rank that folds in: that rank hears of
      // this operation at once (a rank new in a running ring takes its
      // number from the first frame that comes; it would otherwise hear
      // nothing until the end), and checks the call before the result.
      FrameMeta hello = meta;
      hello.step = kFoldIn;
      hello.count = 0;
      op.SetLedger(Phase::kFingerprint, kFoldIn, 0, 1, -1);
      HALKA_RETURN_IF_ERROR(op.Send(rank_at(d.folds), hello, nullptr, 0, -1));
      HALKA_RETURN_IF_ERROR(swap(d.folds, kFoldIn, "its partial result"));
    }
    for (int k = 0; k < d.rounds; ++k) {
      const int partner = RealRank(d, d.vrank ^ (1 << k));
      op.SetLedger(Phase::kFingerprint, k + 1, 0, 1, -1);
      HALKA_RETURN_IF_ERROR(send(partner, k + 1));
      HALKA_RETURN_IF_ERROR(swap(partner, k + 1, "its partial result"));
    }
    if (d.folds >= 0) {
      op.SetLedger(Phase::kFingerprint, d.rounds + 1, 0, 1, -1);
      HALKA_RETURN_IF_ERROR(send(d.folds, d.rounds + 1));
    }
  }
  op.set_wait_slack(absl::ZeroDuration());
  op.RecordReduceTotal(reduce_time);
  // The result stays in the half that holds it; DoublingAllReduce writes
  // it back once the buffer is begun.
  op.set_result_half(cur);
  return absl::OkStatus();
}

absl::Status DoublingAllReduce(OpContext& op) {
  const Fingerprint& fp = op.fp();
  const size_t count = static_cast<size_t>(fp.count);
  const size_t bytes = count * DTypeSize(fp.dtype);
  if (op.world() == 1 || count == 0) return absl::OkStatus();
  uint8_t* result = op.send_scratch().data() +
                    static_cast<size_t>(op.result_half()) * bytes;
  if (fp.op == ReduceOp::kAvg) {
    // A frame of the last round may still hold the result (the one sent
    // back to a rank that folded in): it must not change until let go.
    // (Writing it back only reads it.)
    if (!op.WaitForReleases(-1, op.release_deadline())) {
      return absl::DeadlineExceededError(absl::StrCat(
          op.Where(), ": deadline exceeded before the peers took this "
                      "rank's result"));
    }
    FinalizeAvg(fp.dtype, result, count, op.world());
  }
  return op.buffer().WriteBack(result, 0, count);
}

}  // namespace halka
