#include "worker/worker_metrics.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/prometheus.h"
#include "core/link_counters.h"

namespace halka {

namespace {

// This worker's own link counters (core/link_counters.h).
void WriteLinkCounters(const PrometheusWriter::Labels& base,
                       const LinkCounters& links, PrometheusWriter& w) {
  auto load = [](const std::atomic<uint64_t>& n) {
    return n.load(std::memory_order_relaxed);
  };
  struct PathSample {
    const char* path;
    const char* outcome;
    uint64_t value;  // exact: never in floating point
  };
  w.Family("halka_peer_links_total", "counter",
           "outbound peer links by the path offered (shm: shared memory, "
           "wire: a TCP connection of its own) and what came of it "
           "(accepted; refused: the peer said no; fell_back: the wire "
           "connection could not be made, the link stayed on gRPC)");
  for (const PathSample& p :
       {PathSample{"shm", "accepted", load(links.shm.accepted)},
        PathSample{"shm", "refused", load(links.shm.refused)},
        PathSample{"wire", "accepted", load(links.wire.accepted)},
        PathSample{"wire", "refused", load(links.wire.refused)},
        PathSample{"wire", "fell_back", load(links.wire.fell_back)}}) {
    PrometheusWriter::Labels l = base;
    l.push_back({"path", p.path});
    l.push_back({"outcome", p.outcome});
    w.Sample("halka_peer_links_total", l, p.value);
  }
  struct Total {
    const char* name;
    const char* help;
    uint64_t value;  // exact: never in floating point
  };
  for (const Total& t :
       {Total{"halka_missed_wakeups_total",
              "waits on same-host rings that their 50 ms limit ended "
              "although a frame had come (a few are chance, a steady rise "
              "is a lost wake-up)",
              load(links.missed_wakeups)},
        Total{"halka_waits_yielded_total",
              "waits of an operation whose frame came while it yielded its "
              "core before sleeping (ranks outnumber the CPUs: no wake-up "
              "needed)",
              load(links.waits_yielded)},
        Total{"halka_grpc_frames_batched_total",
              "frames that left on a gRPC stream in one message behind "
              "another (a fingerprint and the first data frame, small "
              "frames queued together): writes that did not wait for the "
              "one before to complete",
              load(links.grpc_frames_batched)},
        Total{"halka_wire_frames_landed_total",
              "frames whose payload a wire link's reader put straight into "
              "an operation's buffer (all-gather chunks that came after "
              "their landing was offered)",
              load(links.wire.landed)},
        Total{"halka_wire_frames_tapped_total",
              "frames an operation's own thread read off a wire link while "
              "it waited (no hand-off from the link's reader thread)",
              load(links.wire.tapped)},
        Total{"halka_wire_congestion_changed_total",
              "wire links whose sending socket took another TCP congestion "
              "control than the host's default (--wire_congestion; auto "
              "replaces bbr on links with a round trip under 1 ms)",
              load(links.wire.congestion_changed)},
        Total{"halka_wire_congestion_refused_total",
              "wire links whose asked-for congestion control the kernel "
              "refused (not allowed to this process, or not built): they "
              "keep the host's",
              load(links.wire.congestion_refused)},
        Total{"halka_wire_silent_connections_evicted_total",
              "connections to the wire listener that showed no token and "
              "were closed to make room for a newer one (a steady rise is a "
              "scanner or a flood)",
              load(links.wire.evicted)}}) {
    w.Family(t.name, "counter", t.help);
    w.Sample(t.name, base, t.value);
  }
}

}  // namespace

std::string WorkerMetricsText(const std::string& job_id, int rank,
                              uint64_t generation, int world,
                              const Telemetry& t, const LinkCounters& links) {
  using Labels = PrometheusWriter::Labels;
  const Labels base = {{"halka_job", job_id}, {"rank", absl::StrCat(rank)}};
  auto with = [&base](Labels more) {
    Labels l = base;
    l.insert(l.end(), more.begin(), more.end());
    return l;
  };
  auto peer = [world](int p) -> std::pair<std::string, std::string> {
    return {"peer", p < world ? absl::StrCat(p) : absl::StrCat("ps", p - world)};
  };
  PrometheusWriter w;
  w.Family("halka_worker_generation", "gauge",
           "membership generation of the ring");
  w.Sample("halka_worker_generation", base, generation);
  w.Family("halka_operations_total", "counter",
           "operations by kind, algorithm and outcome");
  for (const auto& [key, n] : t.ops_by_label) {
    w.Sample("halka_operations_total",
             with({{"kind", std::get<0>(key)},
                   {"algorithm", std::get<1>(key)},
                   {"outcome", std::get<2>(key)}}),
             n);
  }
  w.Family("halka_operation_seconds", "histogram", "operation latency");
  // The last bound of kLatencyBounds stands for +Inf, which the writer adds.
  w.Histogram("halka_operation_seconds", base,
              absl::MakeConstSpan(kLatencyBounds).first(kLatencyBounds.size() - 1),
              t.latency_buckets, t.latency_sum_seconds, t.latency_count);
  w.Family("halka_edge_bytes_total", "counter",
           "payload bytes per peer edge (direction=sent: this rank -> peer)");
  for (const auto& [p, e] : t.edges_total) {
    w.Sample("halka_edge_bytes_total", with({peer(p), {"direction", "sent"}}),
             e.bytes_sent);
    w.Sample("halka_edge_bytes_total",
             with({peer(p), {"direction", "received"}}), e.bytes_received);
  }
  struct Series {
    const char* name;
    const char* type;
    const char* help;
    double EdgeStats::*field;
  };
  for (const Series& s :
       {Series{"halka_edge_send_seconds_total", "counter",
               "time handing frames for the peer to the wire",
               &EdgeStats::send_seconds},
        Series{"halka_edge_wait_seconds_total", "counter",
               "time blocked waiting for the peer's frames",
               &EdgeStats::wait_seconds},
        Series{"halka_edge_reduce_seconds_total", "counter",
               "time reducing what the peer sent", &EdgeStats::reduce_seconds}}) {
    w.Family(s.name, s.type, s.help);
    for (const auto& [p, e] : t.edges_total) {
      w.Sample(s.name, with({peer(p)}), e.*(s.field));
    }
  }
  w.Family("halka_edge_errors_total", "counter", "link errors per peer edge");
  for (const auto& [p, e] : t.edges_total) {
    w.Sample("halka_edge_errors_total", with({peer(p)}), e.errors);
  }
  w.Family("halka_edge_chunk_wait_p99_seconds", "gauge",
           "99th percentile per-chunk wait over the last minute");
  for (const auto& [p, e] : t.window.edges) {
    w.Sample("halka_edge_chunk_wait_p99_seconds", with({peer(p)}),
             e.wait_p99_seconds);
  }
  WriteLinkCounters(base, links, w);
  return w.Text();
}

v1::WorkerTelemetry TelemetryProto(const Telemetry& tel, const Progress& p,
                                   absl::Time now) {
  v1::WorkerTelemetry t;
  t.set_ops_completed(tel.ops_completed);
  t.set_ops_failed(tel.ops_failed);
  t.set_bytes_sent(tel.bytes_sent);
  t.set_bytes_received(tel.bytes_received);
  t.set_send_seconds(tel.send_seconds);
  t.set_wait_seconds(tel.wait_seconds);
  t.set_reduce_seconds(tel.reduce_seconds);
  t.set_last_error(tel.last_error);
  for (const auto& [peer, bytes] : tel.links) {
    v1::LinkTelemetry* l = t.add_links();
    l->set_peer(peer);
    l->set_bytes_sent(bytes.sent);
    l->set_bytes_received(bytes.received);
  }
  auto fill = [](const EdgeSummary& in, v1::EdgeSet* out) {
    out->set_ops(in.ops);
    out->set_op_seconds(in.op_seconds);
    for (const auto& [peer, e] : in.edges) {
      v1::EdgeTelemetry* x = out->add_edges();
      x->set_peer(peer);
      x->set_bytes_sent(e.bytes_sent);
      x->set_bytes_received(e.bytes_received);
      x->set_send_seconds(e.send_seconds);
      x->set_wait_seconds(e.wait_seconds);
      x->set_reduce_seconds(e.reduce_seconds);
      x->set_chunks_received(e.chunks_received);
      x->set_wait_p50_seconds(e.wait_p50_seconds);
      x->set_wait_p99_seconds(e.wait_p99_seconds);
      x->set_errors(e.errors);
      x->set_arrival_wait_seconds(e.arrival_wait_seconds);
      x->set_wire_seconds(e.wire_seconds);
    }
    out->set_ring_seconds(in.ring_seconds);
  };
  fill(tel.window, t.mutable_window());
  fill(tel.last_op, t.mutable_last_op());
  t.set_window_seconds(tel.window_seconds);
  t.set_stall_seconds(tel.stall_seconds);
  for (const OpArrival& a : tel.arrivals) {
    v1::OpArrival* x = t.add_arrivals();
    x->set_generation(a.generation);
    x->set_op_seq(a.op_seq);
    x->set_start_unix_us(absl::ToUnixMicros(a.start));
    x->set_end_unix_us(absl::ToUnixMicros(a.end));
  }
  t.set_last_algorithm(tel.last_algorithm);
  t.set_last_op_seconds(tel.last_op_seconds);
  t.set_last_model_seconds(tel.last_model_seconds);
  t.set_last_chunk_bytes(tel.last_chunk_bytes);
  t.set_last_op_bytes(tel.last_op_bytes);
  t.set_awaited_rank(-1);
  if (p.busy) {
    t.set_current_op(p.op);
    t.set_phase(std::string(PhaseName(p.phase)));
    t.set_step(p.step);
    t.set_chunk(p.chunk + 1);
    t.set_chunks(std::max(p.chunks, 1));
    t.set_awaited_rank(p.awaited_rank);
    if (p.awaited_rank >= 0) {
      t.set_waiting_for_s(absl::ToDoubleSeconds(now - p.waiting_since));
    }
  }
  return t;
}

v1::Timeline TimelineProto(const std::vector<TraceOp>& ops) {
  v1::Timeline out;
  auto us = [](absl::Time t) {
    return t == absl::InfinitePast() ? int64_t{0} : absl::ToUnixMicros(t);
  };
  for (const TraceOp& op : ops) {
    v1::TimelineOp* o = out.add_ops();
    o->set_generation(op.generation);
    o->set_op_seq(op.op_seq);
    o->set_description(op.description);
    o->set_algorithm(op.algorithm);
    o->set_ok(op.ok);
    o->set_error(op.error);
    o->set_start_unix_us(us(op.start));
    o->set_fingerprint_end_unix_us(us(op.fingerprint_end));
    o->set_end_unix_us(us(op.end));
    o->set_spans_dropped(op.spans_dropped);
    for (const TraceSpan& s : op.spans) {
      v1::TimelineSpan* x = o->add_spans();
      x->set_kind(TraceSpanKindName(s.kind));
      x->set_phase(std::string(PhaseName(s.phase)));
      x->set_step(s.step);
      x->set_chunk(s.chunk);
      x->set_peer(s.peer);
      x->set_bytes(s.bytes);
      x->set_start_unix_us(us(s.start));
      x->set_end_unix_us(us(s.end));
    }
  }
  return out;
}

}  // namespace halka
