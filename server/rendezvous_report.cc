#include "server/rendezvous_report.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "codec/membership_codec.h"
#include "server/ring_diagnosis.h"

namespace halka {

void FillMember(const MemberView& m, v1::Member* out) {
  out->set_rank(m.rank);
  out->set_worker_id(m.worker_id);
  out->set_address(m.address);
  out->set_alive(m.alive);
  out->set_device(m.device);
  out->set_last_heartbeat_age_s(absl::ToDoubleSeconds(m.heartbeat_age));
  out->set_since_generation(m.since_generation);
  out->set_host(m.host);
  if (m.left) out->set_left(true);
}

void FillHostRing(const MembershipView& v,
                  google::protobuf::RepeatedField<int32_t>* order,
                  google::protobuf::RepeatedPtrField<v1::HostGroup>* hosts,
                  bool rank_order_too) {
  order->Add(v.ring_order.begin(), v.ring_order.end());
  for (int r = 0; rank_order_too && v.ring_order.empty() &&
                  r < static_cast<int>(v.members.size());
       ++r) {
    order->Add(r);
  }
  for (const HostGroup& h : v.hosts) {
    v1::HostGroup* g = hosts->Add();
    g->set_host(h.host);
    g->mutable_ranks()->Add(h.ranks.begin(), h.ranks.end());
  }
}

v1::JobState ToProto(JobState s) {
  static_assert(static_cast<int>(JobState::kForming) == v1::JOB_STATE_FORMING &&
                static_cast<int>(JobState::kHealthy) == v1::JOB_STATE_HEALTHY &&
                static_cast<int>(JobState::kDegraded) ==
                    v1::JOB_STATE_DEGRADED &&
                static_cast<int>(JobState::kWaiting) == v1::JOB_STATE_WAITING);
  return static_cast<v1::JobState>(s);
}

void FillMembership(const std::string& job_id, const MembershipView& v,
                    v1::Membership* out) {
  out->set_job_id(job_id);
  out->set_generation(v.generation);
  out->set_job_state(ToProto(v.state));
  out->set_world_size(v.world_size);
  out->set_min_world_size(v.min_world_size);
  out->set_max_world_size(v.max_world_size);
  for (const MemberView& m : v.members) FillMember(m, out->add_members());
  out->set_change(v.change);
  for (const MemberView& m : v.lost) FillMember(m, out->add_lost());
  FillHostRing(v, out->mutable_ring_order(), out->mutable_hosts());
  if (v.link_model.has_value()) {
    LinkModelToProto(*v.link_model, out->mutable_link_model());
  }
  out->set_probe_links(v.probe_links);
}

namespace {

// A worker's window figures for one peer edge, as the diagnosis takes them.
EdgeInput EdgeInputOf(const v1::EdgeTelemetry& e) {
  EdgeInput x;
  x.peer = e.peer();
  x.wire_seconds = e.wire_seconds();
  x.bytes_sent = e.bytes_sent();
  x.bytes_received = e.bytes_received();
  x.send_seconds = e.send_seconds();
  x.wait_seconds = e.wait_seconds();
  x.reduce_seconds = e.reduce_seconds();
  x.wait_p50_seconds = e.wait_p50_seconds();
  x.wait_p99_seconds = e.wait_p99_seconds();
  x.errors = e.errors();
  return x;
}

// The diagnosis's edges and verdict into the reply.
void FillDiagnosis(const RingDiagnosis& d, v1::RingHealth* reply) {
  for (const EdgeReport& e : d.edges) {
    v1::EdgeHealth* out = reply->add_edges();
    out->set_from(e.from);
    out->set_to(e.to);
    out->set_bytes(e.bytes);
    out->set_throughput_bps(e.throughput_bps);
    out->set_wait_seconds(e.wait_seconds);
    out->set_added_wait_seconds(e.added_wait_seconds);
    out->set_wait_p50_seconds(e.wait_p50_seconds);
    out->set_wait_p99_seconds(e.wait_p99_seconds);
    out->set_errors(e.errors);
    out->set_ring(e.ring);
    out->set_wire_seconds(e.wire_seconds);
  }
  v1::Diagnosis* diag = reply->mutable_diagnosis();
  diag->set_has_straggler(d.has_straggler);
  diag->set_straggler_rank(d.straggler_rank);
  diag->set_slowest_from(d.slowest_from);
  diag->set_slowest_to(d.slowest_to);
  diag->set_summary(d.summary);
  diag->set_late_rank(d.late_rank);
  diag->set_stalled_rank(d.stalled_rank);
}

}  // namespace

void FillRingHealth(const std::string& job_id, const MembershipView& h,
                    absl::Time now, v1::RingHealth* reply) {
  reply->set_job_id(job_id);
  reply->set_job_state(ToProto(h.state));
  reply->set_generation(h.generation);
  reply->set_world_size(h.world_size);
  reply->set_min_world_size(h.min_world_size);
  reply->set_max_world_size(h.max_world_size);
  reply->set_change(h.change);
  for (const MemberView& m : h.lost) FillMember(m, reply->add_lost());
  // Health always says the order (rank order when the view leaves it out).
  FillHostRing(h, reply->mutable_ring_order(), reply->mutable_hosts(),
               /*rank_order_too=*/h.state != JobState::kForming);
  if (h.link_model.has_value()) {
    LinkModelToProto(*h.link_model, reply->mutable_link_model());
  }
  std::vector<RankInput> inputs;
  std::vector<LastOpInput> last_ops;
  std::vector<std::vector<ArrivalInput>> arrivals(
      static_cast<size_t>(std::max(h.world_size, 0)));
  double window_s = 0;
  for (const MemberView& m : h.members) {
    FillMember(m, reply->add_members());
    v1::WorkerTelemetry* t = reply->add_telemetry();
    if (!m.telemetry.empty()) t->ParseFromString(m.telemetry);
    if (!t->last_algorithm().empty()) {
      reply->set_last_algorithm(t->last_algorithm());
      reply->set_last_chunk_bytes(t->last_chunk_bytes());
      // The last operation's time beside its prediction, from the same
      // member, where it is live and its last operation succeeded (a
      // failed one's time is its deadline or its fault, not the
      // algorithm's).
      const bool timed = m.alive &&
                         t->last_op_outcome() != v1::OP_OUTCOME_FAILED;
      reply->set_last_op_seconds(timed ? t->last_op_seconds() : 0);
      reply->set_last_model_seconds(timed ? t->last_model_seconds() : 0);
    }
    if (!m.alive || m.telemetry.empty()) continue;
    LastOpInput op;
    op.rank = m.rank;
    op.op_seq = t->last_op_seq();
    op.failed = t->last_op_outcome() == v1::OP_OUTCOME_FAILED;
    op.error = t->last_op_error();
    op.calls_received = t->calls_received();
    last_ops.push_back(std::move(op));
    RankInput in;
    in.rank = m.rank;
    in.has_telemetry = true;
    in.op_seconds = t->window().op_seconds();
    in.ring_seconds = t->window().ring_seconds();
    in.ops = t->window().ops();
    in.stall_seconds = t->stall_seconds();
    if (m.rank >= 0 && m.rank < h.world_size) {
      auto& mine = arrivals[static_cast<size_t>(m.rank)];
      for (const v1::OpArrival& a : t->arrivals()) {
        mine.push_back({a.generation(), a.op_seq(), a.start_unix_us(),
                        a.end_unix_us()});
      }
      window_s = std::max(window_s, t->window_seconds());
    }
    for (const v1::EdgeTelemetry& e : t->window().edges()) {
      in.edges.push_back(EdgeInputOf(e));
    }
    inputs.push_back(std::move(in));
  }
  const std::vector<ArrivalLag> lags = ArrivalLags(
      h.world_size, arrivals,
      absl::ToUnixMicros(now - absl::Seconds(window_s)));
  for (RankInput& in : inputs) {
    if (in.rank < 0 || in.rank >= static_cast<int>(lags.size())) continue;
    const ArrivalLag& l = lags[static_cast<size_t>(in.rank)];
    in.arrival_lag_p50_seconds = l.p50_seconds;
    in.arrival_lag_p99_seconds = l.p99_seconds;
    in.arrival_ops = l.ops;
    v1::RankHealth* rh = reply->add_ranks();
    rh->set_rank(in.rank);
    rh->set_arrival_lag_p50_seconds(l.p50_seconds);
    rh->set_arrival_lag_p99_seconds(l.p99_seconds);
    rh->set_arrival_ops(l.ops);
    rh->set_stall_seconds(in.stall_seconds);
    rh->set_ring_seconds(in.ring_seconds);
    rh->set_op_seconds(in.op_seconds);
  }
  const std::vector<int> order(reply->ring_order().begin(),
                               reply->ring_order().end());
  FillDiagnosis(DiagnoseRing(h.world_size, inputs, DiagnosisOptions(), order),
                reply);
  v1::Diagnosis* diag = reply->mutable_diagnosis();
  diag->set_failure(DiagnoseFailures(std::move(last_ops)));
  reply->set_failing(!diag->failure().empty());
}

}  // namespace halka
