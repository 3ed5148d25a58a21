#include "core/telemetry.h"

#include <utility>

#include "core/stall_monitor.h"

namespace halka {
namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// The sums one operation adds to an edge (not its percentiles).
void AddSums(const EdgeStats& from, EdgeStats& to) {
  to.bytes_sent += from.bytes_sent;
  to.bytes_received += from.bytes_received;
  to.send_seconds += from.send_seconds;
  to.wait_seconds += from.wait_seconds;
  to.arrival_wait_seconds += from.arrival_wait_seconds;
  to.wire_seconds += from.wire_seconds;
  to.reduce_seconds += from.reduce_seconds;
  to.chunks_received += from.chunks_received;
  to.errors += from.errors;
}

}  // namespace

const std::vector<double> kLatencyBounds = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1,      2.5,   5,      10,    30,   60,    1e300};

OpTelemetry::PeerRecord& OpTelemetry::OpPeer(int peer) {
  PeerRecord& rec = peers_[peer];
  rec.in_op = true;
  return rec;
}

void OpTelemetry::BeginOp() {
  absl::MutexLock lock(&mu_);
  for (auto& [peer, rec] : peers_) {
    rec.op = EdgeStats();
    rec.waits.clear();
    rec.in_op = false;
  }
  timeline_.BeginOp();
}

void OpTelemetry::BookSend(absl::Time now, int peer, uint64_t bytes,
                           absl::Duration spent, bool ok) {
  const double secs = Seconds(spent);
  absl::MutexLock lock(&mu_);
  scalars_.send_seconds += secs;
  PeerRecord& rec = OpPeer(peer);
  rec.op.send_seconds += secs;
  if (ok) {
    rec.op.bytes_sent += bytes;
    rec.linked = true;
    window_.RecordSend(now, peer, bytes, secs);
  } else {
    ++rec.op.errors;
    window_.RecordError(now, peer);
  }
}

void OpTelemetry::BookWait(absl::Time now, WaitEnd end, int peer,
                           uint64_t bytes, absl::Duration waited,
                           bool arrival) {
  const double secs = Seconds(waited);
  absl::MutexLock lock(&mu_);
  scalars_.wait_seconds += secs;
  switch (end) {
    case WaitEnd::kFrame: {
      PeerRecord& rec = OpPeer(peer);
      rec.linked = true;
      if (arrival) {
        rec.op.arrival_wait_seconds += secs;
        rec.op.bytes_received += bytes;
        window_.RecordArrivalWait(now, peer, bytes, secs);
        break;
      }
      rec.op.wait_seconds += secs;
      rec.op.bytes_received += bytes;
      ++rec.op.chunks_received;
      rec.waits.push_back(secs);
      window_.RecordWait(now, peer, bytes, secs);
      break;
    }
    case WaitEnd::kLinkFailed:
      ++OpPeer(peer).op.errors;
      window_.RecordError(now, peer);
      break;
    case WaitEnd::kOther:
      break;
  }
}

void OpTelemetry::BookReduce(absl::Time now, int peer, absl::Duration spent) {
  const double secs = Seconds(spent);
  absl::MutexLock lock(&mu_);
  OpPeer(peer).op.reduce_seconds += secs;
  window_.RecordReduce(now, peer, secs);
}

void OpTelemetry::BookWire(absl::Time now, int peer, absl::Duration busy) {
  const double secs = Seconds(busy);
  absl::MutexLock lock(&mu_);
  OpPeer(peer).op.wire_seconds += secs;
  window_.RecordWire(now, peer, secs);
}

void OpTelemetry::BookSpan(const TraceSpan& span) {
  absl::MutexLock lock(&mu_);
  timeline_.Add(span);
}

std::vector<TraceOp> OpTelemetry::Trace() const {
  absl::MutexLock lock(&mu_);
  return timeline_.Ops();
}

void OpTelemetry::BookReduceTotal(absl::Duration spent) {
  absl::MutexLock lock(&mu_);
  scalars_.reduce_seconds += Seconds(spent);
}

LinkBytes OpTelemetry::EndOp(absl::Time now, const OpEnd& end) {
  const double secs = Seconds(end.elapsed);
  LinkBytes moved;
  absl::MutexLock lock(&mu_);
  EdgeSummary last;
  for (auto& [peer, rec] : peers_) {
    if (!rec.in_op) continue;
    if (!rec.waits.empty()) {
      rec.op.wait_p50_seconds = Percentile(rec.waits, 0.50);
      rec.op.wait_p99_seconds = Percentile(rec.waits, 0.99);
    }
    AddSums(rec.op, rec.total);
    rec.in_total = true;
    moved.sent += rec.op.bytes_sent;
    moved.received += rec.op.bytes_received;
    last.edges[peer] = rec.op;
    rec.op = EdgeStats();
    rec.waits.clear();
    rec.in_op = false;
  }
  Telemetry& t = scalars_;
  ++t.ops_by_label[{std::string(OpKindName(end.kind)), end.algorithm,
                    end.status.ok() ? "ok" : "error"}];
  if (t.latency_buckets.empty()) {
    t.latency_buckets.assign(kLatencyBounds.size(), 0);
  }
  for (size_t i = 0; i < kLatencyBounds.size(); ++i) {
    if (secs <= kLatencyBounds[i]) {
      ++t.latency_buckets[i];
      break;
    }
  }
  t.latency_sum_seconds += secs;
  ++t.latency_count;
  last.ops = 1;
  last.op_seconds = secs;
  const bool fingerprinted = end.fingerprint_end > end.start;
  window_.RecordOp(
      now, secs,
      fingerprinted ? Seconds(now - end.fingerprint_end) : 0.0);
  TraceOp op;
  op.generation = end.generation;
  op.op_seq = end.op_seq;
  op.description = end.description;
  op.algorithm = end.algorithm;
  op.ok = end.status.ok();
  op.error = std::string(end.status.message());
  op.start = end.start;
  op.fingerprint_end = end.fingerprint_end;
  op.end = end.start + end.elapsed;
  timeline_.EndOp(std::move(op));
  if (end.status.ok() && end.op_seq != 0) {
    arrivals_.push_back(
        {end.generation, end.op_seq, end.start, end.start + end.elapsed});
    while (arrivals_.size() > kMaxArrivals) arrivals_.pop_front();
  }
  t.last_op = std::move(last);
  t.last_algorithm = end.algorithm;
  t.last_chunk_bytes = end.chunk_bytes;
  t.last_op_bytes = end.op_bytes;
  t.last_op_seconds = secs;
  t.last_model_seconds = end.model_seconds;
  t.bytes_sent += moved.sent;
  t.bytes_received += moved.received;
  if (end.status.ok()) {
    ++t.ops_completed;
  } else {
    ++t.ops_failed;
    t.last_error = std::string(end.status.message());
  }
  return moved;
}

Telemetry OpTelemetry::Snapshot(absl::Time now) const {
  Telemetry t;
  {
    absl::MutexLock lock(&mu_);
    t = scalars_;
    for (const auto& [peer, rec] : peers_) {
      if (rec.in_total) t.edges_total[peer] = rec.total;
      if (rec.linked) {
        LinkBytes& l = t.links[peer];
        l.sent = rec.total.bytes_sent + rec.op.bytes_sent + rec.carried.sent;
        l.received = rec.total.bytes_received + rec.op.bytes_received +
                     rec.carried.received;
      }
    }
    t.window = window_.Summarize(now);
    t.window_seconds = absl::ToDoubleSeconds(window_.span());
    t.arrivals.assign(arrivals_.begin(), arrivals_.end());
  }
  // Outside mu_ (a leaf): the monitor has a mutex of its own.
  t.stall_seconds = absl::ToDoubleSeconds(StallMonitor::Get().StalledBetween(
      now - absl::Seconds(t.window_seconds), now));
  return t;
}

void OpTelemetry::InheritFrom(const OpTelemetry& previous) {
  Telemetry scalars;
  std::map<int, PeerRecord> peers;
  Timeline timeline;
  std::deque<OpArrival> arrivals;
  EdgeWindow window = [&] {
    absl::MutexLock lock(&previous.mu_);
    scalars = previous.scalars_;
    peers = previous.peers_;
    timeline = previous.timeline_;
    arrivals = previous.arrivals_;
    return previous.window_;
  }();
  timeline.BeginOp();
  for (auto& [peer, rec] : peers) {
    rec.carried.sent += rec.op.bytes_sent;
    rec.carried.received += rec.op.bytes_received;
    rec.op = EdgeStats();
    rec.waits.clear();
    rec.in_op = false;
  }
  absl::MutexLock lock(&mu_);
  scalars_ = std::move(scalars);
  peers_ = std::move(peers);
  window_ = std::move(window);
  timeline_ = std::move(timeline);
  arrivals_ = std::move(arrivals);
}

}  // namespace halka
