// What one rank did when: the last operations' phases, chunk waits,
// reduces, sends and wire writes as timed spans, for the per-rank timeline
// (`halkactl trace`, `halkactl bench --trace`, the ring page).
//
// Bounded: the last kMaxOps operations, at most kMaxSpansPerOp spans each
// (later spans of an operation are counted, not kept). Booked by OpContext
// (spans) and the Communicator (the operation), through OpTelemetry, from
// the same calls that book the telemetry ledger: one record of each event.
//
// Thread-compatible: OpTelemetry guards it with its mutex.
#ifndef HALKA_CORE_TIMELINE_H_
#define HALKA_CORE_TIMELINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/frame.h"

namespace halka {

struct TraceSpan {
  enum class Kind : uint8_t {
    kPhase,   // one phase of the operation (fingerprint, reduce-scatter...)
    kWait,    // blocked for a frame from `peer`
    kReduce,  // reducing/copying a frame from `peer`
    kSend,    // handing a frame for `peer` to the transport
    kWire,    // the link to `peer` writing this rank's frames
    kStall,   // this process did not run (inside a wait)
    kWindow,  // waiting for the wire to release a segment (or every frame)
  };
  Kind kind = Kind::kPhase;
  Phase phase = Phase::kFingerprint;
  int step = 0;
  int chunk = 0;   // 0-based
  int peer = -1;
  uint64_t bytes = 0;
  absl::Time start;
  absl::Time end;
};

// "phase", "wait", ...
const char* TraceSpanKindName(TraceSpan::Kind kind);

struct TraceOp {
  uint64_t generation = 0;
  uint64_t op_seq = 0;
  std::string description;  // "all_reduce #3 float32x1000 sum"
  std::string algorithm;
  bool ok = true;
  std::string error;
  absl::Time start;           // the call reached this rank's ring
  absl::Time fingerprint_end; // the fingerprint pass ended (InfinitePast: never)
  absl::Time end;
  std::vector<TraceSpan> spans;  // in booking order
  uint64_t spans_dropped = 0;
};

class Timeline {
 public:
  static constexpr size_t kMaxOps = 64;
  static constexpr size_t kMaxSpansPerOp = 4096;

  // Spans of the running operation.
  void Add(const TraceSpan& span);
  // Closes the running operation as `op` (its spans are the ones added
  // since the last EndOp).
  void EndOp(TraceOp op);
  // Forgets the running operation's spans (a new one begins).
  void BeginOp();
  // The ended operations, oldest first.
  std::vector<TraceOp> Ops() const;

 private:
  std::vector<TraceSpan> running_;
  uint64_t running_dropped_ = 0;
  std::deque<TraceOp> ops_;
};

}  // namespace halka

#endif  // HALKA_CORE_TIMELINE_H_
