// Point to point: Communicator::Send and Recv (declared in communicator.h).
// A message travels as pieces (frames of kind kPeer) of at most the ring's
// chunk size over the same links as the collectives, numbered per sender
// and receiver; the receiving inbox keeps them apart from the collectives'
// frames (Inbox::NextPeer).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "core/communicator.h"

namespace halka {
namespace {

// What the pieces of one Send still hold: counted down by the transport's
// release callbacks (any thread).
struct SendState {
  absl::Mutex mu;
  size_t pending ABSL_GUARDED_BY(mu) = 0;
  std::vector<uint8_t> bytes;  // the copy the pieces point into
};

OpResult PeerResult(const CommConfig& config, const char* what, int peer,
                    uint64_t seq, uint64_t bytes, bool sent,
                    absl::Time start) {
  OpResult r;
  r.op_seq = seq;
  r.algorithm = what;
  (sent ? r.bytes_sent : r.bytes_received) = bytes;
  r.elapsed = halka::Now() - start;
  r.generation = config.generation;
  r.rank = config.rank;
  r.world_size = config.world_size;
  r.peer = peer;
  return r;
}

// How long a recv interrupted by a membership change still takes pieces
// that were on their way.
constexpr absl::Duration kLeaveGrace = absl::Seconds(1);

absl::Duration Bounded(absl::Duration timeout, const CommConfig& config) {
  return timeout > absl::ZeroDuration() ? timeout : config.default_timeout;
}

}  // namespace

absl::Status Communicator::CheckPeer(int peer, bool any,
                                     const char* what) const {
  if ((any && peer == -1) ||
      (peer >= 0 && peer < config_.world_size && peer != config_.rank)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": rank ", peer, " is not another rank of this ring of ",
      config_.world_size, " (this is rank ", config_.rank, ")",
      any ? "; -1 receives from any rank" : ""));
}

absl::StatusOr<OpResult> Communicator::Send(OpBuffer& buffer, size_t bytes,
                                            int to, int tag,
                                            absl::Duration timeout) {
  const absl::Time start = halka::Now();
  const absl::Time deadline = start + Bounded(timeout, config_);
  if (absl::Status s = CheckPeer(to, false, "send"); !s.ok()) return s;
  if (bytes > config_.max_op_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "send: ", bytes, " bytes is more than this worker's limit of ",
        config_.max_op_bytes));
  }
  // One copy: the pieces then never point into the caller's buffer, which
  // may be gone when a piece that a slow link still holds is released.
  auto state = std::make_shared<SendState>();
  state->bytes.resize(bytes);
  if (bytes > 0) {
    if (absl::Status s = buffer.Begin(DType::kUInt8, ReduceOp::kSum, bytes);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<const uint8_t*> host = buffer.HostView(0, bytes);
    if (!host.ok()) return host.status();
    std::memcpy(state->bytes.data(), *host, bytes);
    if (absl::Status s = buffer.End(); !s.ok()) return s;
  }
  absl::ReleasableMutexLock send_lock(&send_mu_);
  uint64_t seq;
  {
    absl::MutexLock lock(&peer_mu_);
    seq = ++sent_to_[to];
  }
  // The ring's chunk, and never near the codec's frame limit (32 MiB).
  const size_t piece = std::clamp<size_t>(config_.chunk_bytes, 1,
                                          size_t{16} << 20);
  const size_t pieces = bytes == 0 ? 1 : (bytes + piece - 1) / piece;
  {
    absl::MutexLock lock(&state->mu);
    state->pending = pieces;
  }
  for (size_t i = 0; i < pieces; ++i) {
    FrameMeta meta;
    meta.kind = FrameKind::kPeer;
    meta.generation = config_.generation;
    meta.op_seq = seq;
    meta.phase = Phase::kFingerprint;
    meta.step = tag;
    meta.offset = i * piece;
    meta.count = std::min(piece, bytes - meta.offset);
    meta.dtype = DType::kUInt8;
    meta.sender_rank = config_.rank;
    meta.origin_rank = config_.rank;
    meta.message_bytes = bytes;
    absl::Span<const uint8_t> payload(state->bytes.data() + meta.offset,
                                      meta.count);
    absl::Status s = transport_->Send(to, meta, payload, [state] {
      absl::MutexLock lock(&state->mu);
      --state->pending;
    });
    if (!s.ok()) {
      if (i == 0) {
        // Nothing of it left: its number is given back (send_mu_ is held,
        // so no later message has one), and the receiver sees no gap.
        absl::MutexLock lock(&peer_mu_);
        --sent_to_[to];
      }
      // The pieces not handed over are released by nobody: count them off.
      absl::MutexLock lock(&state->mu);
      state->pending -= pieces - i - 1;
      return absl::UnavailableError(absl::StrCat(
          "send to ", DescribePeer(config_.members[static_cast<size_t>(to)]),
          ": message #", seq, " (", bytes, " bytes, tag ", tag,
          "): ", s.message()));
    }
  }
  send_lock.Release();
  size_t left;
  {
    absl::MutexLock lock(&state->mu);
    auto sent = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
      return state->pending == 0;
    };
    state->mu.AwaitWithDeadline(absl::Condition(&sent), deadline);
    left = state->pending;
  }
  const std::string whom =
      DescribePeer(config_.members[static_cast<size_t>(to)]);
  if (left > 0) {
    return absl::DeadlineExceededError(absl::StrCat(
        "send to ", whom, ": message #", seq, " (", bytes, " bytes, tag ",
        tag, "): ", left, " of its ", pieces, " pieces had not left this "
        "rank by the deadline (is ", whom, " taking them?)"));
  }
  // A piece is released whether or not its link delivered it.
  if (absl::Status link = inbox_->LinkFailure(to); !link.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "send to ", whom, ": message #", seq, " (", bytes, " bytes, tag ",
        tag, "): the link to it failed: ", link.message()));
  }
  return PeerResult(config_, "send", to, seq, bytes, true, start);
}

uint64_t Communicator::AwaitRecvTurn(absl::Time deadline) {
  absl::MutexLock lock(&peer_mu_);
  const uint64_t place = ++recv_places_;
  auto mine = [this, place]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer_mu_) {
    return recv_turn_ == place;
  };
  if (peer_mu_.AwaitWithDeadline(absl::Condition(&mine), deadline)) {
    return place;
  }
  recv_given_up_.insert(place);
  return 0;
}

void Communicator::EndRecvTurn() {
  absl::MutexLock lock(&peer_mu_);
  ++recv_turn_;
  while (recv_given_up_.erase(recv_turn_) > 0) ++recv_turn_;
}

absl::StatusOr<OpResult> Communicator::Recv(OpBuffer& buffer, size_t bytes,
                                            int from, int tag,
                                            absl::Duration timeout) {
  const absl::Time start = halka::Now();
  const absl::Time deadline = start + Bounded(timeout, config_);
  if (absl::Status s = CheckPeer(from, true, "recv"); !s.ok()) return s;
  auto whom = [this](int r) {
    return DescribePeer(config_.members[static_cast<size_t>(r)]);
  };
  const std::string awaited =
      from >= 0 ? whom(from) : std::string("any rank");
  if (AwaitRecvTurn(deadline) == 0) {
    return absl::DeadlineExceededError(absl::StrCat(
        "recv from ", awaited, " (", bytes, " bytes, tag ", tag,
        "): an earlier recv on this rank still waited at the deadline "
        "(receives run one at a time, in the order called)"));
  }
  struct TurnOver {
    Communicator* comm;
    ~TurnOver() { comm->EndRecvTurn(); }
  } turn_over{this};
  int sender = from;
  uint64_t seq = 0;     // the message being taken (0: none yet)
  uint64_t total = 0;   // its bytes, as its first piece says
  size_t got = 0;       // its bytes so far
  absl::Status refused;  // the message is consumed but does not fit
  bool begun = false;
  // After a membership change (the sender finished and left, say): what
  // was sent before it went is still taken, until the link to it ends or
  // kLeaveGrace passes. A send that returned OK is not lost because its
  // sender exited right after, as with a TCP socket.
  absl::Status interrupted;
  absl::Time drain_until = deadline;
  for (;;) {
    Inbox::Event ev =
        inbox_->NextPeer(sender, drain_until, /*heed_interrupt=*/
                         interrupted.ok(),
                         sender < 0 ? std::optional<int>(tag) : std::nullopt);
    if (!interrupted.ok() && ev.type != Inbox::Event::kFrame) {
      return absl::AbortedError(absl::StrCat(
          "recv from ", awaited, ": ", interrupted.message(),
          seq == 0 ? "" : absl::StrCat(" (message #", seq, " stopped at ",
                                       got, " of its ", total, " bytes)")));
    }
    if (ev.type == Inbox::Event::kTimeout) {
      return absl::DeadlineExceededError(
          seq == 0
              ? absl::StrCat("recv from ", awaited, " (", bytes,
                             " bytes, tag ", tag,
                             "): no message arrived before the deadline")
              : absl::StrCat("recv from ", whom(sender), ": message #", seq,
                             " stopped at ", got, " of its bytes before the "
                             "deadline"));
    }
    if (ev.type == Inbox::Event::kInterrupted) {
      if (ev.status.code() != absl::StatusCode::kAborted) {
        // A shutdown: nothing to wait for.
        return absl::AbortedError(absl::StrCat("recv from ", awaited, ": ",
                                               ev.status.message()));
      }
      interrupted = ev.status;
      drain_until = std::min(deadline, halka::Now() + kLeaveGrace);
      continue;
    }
    if (ev.type == Inbox::Event::kLinkFailed) {
      return absl::UnavailableError(absl::StrCat(
          "recv from ", awaited, ": the link to ", whom(ev.peer),
          " failed: ", ev.status.message()));
    }
    const FrameMeta& m = ev.frame.meta;
    if (seq == 0) {
      uint64_t expected;
      {
        absl::MutexLock lock(&peer_mu_);
        expected = taken_from_[ev.peer] + 1;
      }
      // Pieces of a message an earlier recv refused or gave up on, or the
      // rest of one whose start never came (its link failed, and so did
      // its send): skipped. A message whose number is past the expected
      // one is the sender's next after a send that failed.
      if (m.op_seq < expected || m.offset != 0) continue;
      sender = ev.peer;
      seq = m.op_seq;
      total = m.message_bytes;
      {
        absl::MutexLock lock(&peer_mu_);
        taken_from_[sender] = seq;
      }
      if (m.step != tag || m.message_bytes != bytes) {
        refused = absl::FailedPreconditionError(absl::StrCat(
            "recv from ", whom(sender), ": its message #", seq, " has tag ",
            m.step, " and ", m.message_bytes, " bytes; this recv asked for "
            "tag ", tag, " and ", bytes, " bytes (the message is dropped)"));
      }
    } else if (m.op_seq != seq || m.offset != got ||
               m.message_bytes != total) {
      // Every piece is checked against the first: a piece that claims a
      // larger message must never reach past the buffer.
      return absl::DataLossError(absl::StrCat(
          "recv from ", whom(sender), ": message #", seq, " of ", total,
          " bytes at byte ", got, ", got bytes ", m.offset,
          "+ of message #", m.op_seq, " of ", m.message_bytes, " bytes"));
    }
    if (refused.ok() && m.count > 0) {
      if (!begun) {
        if (absl::Status s = buffer.Begin(DType::kUInt8, ReduceOp::kSum, bytes);
            !s.ok()) {
          return s;
        }
        begun = true;
      }
      if (absl::Status s = buffer.Apply(false, m.offset, m.count, ev.frame);
          !s.ok()) {
        return s;
      }
    }
    got += m.count;
    if (got >= total) break;
  }
  if (!refused.ok()) return refused;
  if (begun) {
    if (absl::Status s = buffer.End(); !s.ok()) return s;
  }
  return PeerResult(config_, "recv", sender, seq, bytes, false, start);
}

}  // namespace halka
