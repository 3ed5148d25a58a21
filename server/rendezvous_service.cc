#include "server/rendezvous_service.h"

#include "halka/v1/worker.grpc.pb.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "codec/membership_codec.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "server/rendezvous_calls.h"
#include "server/rendezvous_http.h"
#include "server/rendezvous_report.h"

namespace halka {
namespace {

// A Join's log line names the members only up to this many (above it,
// counts: a line per Join that lists everyone grows the log as N^2).
constexpr size_t kJoinLogListed = 8;

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
    v.host = x.host();
    c.members.push_back(std::move(v));
  }
  if (m.has_link_model()) c.link_model = LinkModelFromProto(m.link_model());
  c.probe_links = m.probe_links();
  return c;
}

bool ParseMessage(const grpc::ByteBuffer& bytes,
                  google::protobuf::MessageLite* message) {
  std::vector<grpc::Slice> slices;
  if (!bytes.Dump(&slices).ok()) return false;
  std::string flat;
  for (const grpc::Slice& s : slices) {
    flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return message->ParseFromString(flat);
}

// Appends the key and length of a length-delimited field (its bytes follow,
// e.g. in another slice of the same message).
void AppendTag(int field, size_t length, std::string* out) {
  auto varint = [out](uint64_t v) {
    while (v >= 0x80) {
      out->push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out->push_back(static_cast<char>(v));
  };
  varint(static_cast<uint64_t>(field) << 3 | 2);  // wire type 2
  varint(length);
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
    Publish();
  }
  Deliver();
  if (!stop_.HasBeenNotified()) stop_.Notify();
}

void RendezvousService::SweepLoop() {
  absl::Duration period;
  {
    absl::MutexLock lock(&mu_);
    period = state_.options().heartbeat_interval / 2;
  }
  // Wakes every 100 ms for the joins whose wait ran out; sweeps every half
  // heartbeat interval.
  const absl::Duration tick = std::min(period, absl::Milliseconds(100));
  absl::Time next_sweep = absl::Now() + period;
  // Paced Join answers wait for beats, or at most join_answer_ack_wait.
  auto wait = [&] {
    absl::MutexLock lock(&mu_);
    return paced_.empty()
               ? tick
               : std::min(tick, std::max(absl::Milliseconds(5),
                                         state_.options().join_answer_ack_wait / 4));
  };
  while (!stop_.WaitForNotificationWithTimeout(wait())) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      ExpireJoins(now);
      if (now >= next_sweep) {
        next_sweep = now + period;
        for (const std::string& l : state_.Sweep(now)) {
          LogWarning(l);
          ++version_;
        }
      }
      Publish();
    }
    Deliver();
  }
}

void RendezvousService::ExpireJoins(absl::Time now) {
  for (auto& [job_id, calls] : joins_) {
    auto expired = std::stable_partition(
        calls.begin(), calls.end(),
        [&](JoinCall* c) { return c->deadline > now; });
    for (auto it = expired; it != calls.end(); ++it) {
      JoinCall* c = *it;
      // Names up to 64 members: every blocked Join of a large job may time
      // out at once.
      const std::string what = state_.DescribeForming(job_id, 64);
      state_.WithdrawPending(job_id, c->args.worker_id);
      outbox_.answers.push_back(
          {c, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                           absl::StrCat("join timed out: ", what)),
           grpc::Slice(), -1});
    }
    calls.erase(expired, calls.end());
  }
}

void RendezvousService::CancelJoin(JoinCall* call) {
  {
    absl::MutexLock lock(&mu_);
    auto it = joins_.find(call->args.job_id);
    if (it == joins_.end()) return;
    auto& calls = it->second;
    auto at = std::find(calls.begin(), calls.end(), call);
    if (at == calls.end()) return;  // already answered
    calls.erase(at);
    state_.WithdrawPending(call->args.job_id, call->args.worker_id);
    outbox_.answers.push_back(
        {call, grpc::Status::CANCELLED, grpc::Slice(), -1});
    Publish();
  }
  Deliver();
}

void RendezvousService::JoinReturned(const JoinArgs& args) {
  absl::MutexLock lock(&mu_);
  state_.JoinReturned(args.job_id, args.worker_id, absl::Now());
}

void RendezvousService::DropWatch(WatchCall* call) {
  std::shared_ptr<WatchCall> last;  // dies after the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = watchers_.find(call->job_id);
    if (it != watchers_.end()) {
      auto& calls = it->second;
      auto at = std::find_if(calls.begin(), calls.end(),
                             [&](const auto& c) { return c.get() == call; });
      if (at != calls.end()) {
        last = std::move(*at);
        calls.erase(at);
        auto w = watching_.find({call->job_id, call->worker_id});
        if (w != watching_.end() && --w->second == 0) watching_.erase(w);
      }
      if (calls.empty()) watchers_.erase(it);
    }
  }
  if (call->counted) watches_.Release(call->peer);
}

grpc::ServerUnaryReactor* RendezvousService::Join(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* reply) {
  auto* call = new JoinCall(this, reply);
  v1::JoinRequest req;
  if (!ParseMessage(*request, &req)) {
    call->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "join: the request is not a JoinRequest"));
    return call;
  }
  if (grpc::Status s = CheckCallJobGrpc(*ctx, req.job_id()); !s.ok()) {
    call->Finish(s);
    return call;
  }
  JoinArgs& args = call->args;
  args.job_id = req.job_id();
  args.worker_id = req.worker_id();
  args.address = req.address();
  args.device = req.device();
  args.world_size = req.world_size();
  args.min_world_size = req.min_world_size();
  args.max_world_size = req.max_world_size();
  args.requested_rank = req.has_requested_rank() ? req.requested_rank() : -1;
  args.incarnation = req.incarnation();
  args.host = req.host();
  call->compact = req.compact_membership();
  const absl::Time now = absl::Now();
  call->deadline = absl::FromChrono(ctx->deadline());
  if (req.wait_timeout_ms() > 0) {
    call->deadline = std::min(call->deadline,
                              now + absl::Milliseconds(req.wait_timeout_ms()));
  }
  grpc::Status refused;
  grpc::Slice answer;
  int rank = -1;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = stopping_ ? absl::UnavailableError(
                                     "rendezvous is shutting down")
                               : state_.Join(args, now);
    if (!s.ok()) {
      refused = ToGrpcStatus(s);
    } else {
      LogInfo(absl::StrCat("join of ", args.worker_id, ": ",
                           state_.DescribeForming(args.job_id, kJoinLogListed)));
      Publish();  // answers the others when this Join formed the ring
      rank = state_.AssignedRank(args.job_id, args.worker_id);
      if (rank >= 0) {
        answer = JoinReplyOf(args.job_id, *state_.AssignmentView(args.job_id),
                             call->compact);
      } else {
        joins_[args.job_id].push_back(call);
      }
    }
  }
  Deliver();
  if (!refused.ok()) {
    call->Finish(refused);
  } else if (rank >= 0) {
    call->Answer(answer, rank);
  }
  return call;
}

grpc::ServerUnaryReactor* RendezvousService::Heartbeat(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* reply) {
  grpc::ServerUnaryReactor* call = ctx->DefaultReactor();
  v1::HeartbeatRequest req;
  grpc::Status s;
  if (!ParseMessage(*request, &req)) {
    s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "heartbeat: the request is not a HeartbeatRequest");
  } else {
    s = CheckCallJobGrpc(*ctx, req.job_id());
  }
  if (s.ok() && (req.job_id().empty() || req.worker_id().empty())) {
    s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "heartbeat: job_id and worker_id are required");
  }
  if (s.ok()) {
    const std::string telemetry = req.telemetry().SerializeAsString();
    v1::HeartbeatReply own;
    grpc::Slice membership;
    {
      absl::MutexLock lock(&mu_);
      s = HeartbeatLocked(req, telemetry, &own);
      // The member has its ring: its place in the answer window frees.
      if (s.ok() && !unacked_.empty()) {
        unacked_.erase({req.job_id(), req.worker_id()});
      }
      // A member behind the current generation gets the membership: the
      // generation's shared bytes as field 3, not a copy per member. Not
      // when its Watch stream was handed this generation already (half the
      // bytes of a change at N members).
      if (s.ok() && own.generation() != req.generation() &&
          !WatchHas(req.job_id(), req.worker_id(), own.generation())) {
        membership = MembershipOf(req.job_id());
      }
    }
    Deliver();
    if (s.ok()) {
      std::string head = own.SerializeAsString();
      if (membership.size() > 0) {
        AppendTag(v1::HeartbeatReply::kMembershipFieldNumber,
                  membership.size(), &head);
      }
      const grpc::Slice parts[2] = {grpc::Slice(head), membership};
      *reply = grpc::ByteBuffer(parts, membership.size() > 0 ? 2 : 1);
    }
  }
  call->Finish(s);
  return call;
}

grpc::Status RendezvousService::HeartbeatLocked(
    const v1::HeartbeatRequest& req, const std::string& telemetry,
    v1::HeartbeatReply* reply) {
  const absl::Time now = absl::Now();
  auto r = state_.Heartbeat(req.job_id(), req.worker_id(), telemetry, now);
  if (r.status().code() == absl::StatusCode::kNotFound && req.has_claim()) {
    // This rendezvous restarted (or forgot the job): rebuild it from the
    // worker's view, at the worker's generation.
    absl::Status restored =
        state_.Restore(req.job_id(), ClaimFrom(req.claim()), now);
    if (!restored.ok()) return ToGrpcStatus(restored);
    Publish();
    r = state_.Heartbeat(req.job_id(), req.worker_id(), telemetry, now);
  }
  if (!r.ok()) return ToGrpcStatus(r.status());
  if (req.generation() > r->generation &&
      state_.CatchUp(req.job_id(), req.worker_id(), req.generation())) {
    // A member ahead of a restored job (its first claim was stale): a
    // ring with a number of its own for everyone, not two rings under one.
    Publish();
    r = state_.Heartbeat(req.job_id(), req.worker_id(), telemetry, now);
    if (!r.ok()) return ToGrpcStatus(r.status());
  }
  if (req.has_link_probe()) {
    const v1::LinkProbe& p = req.link_probe();
    LinkProbeReport report;
    report.generation = p.generation();
    report.local = LevelCost{p.local_alpha_us() * 1e-6, p.local_bytes_per_s()};
    report.local_edges = p.local_edges();
    report.net = LevelCost{p.net_alpha_us() * 1e-6, p.net_bytes_per_s()};
    report.net_edges = p.net_edges();
    report.error = p.error().substr(0, 300);
    const std::string line =
        state_.ReportLinkProbe(req.job_id(), req.worker_id(), report, now);
    if (!line.empty()) {
      LogInfo(line);
      Publish();
      r = state_.Heartbeat(req.job_id(), req.worker_id(), telemetry, now);
      if (!r.ok()) return ToGrpcStatus(r.status());
    }
  }
  reply->set_generation(r->generation);
  for (int d : r->dead_ranks) reply->add_dead_ranks(d);
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
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    s = state_.Leave(req->job_id(), req->worker_id(), absl::Now());
    if (s.ok()) Publish();
  }
  Deliver();
  return ToGrpcStatus(s);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RendezvousService::Watch(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  v1::WatchRequest req;
  const bool parsed = ParseMessage(*request, &req);
  auto call = std::make_shared<WatchCall>(this, req.job_id(), req.worker_id(),
                                         ctx->peer(), req.deltas(),
                                         req.known_generation());
  grpc::Status refused;
  if (!parsed) {
    refused = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           "watch: the request is not a WatchRequest");
  } else if (req.job_id().empty()) {
    refused = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           "watch: job_id is required");
  } else {
    refused = CheckCallJobGrpc(*ctx, req.job_id());
  }
  if (refused.ok()) {
    refused = ToGrpcStatus(watches_.Acquire(call->peer));
    call->counted = refused.ok();
  }
  if (refused.ok()) {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      refused = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             "rendezvous is shutting down");
    } else if (!state_.HasJob(req.job_id())) {
      refused = ToGrpcStatus(state_.Health(req.job_id(), absl::Now()).status());
      if (req.known_generation() != 0) {
        refused = grpc::Status(grpc::StatusCode::NOT_FOUND,
                               absl::StrCat("watch: job ", req.job_id(),
                                            " is gone"));
      }
    } else {
      watchers_[req.job_id()].push_back(call);
      ++watching_[{req.job_id(), req.worker_id()}];
      // The first message: the current membership, unless the watcher
      // knows it already.
      const uint64_t g = state_.Generation(req.job_id());
      published_.emplace(req.job_id(), g);
      if (g != req.known_generation()) {
        outbox_.updates.push_back(UpdateFor(req.job_id(), call));
      }
    }
  }
  WatchCall* raw = call.get();
  raw->Hold(std::move(call));
  if (!refused.ok()) raw->End(refused);  // OnDone releases the place
  Deliver();
  return raw;
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
  absl::ReleasableMutexLock lock(&mu_);
  absl::Status s = state_.DeclareLost(
      req->job_id(), req->suspect_worker_id(), req->generation(),
      absl::StrCat("lost: ", req->worker_id(), " reported its link broken (",
                   req->reason().substr(0, 200), "); ", verdict),
      absl::Now());
  if (s.ok()) {
    reply->set_declared_lost(true);
    Publish();
  }
  lock.Release();
  Deliver();
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
  absl::StatusOr<MembershipView> h;
  {
    absl::MutexLock lock(&mu_);
    h = state_.Health(req->job_id(), absl::Now());
  }
  if (!h.ok()) return ToGrpcStatus(h.status());
  // The view is a copy: the telemetry parsing and the diagnosis run
  // without the lock, so a health poll does not hold up heartbeats.
  FillRingHealth(req->job_id(), *h, absl::Now(), reply);
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
