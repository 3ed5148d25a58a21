#include "core/edge_window.h"

#include <algorithm>
#include <cmath>

namespace halka {

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  q = std::clamp(q, 0.0, 1.0);
  size_t rank = static_cast<size_t>(std::ceil(q * values.size()));
  if (rank == 0) rank = 1;
  return values[rank - 1];
}

void EdgeWindow::Add(const Sample& s) {
  if (max_samples_ == 0) return;
  if (count_ == samples_.size() && samples_.size() < max_samples_) {
    // Full below the bound: grow.
    Resize(std::min(max_samples_, std::max<size_t>(64, 2 * count_)));
  }
  if (count_ == samples_.size()) {  // at the bound: drop the oldest
    first_ = (first_ + 1) % samples_.size();
    --count_;
  }
  samples_[(first_ + count_) % samples_.size()] = s;
  ++count_;
}

void EdgeWindow::Prune(absl::Time now) {
  const absl::Time cutoff = now - span_;
  while (count_ > 0 && At(0).time <= cutoff) {
    first_ = (first_ + 1) % samples_.size();
    --count_;
  }
  // Mostly empty after a busy spell: give the memory back (a full ring of
  // the default bound is about 10 MB).
  if (samples_.size() > 64 && count_ < samples_.size() / 4) {
    Resize(std::max<size_t>(64, 2 * count_));
  }
}

void EdgeWindow::Resize(size_t size) {
  std::vector<Sample> ring(size);
  for (size_t i = 0; i < count_; ++i) ring[i] = At(i);  // oldest first
  samples_ = std::move(ring);
  first_ = 0;
}

void EdgeWindow::RecordSend(absl::Time now, int peer, uint64_t bytes,
                            double seconds) {
  Add({now, Kind::kSend, peer, bytes, seconds});
}
void EdgeWindow::RecordWait(absl::Time now, int peer, uint64_t bytes,
                            double seconds) {
  Add({now, Kind::kWait, peer, bytes, seconds});
}
void EdgeWindow::RecordReduce(absl::Time now, int peer, double seconds) {
  Add({now, Kind::kReduce, peer, 0, seconds});
}
void EdgeWindow::RecordError(absl::Time now, int peer) {
  Add({now, Kind::kError, peer, 0, 0});
}
void EdgeWindow::RecordArrivalWait(absl::Time now, int peer, uint64_t bytes,
                                   double seconds) {
  Add({now, Kind::kArrival, peer, bytes, seconds});
}
void EdgeWindow::RecordWire(absl::Time now, int peer, double seconds) {
  Add({now, Kind::kWire, peer, 0, seconds});
}
void EdgeWindow::RecordOp(absl::Time now, double seconds,
                          double ring_seconds) {
  Add({now, Kind::kOp, -1, 0, seconds, ring_seconds});
}

EdgeSummary EdgeWindow::Summarize(absl::Time now) {
  Prune(now);
  EdgeSummary out;
  std::map<int, std::vector<double>> waits;
  for (size_t i = 0; i < count_; ++i) {
    const Sample& s = At(i);
    if (s.time > now) continue;
    if (s.kind == Kind::kOp) {
      ++out.ops;
      out.op_seconds += s.seconds;
      out.ring_seconds += s.ring_seconds;
      continue;
    }
    EdgeStats& e = out.edges[s.peer];
    switch (s.kind) {
      case Kind::kSend:
        e.bytes_sent += s.bytes;
        e.send_seconds += s.seconds;
        break;
      case Kind::kWait:
        e.bytes_received += s.bytes;
        e.wait_seconds += s.seconds;
        ++e.chunks_received;
        waits[s.peer].push_back(s.seconds);
        break;
      case Kind::kArrival:
        e.bytes_received += s.bytes;
        e.arrival_wait_seconds += s.seconds;
        break;
      case Kind::kWire:
        e.wire_seconds += s.seconds;
        break;
      case Kind::kReduce:
        e.reduce_seconds += s.seconds;
        break;
      case Kind::kError:
        ++e.errors;
        break;
      case Kind::kOp:
        break;
    }
  }
  for (auto& [peer, w] : waits) {
    EdgeStats& e = out.edges[peer];
    e.wait_p50_seconds = Percentile(w, 0.50);
    e.wait_p99_seconds = Percentile(w, 0.99);
  }
  return out;
}

}  // namespace halka
