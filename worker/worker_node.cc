#include "worker/worker_node.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/grpc_util.h"
#include "common/in_process.h"
#include "common/prometheus.h"
#include "common/security.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "core/futex.h"
#include "core/cuda/device_memory.h"
#include "core/shm_ring.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/grpc/peer_service.h"
#include "worker/op_request.h"
#include "worker/worker_metrics.h"
#include "worker/worker_service.h"

namespace halka {
namespace {

std::string DefaultWorkerId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, "-", getpid());
}

uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v == 0 ? 1 : v;
}

absl::Status CheckOptions(const WorkerOptions& options) {
  if (options.rendezvous.empty()) {
    return absl::InvalidArgumentError("worker: --rendezvous is required");
  }
  if (options.world_size < 1) {
    return absl::InvalidArgumentError("worker: --world_size must be >= 1");
  }
  if ((options.shm_spin < absl::ZeroDuration() &&
       options.shm_spin != kShmSpinAuto) ||
      options.shm_spin > absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker: --shm_spin_us must be -1 (auto) or 0-1000, got ",
        absl::ToInt64Microseconds(options.shm_spin)));
  }
  if ((options.min_world_size > 0) != (options.max_world_size > 0) ||
      options.min_world_size > options.max_world_size ||
      options.min_world_size < 0) {
    return absl::InvalidArgumentError(
        "worker: an elastic job needs 1 <= --min_world_size <= "
        "--max_world_size (both set)");
  }
  if (!ValidCongestionName(options.wire_congestion)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker: --wire_congestion must be auto, system or a congestion "
        "control's name (1-15 of a-z, 0-9, _), got '",
        options.wire_congestion, "'"));
  }
  if (options.chunk_bytes < 64 || options.chunk_bytes > (size_t{16} << 20)) {
    return absl::InvalidArgumentError(
        "worker: --chunk_bytes must be in [64, 16 MiB]");
  }
  return absl::OkStatus();
}

}  // namespace

WorkerNode::WorkerNode(WorkerOptions options)
    : options_(std::move(options)),
      log_(absl::StrCat("worker ", options_.worker_id)),
      incarnation_(NewIncarnation()),
      counters_(std::make_shared<LinkCounters>()),
      wire_fallbacks_(std::make_shared<WireFallbacks>(&log_)) {}

absl::StatusOr<std::unique_ptr<WorkerNode>> WorkerNode::Start(
    WorkerOptions options) {
  auto node = Create(std::move(options));
  if (!node.ok()) return node.status();
  absl::Status s = (*node)->Join();
  if (!s.ok()) return s;
  return node;
}

absl::StatusOr<std::unique_ptr<WorkerNode>> WorkerNode::Create(
    WorkerOptions options) {
  if (options.worker_id.empty()) options.worker_id = DefaultWorkerId();
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  // This worker's from now on: another's SetSecurityConfig (a second
  // LocalCluster in this process) changes nothing of it.
  if (!options.security.has_value()) options.security = GetSecurityConfig();
  const SecurityConfig& sec = *options.security;
  auto creds = ServerCredentialsFor(options.listen, ServerRole::kSingleJob, sec);
  if (!creds.ok()) return creds.status();
  const std::string uds = absl::StrCat("unix:", options.unix_socket);
  auto uds_creds = ServerCredentialsFor(uds, ServerRole::kSingleJob, sec);
  if (!uds_creds.ok()) return uds_creds.status();
  std::unique_ptr<WorkerNode> node(new WorkerNode(std::move(options)));
  const WorkerOptions& o = node->options_;
  WorkerNode* raw = node.get();
  if (absl::Status s = node->ServePeerLinks(); !s.ok()) return s;
  node->api_service_ =
      std::make_unique<WorkerService>(node.get(), o.max_inline_bytes);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(builder);
  int port = 0;
  builder.AddListeningPort(o.listen, *creds, &port);
  if (!o.unix_socket.empty()) {
    unlink(o.unix_socket.c_str());
    builder.AddListeningPort(uds, *uds_creds);
  }
  builder.RegisterService(node->peer_service_.get());
  builder.RegisterService(node->api_service_.get());
  // The book exists before the server starts: peers may dial at once.
  node->book_ = std::make_unique<RingBook>(
      o, &node->log_,
      [raw](uint64_t generation, int peer, const absl::Status& status) {
        raw->OnLinkFailed(generation, peer, status);
      },
      node->counters_, node->wire_fallbacks_);
  node->server_ = builder.BuildAndStart();
  if (!node->server_ || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("worker: cannot listen on ", o.listen));
  }
  node->address_ = DialableAddress(o.listen, port, o.advertise);
  node->book_->set_address(node->address_);
  node->server_->GetHealthCheckService()->SetServingStatus(false);
  if (absl::Status s = node->OpenDevice(); !s.ok()) return s;
  if (o.shm_links && !FutexWaitAnyWorks()) {
    // Said once, so that a slower same-host path is never a mystery.
    node->log_.Info(
        FutexWaitAnyInKernel()
            ? "same-host links: HALKA_FUTEX_WAITV=0, so each ring's reader "
              "thread hands its frames to the operation"
            : "same-host links: this kernel has no futex_waitv (Linux 5.16+), "
              "so each ring's reader thread hands its frames to the "
              "operation (one more wake-up per frame)");
  }
  RendezvousLink::Callbacks cb;
  cb.on_membership = [raw](const v1::Membership& m) { raw->OnMembership(m); };
  cb.on_declared_lost = [raw](const std::string& why) {
    if (std::shared_ptr<Ring> ring = raw->book_->Current()) {
      ring->comm->Abort(absl::AbortedError(
          absl::StrCat("the rendezvous declared this worker lost: ", why)));
    }
  };
  cb.telemetry = [raw] { return raw->CollectTelemetry(); };
  cb.known_generation = [raw] { return raw->book_->latest_generation(); };
  cb.latest = [raw] { return raw->book_->Latest(); };
  cb.claimable = [raw] { return raw->book_->Claimable(); };
  node->link_ = std::make_unique<RendezvousLink>(
      node->options_, node->log_, node->address_, node->incarnation_,
      std::move(cb));
  // A client of this process dialling address() runs its calls here
  // directly (common/in_process.h).
  WorkerService* api = node->api_service_.get();
  node->in_process_ = InProcessWorker::Register(
      node->address_, [api](const v1::RunRequest& req, void* data,
                            size_t bytes, v1::RunReply* reply) {
        return api->RunInProcess(req, data, bytes, reply);
      });
  return node;
}

absl::Status WorkerNode::ServePeerLinks() {
  const WorkerOptions& o = options_;
  if (o.wire_links) {
    absl::StatusOr<std::unique_ptr<WireListener>> wire =
        WireListener::Start(HostOf(o.listen), o.wire_port, counters_);
    if (wire.ok()) {
      wire_listener_ = *std::move(wire);
    } else if (o.wire_port != 0) {
      return wire.status();  // a port asked for by name must be had
    } else {
      log_.Warning(absl::StrCat("no wire links (peer links stay on gRPC): ",
                                wire.status().message()));
    }
  }
  PeerService::Options peer;
  peer.accept_shm = o.shm_links;
  peer.shm_spin = std::max(o.shm_spin, absl::ZeroDuration());  // readers
  peer.wire = wire_listener_.get();
  peer.wire_sealed = o.security->server_tls();
  peer.wire_landing = o.wire_landing;
  peer.wire_tap = o.wire_tap;
  peer.counters = counters_;
  peer_service_ = std::make_unique<PeerService>(
      o.job_id,
      [this](uint64_t generation) { return book_->InboxFor(generation); },
      std::move(peer));
  return absl::OkStatus();
}

absl::Status WorkerNode::OpenDevice() {
  const WorkerOptions& o = options_;
  if (o.cuda_device < 0 && !DeviceTensorsCompiled()) return absl::OkStatus();
  auto dev = DeviceContext::Open(std::max(o.cuda_device, 0));
  if (dev.ok()) {
    device_ = std::move(*dev);
    options_.device = absl::StrCat("cuda:", device_->device());
    log_.Info(absl::StrCat("device tensors reduce on ", options_.device));
  } else if (o.cuda_device >= 0) {
    return absl::Status(dev.status().code(),
                        absl::StrCat("worker: --device=", o.cuda_device,
                                     " is unusable: ", dev.status().message()));
  } else {
    log_.Info(absl::StrCat("no usable GPU (", dev.status().message(),
                           "): reducing on the CPU"));
  }
  return absl::OkStatus();
}

absl::Status WorkerNode::Join() {
  const WorkerOptions& o = options_;
  // Served before joining (empty until then), so a port that cannot be
  // bound fails the start, not a joined ring.
  if (o.metrics_port != 0 && http_ == nullptr) {
    const std::string host = o.listen.substr(0, o.listen.rfind(':'));
    std::map<std::string, HttpHandler> handlers;
    handlers["/metrics"] = [this](const std::map<std::string, std::string>&) {
      HttpResponse r;
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = MetricsText();
      return r;
    };
    auto http = StartDaemonHttp(absl::StrCat("worker ", o.worker_id),
                                host.empty() ? "0.0.0.0" : host,
                                o.metrics_port, std::move(handlers),
                                *o.security);
    if (!http.ok()) return http.status();
    http_ = std::move(*http);
  }
  if (o.shm_sweep_interval > absl::ZeroDuration() && shm_reaper_ == nullptr) {
    shm_reaper_ = std::make_unique<ShmReaper>("/dev/shm", o.shm_sweep_interval,
                                              log_);
  }
  v1::JoinReply reply;
  absl::Status s = link_->Join(halka::Now() + o.join_timeout, &reply);
  if (!s.ok()) return s;
  book_->MarkJoined();
  OnMembership(reply.membership());
  absl::StatusOr<std::shared_ptr<Ring>> ring = book_->Acquire(CallInfo{});
  if (!ring.ok()) return ring.status();
  link_->Start(absl::Milliseconds(
      std::max<uint32_t>(reply.heartbeat_interval_ms(), 50)));
  if (reply.membership().probe_links() && AwaitMeasuredModel((*ring)->generation)) {
    // The model's generation (same members): its ring, before any call.
    ring = book_->Acquire(CallInfo{});
    if (!ring.ok()) return ring.status();
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  log_.Info(absl::StrCat("joined job ", o.job_id, ": rank ", (*ring)->rank,
                       " of ", (*ring)->world, ", generation ",
                       (*ring)->generation, ", serving on ", address_));
  return absl::OkStatus();
}

void WorkerNode::OnMembership(const v1::Membership& m) {
  const MembershipUpdate u = book_->Update(m);
  if (!u.newer) return;
  if (u.must_rejoin) link_->RequestRejoin();
  if (u.before != 0) {
    log_.Warning(absl::StrCat("job ", options_.job_id, ": ", m.change(),
                            u.member ? "" : "; this worker is not in the ring"));
  }
  if (m.probe_links() && u.member) RequestProbe(m.generation());
  if (u.running == nullptr) return;
  if (u.lost_peer && u.peers_only_left && u.member) {
    SpareRunningOp(u.running,
                   absl::AbortedError(absl::StrCat(
                       "job ", options_.job_id, " ", m.change(),
                       "; the operation still ran ",
                       absl::FormatDuration(kLeaverGrace),
                       " after the member left")));
  }
  if ((u.lost_peer && !u.peers_only_left) || !u.member) {
    // The running operation cannot finish: fail it now, naming the cause.
    // (Newcomers alone abort nothing: the ring switches between
    // operations; see RingBook::InboxFor for a peer that switched first.)
    // Peers that only left (Member.left) abort nothing either: a peer
    // leaves once its calls returned, so it sent all it had for the
    // running operation, which may well finish on it (a script's last
    // collective, then destroy_process_group on a faster rank); one it
    // never joined fails when its links close, naming the link.
    u.running->comm->Abort(absl::AbortedError(
        absl::StrCat("job ", options_.job_id, " ", m.change())));
  }
}

void WorkerNode::SpareRunningOp(std::shared_ptr<Ring> ring,
                                absl::Status status) {
  absl::MutexLock lock(&spared_mu_);
  if (spared_stop_) return;
  spared_.push_back({halka::Now() + kLeaverGrace, ring, std::move(status)});
  if (!spared_thread_.joinable()) {
    spared_thread_ = std::thread([this] { AbortSparedOps(); });
  }
}

void WorkerNode::AbortSparedOps() {
  for (;;) {
    std::vector<SparedOp> due;
    {
      absl::MutexLock lock(&spared_mu_);
      absl::Time next = absl::InfiniteFuture();
      for (const SparedOp& s : spared_) next = std::min(next, s.at);
      // Sleeps until the earliest is due (the deadline), a new one comes,
      // or the stop.
      const size_t known = spared_.size();
      auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(spared_mu_) {
        return spared_stop_ || spared_.size() != known;
      };
      spared_mu_.AwaitWithDeadline(absl::Condition(&changed), next);
      if (spared_stop_) return;
      const absl::Time now = halka::Now();
      for (auto it = spared_.begin(); it != spared_.end();) {
        if (it->at <= now) {
          due.push_back(std::move(*it));
          it = spared_.erase(it);
        } else {
          ++it;
        }
      }
    }
    // The spared ring is an old generation's: no new call runs on it, so
    // an abort there ends only an operation still running on it.
    for (SparedOp& s : due) {
      if (std::shared_ptr<Ring> ring = s.ring.lock()) ring->AbortAll(s.status);
    }
  }
}

void WorkerNode::CatchUp() {
  const uint64_t known = book_->latest_generation();
  if (book_->newest_early_generation() <= known) return;
  // A peer already runs a newer generation than any update this worker
  // got: ask the rendezvous now instead of waiting for the push.
  if (auto m = link_->FetchMembership(known)) OnMembership(*m);
}

void WorkerNode::OnLinkFailed(uint64_t generation, int peer,
                              const absl::Status& status) {
  if (auto report = book_->OnLinkFailed(generation, peer, status)) {
    link_->Report(std::move(*report));
  }
}

std::string WorkerNode::metrics_address() const {
  return http_ ? http_->address() : "";
}

std::string WorkerNode::MetricsText() {
  std::shared_ptr<Ring> ring = book_->Current();
  if (ring == nullptr) return "";
  std::string text =
      WorkerMetricsText(options_.job_id, ring->rank, ring->generation,
                        ring->world, ring->comm->GetTelemetry(), *counters_);
  // The SDK's same-host sessions (client/shm_session.h).
  PrometheusWriter w;
  const PrometheusWriter::Labels base = {{"halka_job", options_.job_id},
                                         {"rank", absl::StrCat(ring->rank)}};
  w.Family("halka_worker_sessions", "gauge",
           "open SDK sessions (same-host clients whose calls come through "
           "shared memory)");
  w.Sample("halka_worker_sessions", base, api_service_->open_sessions());
  w.Family("halka_worker_session_calls_total", "counter",
           "calls that came through an SDK session (the rest: Worker.Run "
           "or RunInline, one gRPC call each)");
  w.Sample("halka_worker_session_calls_total", base,
           static_cast<double>(api_service_->session_calls()));
  w.Family("halka_worker_in_process_calls_total", "counter",
           "calls from a client in this worker's own process, run on the "
           "caller's thread (an embedded worker: halka.torch, "
           "EmbeddedWorker, halkactl bench)");
  w.Sample("halka_worker_in_process_calls_total", base,
           static_cast<double>(api_service_->in_process_calls()));
  return text + w.Text();
}

v1::WorkerTelemetry WorkerNode::CollectTelemetry() {
  std::shared_ptr<Ring> ring = book_->Current();
  if (ring == nullptr) return v1::WorkerTelemetry();
  v1::WorkerTelemetry t = TelemetryProto(
      ring->comm->GetTelemetry(), ring->comm->GetProgress(), halka::Now());
  absl::MutexLock lock(&calls_mu_);
  t.set_calls_received(calls_received_);
  t.set_last_op_seq(last_call_seq_);
  t.set_last_op_outcome(!last_call_recorded_ ? v1::OP_OUTCOME_UNSPECIFIED
                        : last_call_ok_      ? v1::OP_OUTCOME_OK
                                             : v1::OP_OUTCOME_FAILED);
  t.set_last_op_error(last_call_error_);
  return t;
}

absl::StatusOr<v1::Timeline> WorkerNode::Timeline() const {
  std::shared_ptr<Ring> ring = book_->Current();
  if (!book_->joined() || ring == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", options_.worker_id, " has not joined job ",
        options_.job_id, " yet: no timeline"));
  }
  v1::Timeline t = TimelineProto(ring->comm->GetTrace());
  t.set_worker_id(options_.worker_id);
  t.set_rank(ring->rank);
  t.set_world_size(ring->world);
  t.set_generation(ring->generation);
  return t;
}

absl::StatusOr<v1::InfoReply> WorkerNode::Describe() const {
  std::shared_ptr<Ring> ring = book_->Current();
  if (!book_->joined() || ring == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker has not joined its job yet: worker ", options_.worker_id,
        " is joining job ", options_.job_id, " at ", options_.rendezvous,
        " (waiting for the world of ", options_.world_size, " to form)"));
  }
  const v1::Membership latest = book_->Latest();
  v1::InfoReply reply;
  reply.set_groups(true);
  reply.set_job_id(options_.job_id);
  reply.set_worker_id(options_.worker_id);
  reply.set_rank(ring->rank);
  reply.set_world_size(ring->world);
  reply.set_generation(ring->generation);
  // The members of the newest generation (which the next operation runs
  // on), or of the running ring.
  *reply.mutable_members() = latest.members();
  if (reply.members().empty()) {
    for (const PeerInfo& p : ring->members) {
      v1::Member* m = reply.add_members();
      m->set_rank(p.rank);
      m->set_worker_id(p.worker_id);
      m->set_address(p.address);
      m->set_alive(true);
    }
  }
  reply.set_device(options_.device);
  reply.set_job_state(latest.job_state());
  reply.set_change(latest.change());
  reply.set_membership_generation(latest.generation());
  bool in_ring = false;
  for (const v1::Member& m : latest.members()) {
    in_ring |= m.alive() && m.worker_id() == options_.worker_id &&
               m.address() == address_;
  }
  reply.set_in_ring(in_ring && latest.job_state() != v1::JOB_STATE_WAITING);
  return reply;
}

grpc::Status WorkerNode::GetRingHealth(v1::RingHealthRequest req,
                                       v1::RingHealth* reply) {
  if (req.job_id().empty()) req.set_job_id(options_.job_id);
  return link_->GetRingHealth(req, reply);
}

WorkerNode::~WorkerNode() { Shutdown(); }

void WorkerNode::Shutdown(bool leave) {
  if (http_) http_->Stop();
  shm_reaper_.reset();
  if (shut_down_) return;
  shut_down_ = true;
  const absl::Time t0 = halka::Now();
  {
    absl::MutexLock lock(&spared_mu_);
    spared_stop_ = true;
  }
  if (spared_thread_.joinable()) spared_thread_.join();
  {
    // A probe running ends with the rings' abort below (joined there).
    absl::MutexLock lock(&probe_mu_);
    probe_stop_ = true;
  }
  // New in-process calls fail UNAVAILABLE from here; running ones end
  // with the ring's abort below and are waited for after the server's
  // shutdown.
  if (in_process_) in_process_->Close();
  if (server_ == nullptr || link_ == nullptr) {
    // Create failed part way (e.g. an unusable --device): nothing joined.
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(halka::Now()));
    return;
  }
  // A stop that takes long says where it waits (every 5 s), so a process
  // that does not exit names the stage that holds it.
  std::atomic<const char*> stage{"aborting the ring"};
  absl::Notification stopped;
  std::thread watch([&] {
    while (!stopped.WaitForNotificationWithTimeout(absl::Seconds(5))) {
      log_.Warning(absl::StrFormat("still stopping after %.0f s: %s",
                                   absl::ToDoubleSeconds(halka::Now() - t0),
                                   stage.load()));
    }
  });
  const bool joined = book_->joined();
  const absl::Status stopping = absl::UnavailableError("worker is shutting down");
  std::shared_ptr<Ring> ring = book_->Current();
  if (ring) ring->AbortAll(stopping);
  stage = "stopping the link to the rendezvous";
  link_->Stop();
  const absl::Time t1 = halka::Now();
  stage = "leaving the job";
  if (joined && leave) link_->Leave();
  const absl::Time t2 = halka::Now();
  {
    stage = "closing the rings' links";
    std::vector<std::shared_ptr<Ring>> rings = book_->Stop();
    // A ring that a call acquired after the abort above (a newer
    // generation's) ends its operation too: Acquire refuses from here.
    for (const auto& r : rings) r->AbortAll(stopping);
    stage = "ending the probe of the ring links";
    if (probe_thread_.joinable()) probe_thread_.join();
    stage = "closing the rings' links";
    ring.reset();
    rings.clear();  // closes the links, outside the book's lock
  }
  const absl::Time t3 = halka::Now();
  stage = "ending the SDK sessions";
  api_service_->StopSessions();  // each ends once its call has answered
  // A clean stop lets in-flight calls finish briefly; a simulated death
  // cancels them at once.
  stage = "shutting the gRPC server down (its handlers and streams)";
  server_->Shutdown(absl::ToChronoTime(
      halka::Now() + (leave ? absl::Milliseconds(100) : absl::ZeroDuration())));
  // In-process calls end with the ring's abort (one waiting for its turn
  // behind a gRPC call, once the server's shutdown has cancelled that).
  stage = "waiting for in-process calls to end";
  if (in_process_) in_process_->Drain();
  stage = "waiting for the gRPC server's threads";
  server_->Wait();
  stage = "stopping the wire listener";
  if (wire_listener_) wire_listener_->Stop();
  stopped.Notify();
  watch.join();
  log_.Info(absl::StrFormat(
      "stopped in %.0f ms (threads %.0f, leave %.0f, links %.0f, server %.0f)",
      absl::ToDoubleMilliseconds(halka::Now() - t0),
      absl::ToDoubleMilliseconds(t1 - t0), absl::ToDoubleMilliseconds(t2 - t1),
      absl::ToDoubleMilliseconds(t3 - t2),
      absl::ToDoubleMilliseconds(halka::Now() - t3)));
}

void WorkerNode::Wait() { server_->Wait(); }

int WorkerNode::rank() const {
  std::shared_ptr<Ring> ring = book_->Current();
  return ring ? ring->rank : -1;
}
int WorkerNode::world_size() const {
  std::shared_ptr<Ring> ring = book_->Current();
  return ring ? ring->world : 0;
}
Communicator* WorkerNode::communicator() {
  std::shared_ptr<Ring> ring = book_->Current();
  return ring ? ring->comm.get() : nullptr;
}
int WorkerNode::open_peer_streams() const {
  return peer_service_->open_streams();
}

}  // namespace halka
