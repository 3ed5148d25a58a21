#include "server/rendezvous_service.h"

#include "halka/v1/worker.grpc.pb.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "server/rendezvous_http.h"
#include "server/ring_diagnosis.h"

namespace halka {
namespace {

// A Join's log line names the members only up to this many (above it,
// counts: a line per Join that lists everyone grows the log as N^2).
constexpr size_t kJoinLogListed = 8;

void FillMember(const MemberView& m, v1::Member* out) {
  out->set_rank(m.rank);
  out->set_worker_id(m.worker_id);
  out->set_address(m.address);
  out->set_alive(m.alive);
  out->set_device(m.device);
  out->set_last_heartbeat_age_s(absl::ToDoubleSeconds(m.heartbeat_age));
  out->set_since_generation(m.since_generation);
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
}

RingClaim ClaimFrom(const v1::Membership& m) {
  RingClaim c;
  c.generation = m.generation();
  c.min_world_size = m.min_world_size();
  c.max_world_size = m.max_world_size();
  for (const v1::Member& x : m.members()) {
    MemberView v;
    v.rank = x.rank();
    v.worker_id = x.worker_id();
    v.address = x.address();
    v.device = x.device();
    v.since_generation = x.since_generation();
    c.members.push_back(std::move(v));
  }
  return c;
}

// Asks a suspect worker for its info with a short deadline: true when it
// answers (any answer but UNAVAILABLE / DEADLINE_EXCEEDED means alive).
bool Answers(const std::string& address, absl::Duration timeout,
             std::string* verdict) {
  auto stub = v1::Worker::NewStub(MakeChannel(address));
  grpc::ClientContext ctx;
  SetTimeout(ctx, timeout);
  v1::InfoReply reply;
  grpc::Status s = stub->GetInfo(&ctx, v1::InfoRequest(), &reply);
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    *verdict = absl::StrCat("probe of ", address, " failed: ",
                            s.error_code() == grpc::StatusCode::UNAVAILABLE
                                ? "unreachable"
                                : absl::StrCat("no answer within ",
                                               absl::FormatDuration(timeout)),
                            " (", s.error_message(), ")");
    return false;
  }
  *verdict = absl::StrCat("probe of ", address, " answered");
  return true;
}

}  // namespace

RendezvousService::RendezvousService(RendezvousOptions options)
    : state_(options), sweeper_([this] { SweepLoop(); }) {}

RendezvousService::~RendezvousService() {
  Stop();
  if (sweeper_.joinable()) sweeper_.join();
}

void RendezvousService::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (!stop_.HasBeenNotified()) stop_.Notify();
}

void RendezvousService::SweepLoop() {
  absl::Duration period;
  {
    absl::MutexLock lock(&mu_);
    period = state_.options().heartbeat_interval / 2;
  }
  while (!stop_.WaitForNotificationWithTimeout(period)) {
    absl::MutexLock lock(&mu_);
    for (const std::string& l : state_.Sweep(absl::Now())) {
      LogWarning(l);
      ++version_;
    }
  }
}

void RendezvousService::Publish() {
  for (const std::string& l : state_.TakeEvents()) LogInfo(l);
  ++version_;
}

grpc::Status RendezvousService::Join(grpc::ServerContext* ctx,
                                     const v1::JoinRequest* req,
                                     v1::JoinReply* reply) {
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  JoinArgs args;
  args.job_id = req->job_id();
  args.worker_id = req->worker_id();
  args.address = req->address();
  args.device = req->device();
  args.world_size = req->world_size();
  args.min_world_size = req->min_world_size();
  args.max_world_size = req->max_world_size();
  args.requested_rank = req->has_requested_rank() ? req->requested_rank() : -1;
  args.incarnation = req->incarnation();
  absl::Time deadline = absl::FromChrono(ctx->deadline());
  if (req->wait_timeout_ms() > 0) {
    deadline = std::min(deadline, absl::Now() + absl::Milliseconds(
                                                    req->wait_timeout_ms()));
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = state_.Join(args, absl::Now());
  if (!s.ok()) return ToGrpcStatus(s);
  LogInfo(absl::StrCat("join of ", args.worker_id, ": ",
                       state_.DescribeForming(args.job_id, kJoinLogListed)));
  Publish();
  std::optional<Assignment> a;
  auto formed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopping_ || ctx->IsCancelled()) return true;
    a = state_.GetAssignment(args.job_id, args.worker_id);
    return a.has_value();
  };
  // Wake at least every 100 ms to notice a cancelled call.
  while (!mu_.AwaitWithDeadline(absl::Condition(&formed),
                                std::min(deadline, absl::Now() +
                                                       absl::Milliseconds(100)))) {
    if (absl::Now() >= deadline) break;
  }
  if (!a.has_value()) {
    const std::string what = state_.DescribeForming(args.job_id);
    state_.WithdrawPending(args.job_id, args.worker_id);
    Publish();
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       "rendezvous is shutting down");
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("join timed out: ", what));
  }
  reply->set_rank(a->rank);
  reply->set_world_size(a->view.world_size);
  reply->set_generation(a->view.generation);
  for (const MemberView& m : a->view.members) {
    FillMember(m, reply->add_members());
  }
  FillMembership(args.job_id, a->view, reply->mutable_membership());
  reply->set_heartbeat_interval_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(state_.options().heartbeat_interval)));
  reply->set_heartbeat_timeout_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(state_.options().heartbeat_timeout)));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Heartbeat(grpc::ServerContext* ctx,
                                          const v1::HeartbeatRequest* req,
                                          v1::HeartbeatReply* reply) {
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  if (req->job_id().empty() || req->worker_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "heartbeat: job_id and worker_id are required");
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  auto r = state_.Heartbeat(req->job_id(), req->worker_id(),
                            req->telemetry().SerializeAsString(), now);
  if (r.status().code() == absl::StatusCode::kNotFound && req->has_claim()) {
    // This rendezvous restarted (or forgot the job): rebuild it from the
    // worker's view, at the worker's generation.
    absl::Status restored =
        state_.Restore(req->job_id(), ClaimFrom(req->claim()), now);
    if (!restored.ok()) return ToGrpcStatus(restored);
    Publish();
    r = state_.Heartbeat(req->job_id(), req->worker_id(),
                         req->telemetry().SerializeAsString(), now);
  }
  if (!r.ok()) return ToGrpcStatus(r.status());
  reply->set_generation(r->generation);
  for (int d : r->dead_ranks) reply->add_dead_ranks(d);
  if (r->generation != req->generation()) {
    auto view = state_.Health(req->job_id(), now);
    if (view.ok()) FillMembership(req->job_id(), *view,
                                  reply->mutable_membership());
  }
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Leave(grpc::ServerContext* ctx,
                                      const v1::LeaveRequest* req,
                                      v1::LeaveReply*) {
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  if (req->job_id().empty() || req->worker_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "leave: job_id and worker_id are required");
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = state_.Leave(req->job_id(), req->worker_id(), absl::Now());
  if (s.ok()) Publish();
  return ToGrpcStatus(s);
}

grpc::Status RendezvousService::Watch(
    grpc::ServerContext* ctx, const v1::WatchRequest* req,
    grpc::ServerWriter<v1::Membership>* writer) {
  if (req->job_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "watch: job_id is required");
  }
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  StreamLimiter::Scoped counted(watches_, ctx->peer());
  if (!counted.status().ok()) return ToGrpcStatus(counted.status());
  uint64_t sent = req->known_generation();
  for (;;) {
    v1::Membership update;
    {
      absl::MutexLock lock(&mu_);
      auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || ctx->IsCancelled() ||
               state_.Generation(req->job_id()) != sent;
      };
      // Wake every 200 ms to notice a cancelled call.
      mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Milliseconds(200));
      if (stopping_) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "rendezvous is shutting down");
      }
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
      auto view = state_.Health(req->job_id(), absl::Now());
      if (!view.ok()) {
        if (sent == 0 || view.status().code() != absl::StatusCode::kNotFound) {
          return ToGrpcStatus(view.status());
        }
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("watch: job ", req->job_id(),
                                         " is gone"));
      }
      if (view->generation == sent) continue;
      sent = view->generation;
      FillMembership(req->job_id(), *view, &update);
    }
    if (!writer->Write(update)) return grpc::Status::CANCELLED;
  }
}

grpc::Status RendezvousService::ReportFailure(
    grpc::ServerContext* ctx, const v1::ReportFailureRequest* req,
    v1::ReportFailureReply* reply) {
  if (req->job_id().empty() || req->worker_id().empty() ||
      req->suspect_worker_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "report: job_id, worker_id and suspect are required");
  }
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  std::string address;
  {
    absl::MutexLock lock(&mu_);
    if (state_.Generation(req->job_id()) != req->generation()) {
      reply->set_verdict("stale report: the generation already changed");
      return grpc::Status::OK;
    }
    address = state_.AddressOf(req->job_id(), req->suspect_worker_id());
  }
  if (address.empty()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("report: ", req->suspect_worker_id(),
                                     " is not a live member of job ",
                                     req->job_id()));
  }
  // The reporter's word alone is not enough (a partition between two
  // healthy workers must not evict one): probe the suspect, outside the
  // lock.
  std::string verdict;
  const bool alive = Answers(address, absl::Seconds(1), &verdict);
  reply->set_verdict(verdict);
  if (alive) return grpc::Status::OK;
  absl::MutexLock lock(&mu_);
  absl::Status s = state_.DeclareLost(
      req->job_id(), req->suspect_worker_id(), req->generation(),
      absl::StrCat("lost: ", req->worker_id(), " reported its link broken (",
                   req->reason().substr(0, 200), "); ", verdict),
      absl::Now());
  if (s.ok()) {
    reply->set_declared_lost(true);
    Publish();
  }
  return grpc::Status::OK;
}

grpc::Status RendezvousService::GetRingHealth(grpc::ServerContext* ctx,
                                              const v1::RingHealthRequest* req,
                                              v1::RingHealth* reply) {
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  return BuildHealth(req, reply);
}

std::vector<std::string> RendezvousService::JobIds() {
  absl::MutexLock lock(&mu_);
  return state_.JobIds();
}

grpc::Status RendezvousService::BuildHealth(const v1::RingHealthRequest* req,
                                            v1::RingHealth* reply) {
  if (req->job_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "health: job_id is required");
  }
  absl::MutexLock lock(&mu_);
  auto h = state_.Health(req->job_id(), absl::Now());
  if (!h.ok()) return ToGrpcStatus(h.status());
  reply->set_job_id(req->job_id());
  reply->set_job_state(ToProto(h->state));
  reply->set_generation(h->generation);
  reply->set_world_size(h->world_size);
  reply->set_min_world_size(h->min_world_size);
  reply->set_max_world_size(h->max_world_size);
  reply->set_change(h->change);
  for (const MemberView& m : h->lost) FillMember(m, reply->add_lost());
  std::vector<RankInput> inputs;
  std::vector<LastOpInput> last_ops;
  std::vector<std::vector<ArrivalInput>> arrivals(
      static_cast<size_t>(std::max(h->world_size, 0)));
  double window_s = 0;
  for (const MemberView& m : h->members) {
    FillMember(m, reply->add_members());
    v1::WorkerTelemetry* t = reply->add_telemetry();
    if (!m.telemetry.empty()) t->ParseFromString(m.telemetry);
    if (!t->last_algorithm().empty()) {
      reply->set_last_algorithm(t->last_algorithm());
      reply->set_last_chunk_bytes(t->last_chunk_bytes());
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
    if (m.rank >= 0 && m.rank < h->world_size) {
      auto& mine = arrivals[static_cast<size_t>(m.rank)];
      for (const v1::OpArrival& a : t->arrivals()) {
        mine.push_back({a.generation(), a.op_seq(), a.start_unix_us(),
                        a.end_unix_us()});
      }
      window_s = std::max(window_s, t->window_seconds());
    }
    for (const v1::EdgeTelemetry& e : t->window().edges()) {
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
      in.edges.push_back(x);
    }
    inputs.push_back(std::move(in));
  }
  const std::vector<ArrivalLag> lags = ArrivalLags(
      h->world_size, arrivals,
      absl::ToUnixMicros(absl::Now() - absl::Seconds(window_s)));
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
  const RingDiagnosis d = DiagnoseRing(h->world_size, inputs);
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
  diag->set_failure(DiagnoseFailures(std::move(last_ops)));
  reply->set_failing(!diag->failure().empty());
  return grpc::Status::OK;
}

grpc::Status RendezvousService::RegisterServer(
    grpc::ServerContext* ctx, const v1::RegisterServerRequest* req,
    v1::RegisterServerReply*) {
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return ToGrpcStatus(state_.RegisterServer(req->job_id(), req->server_id(),
                                            req->address(), req->shard(),
                                            req->shards(), absl::Now()));
}

grpc::Status RendezvousService::LookupServers(
    grpc::ServerContext* ctx, const v1::LookupServersRequest* req,
    v1::LookupServersReply* reply) {
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req->job_id()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto servers = state_.LookupServers(req->job_id(), absl::Now());
  if (!servers.ok()) return ToGrpcStatus(servers.status());
  for (const MemberView& m : *servers) FillMember(m, reply->add_servers());
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    const std::string& listen, RendezvousOptions options, int metrics_port) {
  auto creds = ServerCredentialsFor(listen, ServerRole::kMultiJob);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<RendezvousServer> s(new RendezvousServer());
  s->service_ = std::make_unique<RendezvousService>(options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(builder);
  int port = 0;
  builder.AddListeningPort(listen, *creds, &port);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous: cannot listen on ", listen));
  }
  s->address_ = DialableAddress(listen, port, "");
  if (metrics_port != 0) {
    const std::string host = listen.substr(0, listen.rfind(':'));
    auto handlers = RendezvousHttpHandlers(s->service_.get());
    auto http = StartDaemonHttp("rendezvous", host.empty() ? "0.0.0.0" : host,
                                metrics_port, std::move(handlers));
    if (!http.ok()) return http.status();
    s->http_ = std::move(*http);
  }
  return s;
}

std::string RendezvousServer::metrics_address() const {
  return http_ ? http_->address() : "";
}

RendezvousServer::~RendezvousServer() { Shutdown(); }

void RendezvousServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  service_->Stop();
  if (http_) http_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(200));
}

}  // namespace halka
