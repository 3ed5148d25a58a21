// Per-edge telemetry of one rank: what crossed each peer edge, how long this
// rank spent sending on it, blocked waiting for it (the Inbox wait) and
// reducing what came over it, both for the last operation and over a
// rolling window (default: the last minute), with per-chunk wait latency
// percentiles over the window.
//
// Thread-compatible: the Communicator guards it with its state mutex.
#ifndef HALKA_CORE_EDGE_WINDOW_H_
#define HALKA_CORE_EDGE_WINDOW_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/time/time.h"

namespace halka {

// Sums over one edge (peer = the rank on the other end; ranks >= world
// size are parameter-server shards).
struct EdgeStats {
  uint64_t bytes_sent = 0;      // payload this rank sent to the peer
  uint64_t bytes_received = 0;  // payload this rank received from the peer
  double send_seconds = 0;      // handing frames for the peer to the wire
  double wait_seconds = 0;      // blocked waiting for the peer's frames
                                // (data phases, less this rank's own stalls)
  double arrival_wait_seconds = 0;  // blocked in the fingerprint pass: the
                                // callers' arrival, not the edge
  double wire_seconds = 0;      // the link to the peer busy writing this
                                // rank's frames (first write to release)
  double reduce_seconds = 0;    // reducing/copying the peer's frames
  uint64_t chunks_received = 0; // frames received (= wait samples)
  double wait_p50_seconds = 0;  // per-frame wait latency (window only)
  double wait_p99_seconds = 0;
  uint64_t errors = 0;          // broken links / failed sends on this edge
};

struct EdgeSummary {
  std::map<int, EdgeStats> edges;
  uint64_t ops = 0;          // operations that ended in the window / last op
  double op_seconds = 0;     // their summed elapsed time
  double ring_seconds = 0;   // ... from the end of their fingerprint pass
};

class EdgeWindow {
 public:
  explicit EdgeWindow(absl::Duration span = absl::Seconds(60),
                      size_t max_samples = 200000)
      : span_(span), max_samples_(max_samples) {}

  void RecordSend(absl::Time now, int peer, uint64_t bytes, double seconds);
  void RecordWait(absl::Time now, int peer, uint64_t bytes, double seconds);
  void RecordReduce(absl::Time now, int peer, double seconds);
  void RecordError(absl::Time now, int peer);
  void RecordArrivalWait(absl::Time now, int peer, uint64_t bytes,
                         double seconds);
  void RecordWire(absl::Time now, int peer, double seconds);
  void RecordOp(absl::Time now, double seconds, double ring_seconds = 0);

  // Sums and wait percentiles over (now - span, now].
  EdgeSummary Summarize(absl::Time now);
  absl::Duration span() const { return span_; }
  // Places in the ring now (its memory: places x sizeof(Sample)).
  size_t places() const { return samples_.size(); }

 private:
  enum class Kind { kSend, kWait, kArrival, kWire, kReduce, kError, kOp };
  struct Sample {
    absl::Time time;
    Kind kind;
    int peer;
    uint64_t bytes;
    double seconds;
    double ring_seconds = 0;  // kOp
  };
  void Add(const Sample& s);
  void Prune(absl::Time now);
  // The ring, unwrapped, in `size` places (size >= count_).
  void Resize(size_t size);
  // The i-th oldest sample held (i < count_).
  const Sample& At(size_t i) const {
    return samples_[(first_ + i) % samples_.size()];
  }

  absl::Duration span_;
  size_t max_samples_;
  // The samples held, oldest first, in a ring: count_ of them from first_,
  // wrapping at samples_.size(). The ring doubles until it holds
  // max_samples_, and from then on each sample overwrites the oldest: a
  // sample costs no allocation once the ring has grown, where a deque
  // allocated and freed a node every few samples (a few per operation).
  // A prune that leaves it under a quarter full halves it or more.
  std::vector<Sample> samples_;
  size_t first_ = 0;
  size_t count_ = 0;
};

// Nearest-rank percentile (q in [0, 1]) of `values`; 0 when empty.
double Percentile(std::vector<double> values, double q);

}  // namespace halka

#endif  // HALKA_CORE_EDGE_WINDOW_H_
