// How the Communicator numbers its operations on the ring: a number given
// up for a call refused before the ring (SkipOp, SendSkip), a newcomer's
// number adopted from its peers' frames (AdoptOpSeq), and what an
// operation's end tells about the next number (SettleNumber). The worker
// decides which number a call takes; this is the ring's side of it
// (docs/thread_model.md, "Numbering").
#include <algorithm>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "core/communicator.h"

namespace halka {

absl::StatusOr<uint64_t> Communicator::SkipOp(uint64_t seq,
                                              const absl::Status& status,
                                              absl::Time deadline) {
  absl::MutexLock lock(&op_mu_);
  if (next_op_seq_ == 0) {
    // New in a running ring: the call being refused is the one the peers
    // run (or will run) next; learn its number as an operation would.
    absl::StatusOr<uint64_t> adopted = inbox_->WaitFirstOpSeq(deadline);
    if (!adopted.ok()) {
      // As in SettleNumber: no live operation came, and the newest one the
      // peers ran was refused (their copies refused too, say): that is the
      // one this call paired with, already aborted everywhere.
      if (const NewestOp newest = Newest(); newest.refused()) {
        next_op_seq_ = newest.seq + 1;
        return newest.seq;
      }
      return adopted.status();
    }
    seq = *adopted;
  }
  next_op_seq_ = seq + 1;
  SendSkip(seq, status);
  return seq;
}

absl::StatusOr<uint64_t> Communicator::SkipNextOp(const absl::Status& status) {
  absl::MutexLock lock(&op_mu_);
  if (next_op_seq_ == 0) {
    return absl::FailedPreconditionError(
        "this rank adopts its peers' numbering: SkipOp");
  }
  const uint64_t seq = next_op_seq_++;
  SendSkip(seq, status);
  return seq;
}

void Communicator::SendSkip(uint64_t seq, const absl::Status& status) {
  // FAILED_PRECONDITION, not ABORTED: the ranks disagree on this call (one
  // refused it); nothing changed in the membership, and a re-run waits for
  // no new generation.
  const FrameMeta meta = AbortMeta(
      config_, seq, absl::StatusCode::kFailedPrecondition,
      absl::StrCat(
          DescribePeer(config_.members[static_cast<size_t>(config_.rank)]),
          " ended its call #", seq, " before it reached the ring: ",
          status.ToString()));
  for (int to = 0; to < config_.world_size; ++to) {
    if (to == config_.rank) continue;
    // Best effort: a peer whose link is down fails at its deadline.
    transport_->Send(to, meta, {}, [] {}).IgnoreError();
  }
}

Communicator::NewestOp Communicator::Newest() {
  NewestOp newest;
  newest.seq = inbox_->MaxOpSeqSeen();
  if (newest.seq > 0) newest.abort = inbox_->AbortSeen(newest.seq);
  return newest;
}

absl::Status Communicator::AdoptOpSeq(OpContext& op) {
  if (op.fp().op_seq != 0) return absl::OkStatus();
  if (config_.world_size == 1) {
    op.set_op_seq(1);
    return absl::OkStatus();
  }
  // New in a running ring: take the number of the operation the others
  // are running (their fingerprints are on their way).
  absl::StatusOr<uint64_t> seq = inbox_->WaitFirstOpSeq(op.deadline());
  if (!seq.ok()) {
    return absl::Status(
        seq.status().code(),
        absl::StrCat(op.Where(), ": waiting for the ring's next operation: ",
                     seq.status().message()));
  }
  op.set_op_seq(*seq);
  return absl::OkStatus();
}

bool Communicator::SettleNumber(OpContext& op, bool adopting,
                                absl::Status* status) {
  // New in the ring, this rank took the number of the operation its peers
  // were running (their fingerprints were here), but they had ended it
  // without this rank: their deadline passed waiting for its fingerprint,
  // and their ABORT saying so came after this call took the number. The
  // call pairs with their next operation, not with that one: it fails
  // (ABORTED: call again) and gives the next number up, so that the peers'
  // copies fail at once naming this rank, and the call after pairs again.
  // Taking no action left this rank one number behind for good (each call
  // failing at once on the peers' ABORT, theirs at the deadline:
  // system_faults' sigstop_hosts on a loaded machine).
  const bool came_late =
      !status->ok() && adopting && op.fp().op_seq != 0 &&
      absl::c_linear_search(op.late_ranks(), config_.rank);
  if (came_late) {
    const uint64_t theirs = op.fp().op_seq + 1;
    *status = absl::AbortedError(absl::StrCat(
        op.Where(), ": this rank is new in the ring and took the number of "
        "the operation its peers were running, but they had ended it "
        "without this rank (", status->message(), "); this call pairs with "
        "their next operation, #", theirs, ", which this rank gives up so "
        "that it fails at once everywhere: call again"));
    SendSkip(theirs, *status);
    next_op_seq_ = theirs + 1;
  }
  // A peer already at a later operation has finished every earlier one:
  // skip to it, so that the ranks number the next call alike again.
  const NewestOp newest = Newest();
  if (next_op_seq_ == 0 && newest.abort.has_value()) {
    // A rank new in the ring whose call found no operation to adopt: the
    // newest one its peers ran was aborted. Refused (a peer's call ended
    // before the ring, or the calls disagreed: FAILED_PRECONDITION, which
    // nobody runs again), that is what this call paired with, so their
    // next call is the one after it, and this call ends as their copies
    // did, whatever ended its wait (its deadline, or a membership change:
    // re-run on the new ring as an untouched call, it took the peers' next
    // number there and paired with their next call, one call ahead for
    // good: system_faults' chaos). Aborted by a membership change
    // (ABORTED, UNAVAILABLE, ...), the peers' untouched calls run again
    // under that same number on the new ring: this rank adopts it there
    // (taking the next number instead split the numbering for good under
    // churn: system_faults' chaos, a rank one ahead of the rest).
    if (newest.refused()) {
      next_op_seq_ = newest.seq + 1;
      op.set_op_seq(newest.seq);
      *status = absl::FailedPreconditionError(absl::StrCat(
          op.Where(), ": this rank is new in the ring, and the operation its "
          "peers ran with this call ended before this rank learnt its "
          "number (", status->message(), "): ", newest.abort->message()));
      return false;
    }
  } else {
    next_op_seq_ = std::max(next_op_seq_, newest.seq);
  }
  return !came_late;
}

}  // namespace halka
