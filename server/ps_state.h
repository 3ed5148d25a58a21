// The parameter server's logic as a pure state: no threads, no gRPC, no
// clock. The gRPC service (server/parameter_server.h) feeds it decoded
// frames and stream events and sends what it returns.
//
// One shard of a job. Every rank first sends a FINGERPRINT frame for an
// operation (op_seq); the first one fixes the operation, and this shard
// owns segment `shard` of PlanSegments(count, shards). Then each rank sends
// DATA frames (phase PS_PUSH) covering its copy of that segment in chunks,
// in offset order (as one stream per rank delivers them).
// Once every rank's chunk at an offset is in, the chunk is reduced in rank
// order 0, 1, ..., G-1 (so results are deterministic), AVG is divided by G,
// and one PS_PULL frame with the result goes to every connected rank.
// Results leave in offset order. An operation whose every rank has sent its
// fingerprint and whose whole segment has been returned is complete, and
// its entry is freed.
//
// Failures end one operation and send an ABORT frame for it:
//  - ranks disagree on the operation (count, dtype, op, ...):
//    FAILED_PRECONDITION naming both fingerprints, to every rank;
//  - a second fingerprint from a rank, a data frame before the rank's
//    fingerprint, one that does not fit the shard's segment (offset, count,
//    dtype, phase, payload size), a duplicate chunk, or a rank outside the
//    operation's world: DATA_LOSS, to every rank;
//  - a rank sends ABORT: its code (ABORTED when it says OK) and message,
//    to every other rank;
//  - a rank's stream closes: UNAVAILABLE, every operation in flight, to
//    every other rank.
// ABORTs go only to connected ranks below the operation's world size.
//
// Thread-safety: none; the caller serialises.
#ifndef HALKA_SERVER_PS_STATE_H_
#define HALKA_SERVER_PS_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "core/frame.h"

namespace halka {

struct PsStats {
  uint64_t bytes_in = 0;   // payload bytes received from workers
  uint64_t bytes_out = 0;  // payload bytes sent to workers
  uint64_t ops_completed = 0;
  uint64_t ops_failed = 0;
};

// One frame to send: the same header and payload to each rank in `to`
// (ascending), in the order the sends are returned.
struct PsSend {
  std::vector<int> to;
  FrameMeta meta;
  // A reduced chunk (meta.count elements of meta.dtype), shared by every
  // recipient; null for an ABORT.
  std::shared_ptr<const std::vector<uint8_t>> payload;
};

class PsState {
 public:
  // This state serves segment `shard` of `shards` (0 <= shard < shards).
  PsState(int shard, int shards);

  // A stream for `rank` is open; results and aborts go to it. Opening
  // another for the same rank (a reconnect) changes nothing.
  void StreamOpened(int rank);

  // The stream for `rank` closed: every operation in flight fails
  // (UNAVAILABLE) and is freed. Returns the ABORTs for the other ranks.
  std::vector<PsSend> StreamClosed(int rank);

  // A validated frame from `rank`, whose stream declared `world` ranks
  // (0 <= rank < world). Returns the frames to send, possibly none.
  std::vector<PsSend> OnFrame(int rank, int world, InFrame frame);

  const PsStats& stats() const { return stats_; }
  // Operations with an entry (in flight).
  size_t ops_in_flight() const { return ops_.size(); }

 private:
  struct Chunk {
    std::vector<InFrame> frames;  // by rank
    std::vector<bool> have;       // by rank
    uint64_t count = 0;
    int arrived = 0;
  };
  struct Op {
    Fingerprint fp;
    int fp_rank = -1;
    uint64_t generation = 0;
    int world = 0;
    std::vector<bool> have_fp;
    int fps = 0;
    uint64_t shard_offset = 0;
    uint64_t shard_count = 0;
    uint64_t sent_elems = 0;
    std::map<uint64_t, Chunk> chunks;  // by offset
  };

  void OnFingerprint(int rank, const FrameMeta& m,
                     std::map<uint64_t, Op>::iterator it,
                     std::vector<PsSend>& out);
  void OnData(int rank, InFrame frame, std::map<uint64_t, Op>::iterator it,
              std::vector<PsSend>& out);
  // Appends an ABORT for `op_seq` to every connected rank of its world but
  // `skip` (naming `late_ranks`, as the ABORT it relays did), and frees the
  // operation. No-op for an unknown op_seq.
  void FailOp(uint64_t op_seq, const absl::Status& status, int skip,
              std::vector<PsSend>& out, std::vector<int32_t> late_ranks = {});
  // Reduces and appends every complete chunk at the front of `op`.
  void Flush(uint64_t op_seq, Op& op, std::vector<PsSend>& out);
  // Connected ranks in [0, world), but `skip`.
  std::vector<int> Recipients(int world, int skip) const;

  const int shard_;
  const int shards_;
  std::set<int> connected_;
  std::map<uint64_t, Op> ops_;  // by op_seq
  PsStats stats_;
};

}  // namespace halka

#endif  // HALKA_SERVER_PS_STATE_H_
