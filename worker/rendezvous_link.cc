#include "worker/rendezvous_link.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "codec/membership_codec.h"
#include "worker/host_identity.h"

namespace halka {

RendezvousLink::RendezvousLink(const WorkerOptions& options, const Logger& log,
                               std::string address, uint64_t incarnation,
                               Callbacks callbacks)
    : options_(options),
      log_(log),
      address_(std::move(address)),
      incarnation_(incarnation),
      host_(ResolveHostId(options.host_id)),
      callbacks_(std::move(callbacks)),
      stub_(v1::Rendezvous::NewStub(
          options.security.has_value()
              ? MakeChannel(options.rendezvous, *options.security)
              : MakeChannel(options.rendezvous))) {}

RendezvousLink::~RendezvousLink() { Stop(); }

bool RendezvousLink::Track(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  calls_.insert(ctx);
  return true;
}

void RendezvousLink::Untrack(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  calls_.erase(ctx);
}

absl::Status RendezvousLink::Join(absl::Time deadline, v1::JoinReply* reply) {
  const WorkerOptions& o = options_;
  v1::JoinRequest req;
  req.set_job_id(o.job_id);
  req.set_worker_id(o.worker_id);
  req.set_address(address_);
  req.set_world_size(o.max_world_size > 0 ? o.max_world_size : o.world_size);
  req.set_min_world_size(o.min_world_size);
  req.set_max_world_size(o.max_world_size);
  req.set_incarnation(incarnation_);
  req.set_device(o.device);
  req.set_host(host_);
  // The ring comes deflated (a 1,024-member ring is ~6 KB, not ~45 KB):
  // every member's Join reply of a formation carries it.
  req.set_compact_membership(true);
  if (o.requested_rank >= 0) {
    req.set_requested_rank(o.requested_rank);
    req.set_has_requested_rank(true);
  }
  // The rendezvous may start after the workers, or still hold this
  // worker's previous process: retry until the deadline.
  grpc::Status s;
  bool said = false;
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    req.set_wait_timeout_ms(static_cast<uint32_t>(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(left))));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline + absl::Seconds(2)));
    ctx.set_wait_for_ready(true);
    if (!Track(&ctx)) {
      return absl::UnavailableError("worker is shutting down");
    }
    s = stub_->Join(&ctx, req, reply);
    Untrack(&ctx);
    const bool retry = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       s.error_code() == grpc::StatusCode::ALREADY_EXISTS;
    if (!retry || absl::Now() >= deadline || stop_.HasBeenNotified()) break;
    if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS && !said) {
      log_.Warning(absl::StrCat(s.error_message(), "; retrying until ",
                              absl::FormatTime("%H:%M:%S", deadline,
                                               absl::UTCTimeZone())));
      said = true;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  absl::Status st = FromGrpcStatus(s);
  if (st.ok() && !reply->membership_deflate().empty()) {
    absl::StatusOr<v1::Membership> m =
        InflateMembership(reply->membership_deflate());
    if (m.ok()) {
      *reply->mutable_membership() = *std::move(m);
      reply->clear_membership_deflate();
    } else {
      st = absl::InternalError(absl::StrCat("the reply's ring: ",
                                            m.status().message()));
    }
  }
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("worker ", o.worker_id,
                                                ": join of job ", o.job_id,
                                                " at ", o.rendezvous,
                                                " failed: ", st.message()));
  }
  return absl::OkStatus();
}

void RendezvousLink::Start(absl::Duration interval) {
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
    interval_ = interval;
  }
  heartbeat_ = std::thread([this, interval] { HeartbeatLoop(interval); });
  watch_ = std::thread([this] { WatchLoop(); });
  background_ = std::thread([this] { BackgroundLoop(); });
}

void RendezvousLink::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
  }
  for (std::thread* t : {&heartbeat_, &watch_, &background_}) {
    if (t->joinable()) t->join();
  }
}

void RendezvousLink::Leave() {
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Milliseconds(300));
  v1::LeaveRequest req;
  req.set_job_id(options_.job_id);
  req.set_worker_id(options_.worker_id);
  v1::LeaveReply reply;
  stub_->Leave(&ctx, req, &reply).IgnoreError();
}

void RendezvousLink::Report(LinkReport report) {
  absl::MutexLock lock(&mu_);
  reports_.push_back(std::move(report));
}

void RendezvousLink::RequestRejoin() {
  absl::MutexLock lock(&mu_);
  rejoin_ = true;
}

v1::HeartbeatRequest RendezvousLink::HeartbeatAt(uint64_t generation) const {
  v1::HeartbeatRequest req;
  req.set_job_id(options_.job_id);
  req.set_worker_id(options_.worker_id);
  req.set_incarnation(incarnation_);
  req.set_generation(generation);
  return req;
}

std::optional<v1::Membership> RendezvousLink::FetchMembership(uint64_t known) {
  const v1::HeartbeatRequest req = HeartbeatAt(known);
  v1::HeartbeatReply reply;
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(2));
  if (stub_->Heartbeat(&ctx, req, &reply).ok() && reply.has_membership()) {
    return reply.membership();
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<PeerInfo>> RendezvousLink::LookupServers(
    std::string* message) {
  v1::LookupServersRequest req;
  req.set_job_id(options_.job_id);
  v1::LookupServersReply reply;
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(2));
  grpc::Status s = stub_->LookupServers(&ctx, req, &reply);
  if (!s.ok()) {
    *message = s.error_message();
    return FromGrpcStatus(s);
  }
  std::vector<PeerInfo> servers;
  for (const v1::Member& m : reply.servers()) {
    servers.push_back(PeerInfo{m.rank(), m.worker_id(), m.address()});
  }
  return servers;
}

grpc::Status RendezvousLink::GetRingHealth(const v1::RingHealthRequest& req,
                                           v1::RingHealth* reply) {
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(5));
  return stub_->GetRingHealth(&ctx, req, reply);
}

void RendezvousLink::ReportLinkProbe(v1::LinkProbe probe) {
  absl::MutexLock lock(&mu_);
  probe_ = std::move(probe);
  ++beats_wanted_;  // the heartbeat thread sends it now
}

void RendezvousLink::BeatNow() {
  absl::MutexLock lock(&mu_);
  if (!started_ || stopping_) return;
  const uint64_t ticket = ++beats_wanted_;
  auto carried = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || beats_done_ >= ticket;
  };
  mu_.AwaitWithTimeout(absl::Condition(&carried),
                       std::min(interval_, absl::Seconds(1)));
}

bool RendezvousLink::AwaitBeat(absl::Duration interval) {
  absl::MutexLock lock(&mu_);
  auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || beats_wanted_ > beats_done_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&due), interval);
  return !stopping_;
}

void RendezvousLink::HeartbeatLoop(absl::Duration interval) {
  // The first beat goes at once: the rendezvous counts a member alive from
  // its last beat, and the world may have taken long to form.
  bool now_again = true;
  while (now_again || AwaitBeat(interval)) {
    now_again = false;
    if (stop_.HasBeenNotified()) break;
    const Next next = Beat(interval);
    if (next == Next::kStop) break;
    now_again = next == Next::kAgain;
  }
}

RendezvousLink::Next RendezvousLink::Beat(absl::Duration interval) {
  v1::HeartbeatRequest req = HeartbeatAt(callbacks_.known_generation());
  bool claiming;
  uint64_t carries;  // read before the telemetry: it carries these changes
  {
    absl::MutexLock lock(&mu_);
    claiming = claim_;
    carries = beats_wanted_;
    if (probe_.has_value() && probe_->generation() == req.generation()) {
      *req.mutable_link_probe() = *probe_;
    }
  }
  if (claiming) {
    std::optional<v1::Membership> claim = callbacks_.claimable();
    claiming = claim.has_value();
    if (claiming) *req.mutable_claim() = *claim;
  }
  *req.mutable_telemetry() = callbacks_.telemetry();
  v1::HeartbeatReply reply;
  grpc::ClientContext ctx;
  SetTimeout(ctx, std::max(interval, absl::Seconds(1)));
  if (!Track(&ctx)) return Next::kStop;  // Stop cancels a beat in flight
  grpc::Status s = stub_->Heartbeat(&ctx, req, &reply);
  Untrack(&ctx);
  {
    absl::MutexLock lock(&mu_);
    beats_done_ = std::max(beats_done_, carries);
  }
  if (s.ok()) {
    {
      absl::MutexLock lock(&mu_);
      if (claim_) log_.Info("the rendezvous knows this ring again");
      claim_ = false;
    }
    if (reply.has_membership()) callbacks_.on_membership(reply.membership());
    return Next::kWait;
  }
  return OnBeatError(s, claiming, req.generation(), interval);
}

RendezvousLink::Next RendezvousLink::OnBeatError(const grpc::Status& s,
                                                 bool claiming,
                                                 uint64_t generation,
                                                 absl::Duration interval) {
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    absl::MutexLock lock(&mu_);
    if (claiming) {
      rejoin_ = true;  // the claim was refused: join as a new member
      return Next::kWait;
    }
    // The rendezvous restarted (or dropped the job during a partition):
    // tell it what the ring is, right away.
    log_.Warning(absl::StrCat("the rendezvous does not know this worker (",
                              s.error_message(), "): re-registering with "
                              "generation ", generation));
    claim_ = true;
    return Next::kAgain;
  }
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    {
      absl::MutexLock lock(&mu_);
      if (!rejoin_) log_.Warning(s.error_message());
      rejoin_ = true;
    }
    callbacks_.on_declared_lost(s.error_message());
    return Next::kWait;
  }
  // The rendezvous is down or partitioned away: operations go on, and the
  // next beat goes soon, so that a healed partition hears from every
  // member well within one heartbeat timeout.
  if (stop_.WaitForNotificationWithTimeout(
          std::min(interval, absl::Milliseconds(200)))) {
    return Next::kStop;
  }
  return Next::kAgain;
}

namespace {

// What one Watch stream delivered, shared by its reactor and the watch
// thread (the reactor goes when gRPC is done with it).
struct WatchUpdates {
  absl::Mutex mu;
  std::deque<v1::Membership> queue ABSL_GUARDED_BY(mu);
  bool ended ABSL_GUARDED_BY(mu) = false;

  // The next update, or nothing once the stream has ended.
  std::optional<v1::Membership> Next() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](WatchUpdates* u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(u->mu) {
          return !u->queue.empty() || u->ended;
        },
        this));
    if (queue.empty()) return std::nullopt;
    v1::Membership m = std::move(queue.front());
    queue.pop_front();
    return m;
  }
};

// One Watch stream, read through gRPC's callback API. The watch thread waits
// for its updates on WatchUpdates, never inside gRPC: a thread blocked in a
// synchronous gRPC read is one gRPC may pick to poll every socket of the
// process, the peer links' gRPC streams included, and to hand what it reads
// on from there to the thread that runs the link's callbacks: a wake-up
// more per frame (docs/performance.md, "The gRPC stream path").
class WatchStream final : public grpc::ClientReadReactor<v1::Membership> {
 public:
  // Starts the call; `ctx` lives until `updates` says the stream ended.
  static void Start(v1::Rendezvous::Stub* stub, grpc::ClientContext* ctx,
                    v1::WatchRequest request,
                    std::shared_ptr<WatchUpdates> updates) {
    auto* stream = new WatchStream(std::move(request), std::move(updates));
    stub->async()->Watch(ctx, &stream->request_, stream);
    stream->StartRead(&stream->incoming_);
    stream->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream is ending: OnDone follows
    {
      absl::MutexLock lock(&updates_->mu);
      updates_->queue.push_back(std::move(incoming_));
    }
    incoming_.Clear();
    StartRead(&incoming_);
  }

  void OnDone(const grpc::Status&) override {
    {
      absl::MutexLock lock(&updates_->mu);
      updates_->ended = true;
    }
    delete this;
  }

 private:
  WatchStream(v1::WatchRequest request, std::shared_ptr<WatchUpdates> updates)
      : request_(std::move(request)), updates_(std::move(updates)) {}

  const v1::WatchRequest request_;
  const std::shared_ptr<WatchUpdates> updates_;
  v1::Membership incoming_;
};

}  // namespace

void RendezvousLink::WatchLoop() {
  // Deltas (a change costs the members that changed, not the ring) unless
  // the last stream sent one this worker could not apply.
  bool deltas = true;
  while (!stop_.HasBeenNotified()) {
    // The stream's updates are against the membership it delivered last,
    // at first the newest this worker holds.
    v1::Membership base = callbacks_.latest();
    v1::WatchRequest req;
    req.set_job_id(options_.job_id);
    req.set_worker_id(options_.worker_id);
    req.set_known_generation(base.generation());
    req.set_deltas(deltas);
    deltas = true;
    grpc::ClientContext ctx;
    if (!Track(&ctx)) break;
    auto updates = std::make_shared<WatchUpdates>();
    WatchStream::Start(stub_.get(), &ctx, std::move(req), updates);
    // Every update, until the stream ends (Stop cancels it).
    while (std::optional<v1::Membership> m = updates->Next()) {
      if (!deltas) continue;  // cancelled: drain to the end
      absl::StatusOr<v1::Membership> whole = ApplyMembershipDelta(base, *m);
      if (!whole.ok()) {
        log_.Warning(absl::StrCat("watch: ", whole.status().message(),
                                  "; watching again for the whole membership"));
        deltas = false;
        ctx.TryCancel();
        continue;
      }
      base = *std::move(whole);
      callbacks_.on_membership(base);
    }
    Untrack(&ctx);
    if (!deltas) continue;  // at once
    stop_.WaitForNotificationWithTimeout(absl::Milliseconds(300));
  }
}

void RendezvousLink::SendReport(const LinkReport& report) {
  v1::ReportFailureRequest req;
  req.set_job_id(options_.job_id);
  req.set_worker_id(options_.worker_id);
  req.set_generation(report.generation);
  req.set_suspect_worker_id(report.suspect);
  req.set_reason(report.reason);
  v1::ReportFailureReply reply;
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(3));
  if (!Track(&ctx)) return;
  grpc::Status s = stub_->ReportFailure(&ctx, req, &reply);
  Untrack(&ctx);
  log_.Info(absl::StrCat(
      "reported the broken link with ", report.suspect, ": ",
      s.ok() ? (reply.declared_lost() ? "declared lost" : "not declared lost")
             : s.error_message(),
      s.ok() ? absl::StrCat(" (", reply.verdict(), ")") : std::string()));
}

void RendezvousLink::BackgroundLoop() {
  while (!stop_.HasBeenNotified()) {
    std::optional<LinkReport> report;
    bool rejoin = false;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || rejoin_ || !reports_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&work), absl::Seconds(1));
      if (stopping_) break;
      if (!reports_.empty()) {
        report = reports_.front();
        reports_.pop_front();
      } else if (rejoin_) {
        rejoin = true;
        rejoin_ = false;
      }
    }
    if (report.has_value()) {
      SendReport(*report);
      continue;
    }
    if (!rejoin) continue;
    log_.Info(absl::StrCat("joining job ", options_.job_id, " again"));
    v1::JoinReply reply;
    absl::Status s = Join(absl::Now() + options_.join_timeout, &reply);
    if (s.ok()) {
      callbacks_.on_membership(reply.membership());
      log_.Info(absl::StrCat("admitted again: rank ", reply.rank(), " of ",
                           reply.world_size(), ", generation ",
                           reply.generation()));
    } else if (!stop_.HasBeenNotified()) {
      log_.Warning(s.ToString());
      absl::MutexLock lock(&mu_);
      rejoin_ = true;
    }
  }
}

}  // namespace halka
