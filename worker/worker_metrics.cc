#include "worker/worker_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/http_server.h"

namespace halka {

std::string WorkerMetricsText(const std::string& job_id, int rank,
                              uint64_t generation, int world,
                              const Telemetry& t) {
  const std::string base = absl::StrCat(
      "job=\"", PromEscape(job_id), "\",rank=\"", rank, "\"");
  std::string out;
  auto head = [&out](const char* name, const char* type, const char* help) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                    type, "\n");
  };
  head("halka_worker_generation", "gauge", "membership generation of the ring");
  absl::StrAppend(&out, "halka_worker_generation{", base, "} ", generation, "\n");
  head("halka_operations_total", "counter",
       "operations by kind, algorithm and outcome");
  for (const auto& [key, n] : t.ops_by_label) {
    absl::StrAppend(&out, "halka_operations_total{", base, ",kind=\"",
                    std::get<0>(key), "\",algorithm=\"", std::get<1>(key),
                    "\",outcome=\"", std::get<2>(key), "\"} ", n, "\n");
  }
  head("halka_operation_seconds", "histogram", "operation latency");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kLatencyBounds.size(); ++i) {
    if (i < t.latency_buckets.size()) cumulative += t.latency_buckets[i];
    const std::string le = i + 1 == kLatencyBounds.size()
                               ? "+Inf" : absl::StrCat(kLatencyBounds[i]);
    absl::StrAppend(&out, "halka_operation_seconds_bucket{", base, ",le=\"", le,
                    "\"} ", cumulative, "\n");
  }
  absl::StrAppend(&out, "halka_operation_seconds_sum{", base, "} ",
                  t.latency_sum_seconds, "\n", "halka_operation_seconds_count{",
                  base, "} ", t.latency_count, "\n");
  const int g = world;
  auto peer_label = [g](int peer) {
    return peer < g ? absl::StrCat("peer=\"", peer, "\"")
                    : absl::StrCat("peer=\"ps", peer - g, "\"");
  };
  struct Series {
    const char* name;
    const char* help;
    double EdgeStats::*field;
  };
  head("halka_edge_bytes_total", "counter",
       "payload bytes per peer edge (direction=sent: this rank -> peer)");
  for (const auto& [peer, e] : t.edges_total) {
    absl::StrAppend(&out, "halka_edge_bytes_total{", base, ",", peer_label(peer),
                    ",direction=\"sent\"} ", e.bytes_sent, "\n");
    absl::StrAppend(&out, "halka_edge_bytes_total{", base, ",", peer_label(peer),
                    ",direction=\"received\"} ", e.bytes_received, "\n");
  }
  for (const Series& s :
       {Series{"halka_edge_send_seconds_total",
               "time handing frames for the peer to the wire",
               &EdgeStats::send_seconds},
        Series{"halka_edge_wait_seconds_total",
               "time blocked waiting for the peer's frames",
               &EdgeStats::wait_seconds},
        Series{"halka_edge_reduce_seconds_total",
               "time reducing what the peer sent", &EdgeStats::reduce_seconds}}) {
    head(s.name, "counter", s.help);
    for (const auto& [peer, e] : t.edges_total) {
      absl::StrAppend(&out, s.name, "{", base, ",", peer_label(peer), "} ",
                      e.*(s.field), "\n");
    }
  }
  head("halka_edge_errors_total", "counter", "link errors per peer edge");
  for (const auto& [peer, e] : t.edges_total) {
    absl::StrAppend(&out, "halka_edge_errors_total{", base, ",", peer_label(peer),
                    "} ", e.errors, "\n");
  }
  head("halka_edge_chunk_wait_p99_seconds", "gauge",
       "99th percentile per-chunk wait over the last minute");
  for (const auto& [peer, e] : t.window.edges) {
    absl::StrAppend(&out, "halka_edge_chunk_wait_p99_seconds{", base, ",",
                    peer_label(peer), "} ", e.wait_p99_seconds, "\n");
  }
  return out;
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
    }
  };
  fill(tel.window, t.mutable_window());
  fill(tel.last_op, t.mutable_last_op());
  t.set_window_seconds(tel.window_seconds);
  t.set_last_algorithm(tel.last_algorithm);
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

}  // namespace halka
