// The wire's replies as the SDK's plain structs (OpInfo, halka/ring.h).
// Client::Info and Client::RingHealth (client.cc) convert with these.
#include "client/client_proto.h"

#include <utility>

#include "codec/membership_codec.h"
#include "core/cost_model.h"

namespace halka {
namespace {

// halka::JobState is the wire's JobState, value for value.
static_assert(static_cast<int>(JobState::kUnspecified) ==
              v1::JOB_STATE_UNSPECIFIED);
static_assert(static_cast<int>(JobState::kForming) == v1::JOB_STATE_FORMING);
static_assert(static_cast<int>(JobState::kHealthy) == v1::JOB_STATE_HEALTHY);
static_assert(static_cast<int>(JobState::kDegraded) ==
              v1::JOB_STATE_DEGRADED);
static_assert(static_cast<int>(JobState::kWaiting) == v1::JOB_STATE_WAITING);
static_assert(v1::JobState_MAX == v1::JOB_STATE_WAITING,
              "a new v1.JobState value needs its halka::JobState");

// A value this build does not know reads as kUnspecified.
JobState ToJobState(v1::JobState s) {
  return s >= v1::JobState_MIN && s <= v1::JobState_MAX
             ? static_cast<JobState>(s)
             : JobState::kUnspecified;
}

std::vector<Member> ToMembers(
    const google::protobuf::RepeatedPtrField<v1::Member>& ms) {
  std::vector<Member> out;
  out.reserve(ms.size());
  for (const v1::Member& m : ms) out.push_back(ToMember(m));
  return out;
}

WorkerTelemetry ToTelemetry(const v1::WorkerTelemetry& t) {
  WorkerTelemetry w;
  w.ops_completed = t.ops_completed();
  w.ops_failed = t.ops_failed();
  w.bytes_sent = t.bytes_sent();
  w.bytes_received = t.bytes_received();
  w.send_seconds = t.send_seconds();
  w.wait_seconds = t.wait_seconds();
  w.reduce_seconds = t.reduce_seconds();
  w.current_op = t.current_op();
  w.phase = t.phase();
  w.step = t.step();
  w.awaited_rank = t.awaited_rank();
  w.waiting_for_s = t.waiting_for_s();
  w.chunk = t.chunk();
  w.chunks = t.chunks();
  w.last_error = t.last_error();
  for (const v1::LinkTelemetry& l : t.links()) {
    w.links.push_back(LinkTelemetry{l.peer(), l.bytes_sent(),
                                    l.bytes_received()});
  }
  return w;
}

EdgeHealth ToEdge(const v1::EdgeHealth& e) {
  EdgeHealth h;
  h.from = e.from();
  h.to = e.to();
  h.bytes = e.bytes();
  h.throughput_bps = e.throughput_bps();
  h.wait_seconds = e.wait_seconds();
  h.added_wait_seconds = e.added_wait_seconds();
  h.wait_p50_seconds = e.wait_p50_seconds();
  h.wait_p99_seconds = e.wait_p99_seconds();
  h.errors = e.errors();
  h.ring = e.ring();
  h.wire_seconds = e.wire_seconds();
  return h;
}

RankHealth ToRank(const v1::RankHealth& r) {
  RankHealth h;
  h.rank = r.rank();
  h.arrival_lag_p50_seconds = r.arrival_lag_p50_seconds();
  h.arrival_lag_p99_seconds = r.arrival_lag_p99_seconds();
  h.arrival_ops = r.arrival_ops();
  h.stall_seconds = r.stall_seconds();
  h.ring_seconds = r.ring_seconds();
  h.op_seconds = r.op_seconds();
  return h;
}

Diagnosis ToDiagnosis(const v1::Diagnosis& d) {
  Diagnosis h;
  h.has_straggler = d.has_straggler();
  h.straggler_rank = d.straggler_rank();
  h.slowest_from = d.slowest_from();
  h.slowest_to = d.slowest_to();
  h.summary = d.summary();
  h.failure = d.failure();
  h.late_rank = d.late_rank();
  h.stalled_rank = d.stalled_rank();
  return h;
}

}  // namespace

OpInfo ToOpInfo(const v1::OpStats& s) {
  OpInfo info;
  info.op_seq = s.op_seq();
  info.algorithm = s.algorithm();
  info.bytes_sent = s.bytes_sent();
  info.bytes_received = s.bytes_received();
  info.seconds = s.seconds();
  info.rank = s.rank();
  info.world_size = s.world_size();
  info.generation = s.generation();
  info.peer = s.peer();
  info.model_seconds = s.model_seconds();
  return info;
}

Member ToMember(const v1::Member& m) {
  Member out;
  out.rank = m.rank();
  out.worker_id = m.worker_id();
  out.address = m.address();
  out.alive = m.alive();
  out.last_heartbeat_age_s = m.last_heartbeat_age_s();
  out.device = m.device();
  out.since_generation = m.since_generation();
  out.host = m.host();
  return out;
}

WorkerInfo ToWorkerInfo(const v1::InfoReply& r) {
  WorkerInfo info;
  info.job_id = r.job_id();
  info.worker_id = r.worker_id();
  info.rank = r.rank();
  info.world_size = r.world_size();
  info.generation = r.generation();
  info.members = ToMembers(r.members());
  info.device = r.device();
  info.change = r.change();
  info.membership_generation = r.membership_generation();
  info.in_ring = r.in_ring();
  info.job_state = ToJobState(r.job_state());
  return info;
}

RingHealth ToRingHealth(const v1::RingHealth& r) {
  RingHealth h;
  h.job_id = r.job_id();
  h.generation = r.generation();
  h.world_size = r.world_size();
  h.min_world_size = r.min_world_size();
  h.max_world_size = r.max_world_size();
  h.job_state = ToJobState(r.job_state());
  h.failing = r.failing();
  h.change = r.change();
  h.members = ToMembers(r.members());
  h.lost = ToMembers(r.lost());
  for (const v1::WorkerTelemetry& t : r.telemetry()) {
    h.telemetry.push_back(ToTelemetry(t));
  }
  for (const v1::EdgeHealth& e : r.edges()) h.edges.push_back(ToEdge(e));
  for (const v1::RankHealth& k : r.ranks()) h.ranks.push_back(ToRank(k));
  h.diagnosis = ToDiagnosis(r.diagnosis());
  h.last_algorithm = r.last_algorithm();
  h.last_chunk_bytes = r.last_chunk_bytes();
  h.last_op_seconds = r.last_op_seconds();
  h.last_model_seconds = r.last_model_seconds();
  h.ring_order.assign(r.ring_order().begin(), r.ring_order().end());
  for (const v1::HostGroup& g : r.hosts()) {
    h.hosts.push_back(HostGroup{g.host(), {g.ranks().begin(), g.ranks().end()}});
  }
  if (r.has_link_model()) {
    h.link_model = DescribeLinkModel(LinkModelFromProto(r.link_model()));
  }
  return h;
}

}  // namespace halka
