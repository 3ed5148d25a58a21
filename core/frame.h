// Frames as the engine sees them, independent of any wire encoding.
#ifndef HALKA_CORE_FRAME_H_
#define HALKA_CORE_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "halka/types.h"
#include "core/dtype.h"

namespace halka {

// OpKind and Algorithm are defined in halka/types.h (public vocabulary).
absl::string_view OpKindName(OpKind kind);  // "all_reduce", ...

absl::string_view AlgorithmName(Algorithm algorithm);  // "auto", "ring", ...
// The largest halka.v1.Algorithm value a fingerprint may carry: values past
// the last this build knows are a newer worker's, kept so that the ranks
// name the difference (AlgorithmName says "unknown").
inline constexpr int kMaxAlgorithmValue = 255;
// "auto", "ring", "naive", "ps", "two_level", "tree", "recursive_doubling",
// "halving_doubling". INVALID_ARGUMENT otherwise.
absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name);

// What every rank must agree on before any data moves.
struct Fingerprint {
  uint64_t op_seq = 0;
  OpKind kind = OpKind::kBarrier;
  DType dtype = DType::kFloat32;
  uint64_t count = 0;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  Algorithm algorithm = Algorithm::kAuto;  // as requested
  // What the sender runs (OpFingerprint.resolved_algorithm); kAuto: not
  // said (a worker older than the tree). Not compared by ==.
  Algorithm resolved = Algorithm::kAuto;

  bool operator==(const Fingerprint& o) const {
    return op_seq == o.op_seq && kind == o.kind && dtype == o.dtype &&
           count == o.count && op == o.op && root == o.root &&
           algorithm == o.algorithm;
  }
  bool operator!=(const Fingerprint& o) const { return !(*this == o); }
  // "all_reduce #3 float32x1000 sum", "broadcast #4 int64x7 root 2".
  std::string ToString() const;
};

// kPeer: a piece of a point-to-point message (core/peer_messages.h).
enum class FrameKind : uint8_t {
  kData = 1,
  kFingerprint = 2,
  kAbort = 3,
  kPeer = 4
};
enum class Phase : uint8_t {
  kFingerprint = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kNaive = 5,
  kPsPush = 6,
  kPsPull = 7,
  kGather = 8,    // to a root (reduce, gather)
  kScatter = 9,   // from a root
  kAllToAll = 10,
};
absl::string_view PhaseName(Phase phase);  // "reduce-scatter", ...

struct FrameMeta {
  FrameKind kind = FrameKind::kData;
  uint64_t generation = 0;
  uint64_t op_seq = 0;
  Phase phase = Phase::kFingerprint;
  int32_t step = 0;
  int32_t segment = 0;
  uint64_t offset = 0;  // elements
  uint64_t count = 0;   // elements in the payload
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Fingerprint fingerprint;   // kFingerprint
  int32_t origin_rank = -1;  // kFingerprint, kAbort
  int32_t sender_rank = -1;
  absl::StatusCode abort_code = absl::StatusCode::kOk;  // kAbort
  std::string message;                                  // kAbort
  uint64_t message_bytes = 0;  // kPeer: the whole message's bytes
  // The group whose operation this frame belongs to (core/sub_ring.h): 0
  // for the job's own operations and point-to-point messages. The ranks
  // in a group's frames are the group's, except sender_rank on the wire.
  uint64_t group = 0;
  // kAbort: the ranks whose own fingerprints the origin still lacked when
  // its deadline passed in the fingerprint exchange (the one it waited for
  // first); empty: none, or another failure (FrameHeader.late_ranks).
  std::vector<int32_t> late_ranks;
};
// At most this many late ranks in an ABORT (sent and read).
inline constexpr size_t kMaxLateRanks = 64;

// One operation on a worker's links: the job's (group 0) or a group's, by
// its sequence number (each group numbers its operations on its own).
struct OpId {
  uint64_t op_seq = 0;
  uint64_t group = 0;
};

// A received frame. The payload may arrive in several pieces (the wire's
// slices); `keepalive` owns the memory they point into.
struct InFrame {
  FrameMeta meta;
  std::vector<absl::Span<const uint8_t>> pieces;
  std::shared_ptr<void> keepalive;
  // The payload lies where the operation wants it already: a link's reader
  // wrote it into the operation's buffer (core/landing.h), and the
  // one piece points there.
  bool landed = false;
  // Where the payload lies in memory that another process can take away
  // under it (a same-host link's ring, which a same-user process may
  // truncate): whether it still held the sender's bytes. Asked once the
  // operation is done with its frames (OpContext::CheckIntact); empty:
  // always intact.
  std::function<bool()> intact;
  size_t PayloadBytes() const {
    size_t n = 0;
    for (const auto& p : pieces) n += p.size();
    return n;
  }
};

// A frame on its way out, as every link path takes it (transport/
// link_path.h): its encoded bytes in parts (the head, then the payload,
// back to back), what keeps them alive, and what to run once they are no
// longer needed. The payload part usually points into the operation's
// buffer: it is borrowed, and on_released says when it is free again.
struct OutFrame {
  std::vector<absl::Span<const uint8_t>> parts;
  std::shared_ptr<void> keepalive;  // owns what parts point to, if anything
  std::function<void()> on_released;
  // Set for a data frame, whose payload is borrowed from operation op_seq's
  // buffer: a path may withdraw it when that operation fails (LinkPath::
  // Withdraw). Heads, fingerprints and aborts are never withdrawn.
  bool data = false;
  uint64_t op_seq = 0;
  uint64_t group = 0;  // the operation's group (FrameMeta::group)
  // Whether this is a data frame of operation `op` (Transport::Withdraw).
  bool DataOf(const OpId& op) const {
    return data && op_seq == op.op_seq && group == op.group;
  }
  size_t Bytes() const {
    size_t n = 0;
    for (const auto& p : parts) n += p.size();
    return n;
  }
};

// Runs a frame's release callback once (and forgets it).
void ReleaseOnce(std::function<void()>& on_released);

// Copies the frame's bytes into memory the frame owns (one part) and hands
// back its release callback, for the caller to run outside its locks: for
// a frame a path has begun to write when its operation fails, so that the
// operation's buffer is free at once. Empty when the frame owned its
// bytes already.
std::function<void()> DetachPayload(OutFrame& frame);

}  // namespace halka

#endif  // HALKA_CORE_FRAME_H_
