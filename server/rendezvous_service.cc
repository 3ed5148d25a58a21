#include "server/rendezvous_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"

namespace halka {
namespace {

void FillMember(const MemberView& m, v1::Member* out) {
  out->set_rank(m.rank);
  out->set_worker_id(m.worker_id);
  out->set_address(m.address);
  out->set_alive(m.alive);
  out->set_device(m.device);
  out->set_last_heartbeat_age_s(absl::ToDoubleSeconds(m.heartbeat_age));
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
    std::vector<std::string> lines;
    {
      absl::MutexLock lock(&mu_);
      lines = state_.Sweep(absl::Now());
      if (!lines.empty()) ++version_;
    }
    for (const auto& l : lines) LogWarning(l);
  }
}

grpc::Status RendezvousService::Join(grpc::ServerContext* ctx,
                                     const v1::JoinRequest* req,
                                     v1::JoinReply* reply) {
  JoinArgs args;
  args.job_id = req->job_id();
  args.worker_id = req->worker_id();
  args.address = req->address();
  args.device = req->device();
  args.world_size = req->world_size();
  args.requested_rank = req->has_requested_rank() ? req->requested_rank() : -1;
  absl::Time deadline = absl::FromChrono(ctx->deadline());
  if (req->wait_timeout_ms() > 0) {
    deadline = std::min(deadline, absl::Now() + absl::Milliseconds(
                                                    req->wait_timeout_ms()));
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = state_.Join(args, absl::Now());
  if (!s.ok()) return ToGrpcStatus(s);
  ++version_;
  LogInfo(absl::StrCat("join: ", state_.DescribeForming(args.job_id)));
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
    ++version_;
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       "rendezvous is shutting down");
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("join timed out: ", what));
  }
  reply->set_rank(a->rank);
  reply->set_world_size(a->world_size);
  reply->set_generation(a->generation);
  for (const MemberView& m : a->members) FillMember(m, reply->add_members());
  reply->set_heartbeat_interval_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(state_.options().heartbeat_interval)));
  reply->set_heartbeat_timeout_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(state_.options().heartbeat_timeout)));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Heartbeat(grpc::ServerContext*,
                                          const v1::HeartbeatRequest* req,
                                          v1::HeartbeatReply* reply) {
  if (req->job_id().empty() || req->worker_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "heartbeat: job_id and worker_id are required");
  }
  absl::MutexLock lock(&mu_);
  auto r = state_.Heartbeat(req->job_id(), req->worker_id(),
                            req->telemetry().SerializeAsString(), absl::Now());
  if (!r.ok()) return ToGrpcStatus(r.status());
  reply->set_generation(r->generation);
  for (int d : r->dead_ranks) reply->add_dead_ranks(d);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Leave(grpc::ServerContext*,
                                      const v1::LeaveRequest* req,
                                      v1::LeaveReply*) {
  if (req->job_id().empty() || req->worker_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "leave: job_id and worker_id are required");
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = state_.Leave(req->job_id(), req->worker_id(), absl::Now());
  if (s.ok()) {
    ++version_;
    LogInfo(absl::StrCat("job ", req->job_id(), ": worker ", req->worker_id(),
                         " left"));
  }
  return ToGrpcStatus(s);
}

grpc::Status RendezvousService::GetRingHealth(grpc::ServerContext*,
                                              const v1::RingHealthRequest* req,
                                              v1::RingHealth* reply) {
  if (req->job_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "health: job_id is required");
  }
  absl::MutexLock lock(&mu_);
  auto h = state_.Health(req->job_id(), absl::Now());
  if (!h.ok()) return ToGrpcStatus(h.status());
  reply->set_job_id(req->job_id());
  reply->set_state(h->state);
  reply->set_generation(h->generation);
  reply->set_world_size(h->world_size);
  for (const MemberView& m : h->members) {
    FillMember(m, reply->add_members());
    v1::WorkerTelemetry* t = reply->add_telemetry();
    if (!m.telemetry.empty()) t->ParseFromString(m.telemetry);
  }
  return grpc::Status::OK;
}

grpc::Status RendezvousService::RegisterServer(
    grpc::ServerContext*, const v1::RegisterServerRequest* req,
    v1::RegisterServerReply*) {
  absl::MutexLock lock(&mu_);
  return ToGrpcStatus(state_.RegisterServer(req->job_id(), req->server_id(),
                                            req->address(), req->shard(),
                                            req->shards(), absl::Now()));
}

grpc::Status RendezvousService::LookupServers(
    grpc::ServerContext*, const v1::LookupServersRequest* req,
    v1::LookupServersReply* reply) {
  absl::MutexLock lock(&mu_);
  auto servers = state_.LookupServers(req->job_id(), absl::Now());
  if (!servers.ok()) return ToGrpcStatus(servers.status());
  for (const MemberView& m : *servers) FillMember(m, reply->add_servers());
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    const std::string& listen, RendezvousOptions options) {
  std::unique_ptr<RendezvousServer> s(new RendezvousServer());
  s->service_ = std::make_unique<RendezvousService>(options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(builder);
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous: cannot listen on ", listen));
  }
  s->address_ = DialableAddress(listen, port, "");
  return s;
}

RendezvousServer::~RendezvousServer() { Shutdown(); }

void RendezvousServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  service_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(200));
}

}  // namespace halka
