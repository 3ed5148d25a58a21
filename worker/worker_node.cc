#include "worker/worker_node.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <random>
#include <list>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "worker/core/cuda/device_memory.h"
#include "worker/grpc_transport.h"
#include "worker/op_request.h"

namespace halka {
namespace {

std::string DefaultWorkerId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, "-", getpid());
}

v1::OpStats ToStats(const OpResult& r) {
  v1::OpStats s;
  s.set_op_seq(r.op_seq);
  s.set_algorithm(r.algorithm);
  s.set_bytes_sent(r.bytes_sent);
  s.set_bytes_received(r.bytes_received);
  s.set_seconds(absl::ToDoubleSeconds(r.elapsed));
  s.set_generation(r.generation);
  s.set_rank(r.rank);
  s.set_world_size(r.world_size);
  return s;
}

}  // namespace

// Shared-memory objects that clients hand tensors in, mapped once and kept
// (a client reuses its staging object, so the mapping is reused too).
class ShmCache {
 public:
  ~ShmCache() {
    for (auto& e : entries_) munmap(e.base, e.size);
  }

  // Maps `name` (which the client created with exactly `size` bytes).
  // Errors: INVALID_ARGUMENT (not a halka object, size mismatch), NOT_FOUND.
  absl::StatusOr<uint8_t*> Map(const std::string& name, uint64_t size) {
    if (!absl::StartsWith(name, "/halka-") || name.size() > 200 ||
        name.find('/', 1) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shm name '", name, "' is not a halka object (/halka-...)"));
    }
    absl::MutexLock lock(&mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->name == name && it->size == size && StillSame(*it)) {
        entries_.splice(entries_.begin(), entries_, it);
        return entries_.front().base;
      }
    }
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      return absl::NotFoundError(absl::StrCat("shm object ", name,
                                              " cannot be opened: ",
                                              std::strerror(errno)));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != size) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(
          "shm object ", name, " has ", st.st_size,
          " bytes, the request says ", size));
    }
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot map shm object ", name, ": ", std::strerror(errno)));
    }
    entries_.push_front(Entry{name, size, static_cast<uint8_t*>(base),
                              static_cast<uint64_t>(st.st_ino)});
    while (entries_.size() > 16) {
      munmap(entries_.back().base, entries_.back().size);
      entries_.pop_back();
    }
    return entries_.front().base;
  }

 private:
  struct Entry {
    std::string name;
    uint64_t size;
    uint8_t* base;
    uint64_t inode;
  };
  // A client that re-created an object under the same name gets a new one.
  static bool StillSame(const Entry& e) {
    const int fd = shm_open(e.name.c_str(), O_RDONLY, 0);
    if (fd < 0) return false;
    struct stat st;
    const bool same = fstat(fd, &st) == 0 &&
                      static_cast<uint64_t>(st.st_ino) == e.inode &&
                      static_cast<uint64_t>(st.st_size) == e.size;
    close(fd);
    return same;
  }
  absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// The SDK-facing API (synchronous handlers: an operation blocks its
// handler thread, and operations are serialised by the communicator).
class WorkerNode::Service final : public v1::Worker::Service {
 public:
  explicit Service(WorkerNode* node) : node_(node) {}

  grpc::Status Run(grpc::ServerContext*, const v1::RunRequest* req,
                   v1::RunReply* reply) override {
    const v1::OpSpec& spec = req->spec();
    if (req->has_device_tensor()) {
      auto result = node_->ExecuteOnDevice(spec, req->device_tensor());
      if (!result.ok()) return ToGrpcStatus(result.status());
      *reply->mutable_stats() = ToStats(*result);
      return grpc::Status::OK;
    }
    absl::StatusOr<uint64_t> bytes =
        ValidateOpSpec(spec, node_->options_.max_op_bytes);
    if (!bytes.ok()) return ToGrpcStatus(bytes.status());
    if (absl::Status s = ValidateShmRegion(*req, *bytes); !s.ok()) {
      return ToGrpcStatus(s);
    }
    uint8_t* data = nullptr;
    if (*bytes > 0) {
      auto base = shm_.Map(req->shm_name(), req->shm_size());
      if (!base.ok()) return ToGrpcStatus(base.status());
      data = *base + req->shm_offset();
    }
    auto result = node_->Execute(spec, data);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *reply->mutable_stats() =
        ToStats(*result);
    return grpc::Status::OK;
  }

  grpc::Status RunInline(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::InlineReply, v1::InlineRequest>* stream)
      override {
    // Each stream holds a whole tensor: bounded per connection and in all.
    StreamLimiter::Scoped counted(inline_streams_, ctx->peer());
    if (!counted.status().ok()) return ToGrpcStatus(counted.status());
    v1::InlineRequest msg;
    if (!stream->Read(&msg)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "run_inline: no request");
    }
    const v1::OpSpec spec = msg.spec();
    absl::StatusOr<uint64_t> checked =
        ValidateOpSpec(spec, node_->options_.max_op_bytes);
    if (!checked.ok()) return ToGrpcStatus(checked.status());
    const uint64_t bytes = *checked;
    std::vector<uint8_t> buffer;
    buffer.reserve(bytes);
    do {
      if (buffer.size() + msg.data().size() > bytes) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("run_inline: more data than count x "
                                         "dtype (",
                                         bytes, " bytes)"));
      }
      buffer.insert(buffer.end(), msg.data().begin(), msg.data().end());
    } while (buffer.size() < bytes && stream->Read(&msg));
    if (buffer.size() != bytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("run_inline: got ", buffer.size(),
                                       " bytes of data, expected ", bytes));
    }
    auto result = node_->Execute(spec, buffer.data());
    if (!result.ok()) return ToGrpcStatus(result.status());
    constexpr size_t kChunk = size_t{1} << 20;
    for (size_t off = 0; off < buffer.size(); off += kChunk) {
      v1::InlineReply out;
      out.set_data(buffer.data() + off, std::min(kChunk, buffer.size() - off));
      if (!stream->Write(out)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
    }
    v1::InlineReply done;
    done.set_done(true);
    *done.mutable_stats() = ToStats(*result);
    stream->Write(done);
    return grpc::Status::OK;
  }

  grpc::Status GetInfo(grpc::ServerContext*, const v1::InfoRequest*,
                       v1::InfoReply* reply) override {
    absl::MutexLock lock(&node_->mu_);
    if (!node_->is_joined_ || node_->ring_ == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "worker has not joined its job yet");
    }
    const Ring& ring = *node_->ring_;
    reply->set_job_id(node_->options_.job_id);
    reply->set_worker_id(node_->options_.worker_id);
    reply->set_rank(ring.rank);
    reply->set_world_size(ring.world);
    reply->set_generation(ring.generation);
    // The members of the newest generation (which the next operation
    // runs on), or of the running ring.
    *reply->mutable_members() = node_->latest_.members();
    if (reply->members().empty()) {
      for (const PeerInfo& p : ring.members) {
        v1::Member* m = reply->add_members();
        m->set_rank(p.rank);
        m->set_worker_id(p.worker_id);
        m->set_address(p.address);
        m->set_alive(true);
      }
    }
    reply->set_device(node_->options_.device);
    reply->set_job_state(node_->latest_.job_state());
    reply->set_change(node_->latest_.change());
    reply->set_membership_generation(node_->latest_.generation());
    bool in_ring = false;
    for (const v1::Member& m : node_->latest_.members()) {
      in_ring |= m.alive() && m.worker_id() == node_->options_.worker_id &&
                 m.address() == node_->address_;
    }
    reply->set_in_ring(in_ring &&
                       node_->latest_.job_state() != v1::JOB_STATE_WAITING);
    return grpc::Status::OK;
  }

  grpc::Status GetRingHealth(grpc::ServerContext*,
                             const v1::RingHealthRequest* req,
                             v1::RingHealth* reply) override {
    v1::RingHealthRequest r = *req;
    if (r.job_id().empty()) r.set_job_id(node_->options_.job_id);
    grpc::ClientContext ctx;
    SetTimeout(ctx, absl::Seconds(5));
    return node_->rendezvous_->GetRingHealth(&ctx, r, reply);
  }

 private:
  WorkerNode* const node_;
  StreamLimiter inline_streams_{"inline operation", 16, 256};
  ShmCache shm_;
};

WorkerNode::Ring::~Ring() {
  comm.reset();
  transport.reset();  // cancels the links and waits for them
}

namespace {
uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v == 0 ? 1 : v;
}
}  // namespace

WorkerNode::WorkerNode(WorkerOptions options)
    : options_(std::move(options)), incarnation_(NewIncarnation()) {}

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
  if (options.rendezvous.empty()) {
    return absl::InvalidArgumentError("worker: --rendezvous is required");
  }
  if (options.world_size < 1) {
    return absl::InvalidArgumentError("worker: --world_size must be >= 1");
  }
  if ((options.min_world_size > 0) != (options.max_world_size > 0) ||
      options.min_world_size > options.max_world_size ||
      options.min_world_size < 0) {
    return absl::InvalidArgumentError(
        "worker: an elastic job needs 1 <= --min_world_size <= "
        "--max_world_size (both set)");
  }
  if (options.chunk_bytes < 64 || options.chunk_bytes > (size_t{16} << 20)) {
    return absl::InvalidArgumentError(
        "worker: --chunk_bytes must be in [64, 16 MiB]");
  }
  auto creds = ServerCredentialsFor(options.listen);
  if (!creds.ok()) return creds.status();
  const std::string uds = absl::StrCat("unix:", options.unix_socket);
  auto uds_creds = ServerCredentialsFor(uds);
  if (!uds_creds.ok()) return uds_creds.status();
  std::unique_ptr<WorkerNode> node(new WorkerNode(std::move(options)));
  const WorkerOptions& o = node->options_;
  WorkerNode* raw = node.get();
  node->peer_service_ = std::make_unique<PeerService>(
      o.job_id, [raw](uint64_t generation) { return raw->InboxFor(generation); });
  node->api_service_ = std::make_unique<Service>(node.get());
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
  node->server_ = builder.BuildAndStart();
  if (!node->server_ || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("worker: cannot listen on ", o.listen));
  }
  node->address_ = DialableAddress(o.listen, port, o.advertise);
  node->server_->GetHealthCheckService()->SetServingStatus(false);
  if (o.cuda_device >= 0 || DeviceTensorsCompiled()) {
    auto dev = DeviceContext::Open(std::max(o.cuda_device, 0));
    if (dev.ok()) {
      node->device_ = std::move(*dev);
      node->options_.device = absl::StrCat("cuda:", node->device_->device());
      LogInfo(absl::StrCat("device tensors reduce on ", node->options_.device));
    } else if (o.cuda_device >= 0) {
      return absl::Status(dev.status().code(),
                          absl::StrCat("worker: --device=", o.cuda_device,
                                       " is unusable: ", dev.status().message()));
    } else {
      LogInfo(absl::StrCat("no usable GPU (", dev.status().message(),
                           "): reducing on the CPU"));
    }
  }
  node->rendezvous_ = v1::Rendezvous::NewStub(MakeChannel(o.rendezvous));
  return node;
}

bool WorkerNode::Track(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  calls_.insert(ctx);
  return true;
}

void WorkerNode::Untrack(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  calls_.erase(ctx);
}

absl::Status WorkerNode::JoinOnce(absl::Time deadline, v1::JoinReply* reply) {
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
    s = rendezvous_->Join(&ctx, req, reply);
    Untrack(&ctx);
    const bool retry = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       s.error_code() == grpc::StatusCode::ALREADY_EXISTS;
    if (!retry || absl::Now() >= deadline || stop_.HasBeenNotified()) break;
    if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS && !said) {
      LogWarning(absl::StrCat(s.error_message(), "; retrying until ",
                              absl::FormatTime("%H:%M:%S", deadline,
                                               absl::UTCTimeZone())));
      said = true;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (!s.ok()) {
    absl::Status st = FromGrpcStatus(s);
    return absl::Status(st.code(), absl::StrCat("worker ", o.worker_id,
                                                ": join of job ", o.job_id,
                                                " at ", o.rendezvous,
                                                " failed: ", st.message()));
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
                                o.metrics_port, std::move(handlers));
    if (!http.ok()) return http.status();
    http_ = std::move(*http);
  }
  v1::JoinReply reply;
  absl::Status s = JoinOnce(absl::Now() + o.join_timeout, &reply);
  if (!s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    is_joined_ = true;
  }
  OnMembership(reply.membership());
  absl::StatusOr<std::shared_ptr<Ring>> ring =
      AcquireRing(1, false, ~uint64_t{0}, absl::InfiniteFuture(), 0);
  if (!ring.ok()) return ring.status();
  server_->GetHealthCheckService()->SetServingStatus(true);
  LogInfo(absl::StrCat("joined job ", o.job_id, ": rank ", (*ring)->rank,
                       " of ", (*ring)->world, ", generation ",
                       (*ring)->generation, ", serving on ", address_));
  const absl::Duration interval =
      absl::Milliseconds(std::max<uint32_t>(reply.heartbeat_interval_ms(), 50));
  heartbeat_ = std::thread([this, interval] { HeartbeatLoop(interval); });
  watch_ = std::thread([this] { WatchLoop(); });
  background_ = std::thread([this] { BackgroundLoop(); });
  return absl::OkStatus();
}

void WorkerNode::OnMembership(const v1::Membership& m) {
  std::shared_ptr<Ring> ring;
  bool lost_peer = false;
  bool member = false;
  uint64_t before = 0;
  {
    absl::MutexLock lock(&mu_);
    before = latest_.generation();
    if (m.generation() <= before) return;
    latest_ = m;
    ring = ring_;
    std::set<std::string> alive;
    for (const v1::Member& x : m.members()) {
      if (!x.alive()) continue;
      alive.insert(absl::StrCat(x.worker_id(), "@", x.address()));
      member |= x.worker_id() == options_.worker_id &&
                x.address() == address_;
    }
    if (ring != nullptr) {
      for (const PeerInfo& p : ring->members) {
        lost_peer |= !alive.count(absl::StrCat(p.worker_id, "@", p.address));
      }
    }
    if (!member && is_joined_ && m.job_state() != v1::JOB_STATE_FORMING) {
      rejoin_ = true;
      ++epoch_;
    }
    for (const v1::Member& x : m.members()) {
      if (x.worker_id() == options_.worker_id && x.address() == address_ &&
          x.since_generation() == m.generation()) {
        admitted_at_ = absl::Now();  // new in this generation
      }
    }
  }
  if (before != 0) {
    LogWarning(absl::StrCat("job ", options_.job_id, ": ", m.change(),
                            member ? "" : "; this worker is not in the ring"));
  }
  if (ring == nullptr) return;
  if (lost_peer || !member) {
    // The running operation cannot finish: fail it now, naming the cause.
    // (Newcomers alone abort nothing: the ring switches between
    // operations; see InboxFor for a peer that switched first.)
    ring->comm->Abort(absl::AbortedError(
        absl::StrCat("job ", options_.job_id, " ", m.change())));
  }
}

void WorkerNode::CatchUp() {
  uint64_t known;
  uint64_t seen;
  {
    absl::MutexLock lock(&mu_);
    known = latest_.generation();
    seen = early_.empty() ? 0 : early_.rbegin()->first;
  }
  if (seen <= known) return;
  // A peer already runs a newer generation than any update this worker
  // got: ask the rendezvous now instead of waiting for the push.
  v1::HeartbeatRequest req;
  req.set_job_id(options_.job_id);
  req.set_worker_id(options_.worker_id);
  req.set_incarnation(incarnation_);
  req.set_generation(known);
  v1::HeartbeatReply reply;
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(2));
  if (rendezvous_->Heartbeat(&ctx, req, &reply).ok() && reply.has_membership()) {
    OnMembership(reply.membership());
  }
}

std::shared_ptr<WorkerNode::Ring> WorkerNode::CurrentRing() const {
  absl::MutexLock lock(&mu_);
  return ring_;
}

absl::StatusOr<std::shared_ptr<WorkerNode::Ring>> WorkerNode::AcquireRing(
    uint64_t seq, bool retry, uint64_t epoch, absl::Time issued,
    uint64_t numbered_generation) {
  std::vector<std::shared_ptr<Ring>> drop;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  if (!is_joined_) {
    return absl::FailedPreconditionError("worker has not joined its job yet");
  }
  auto stale = [&](const Ring& ring) {
    return ring.adopted && (epoch < ring.epoch || issued < ring.built);
  };
  const v1::Membership& m = latest_;
  if (ring_ != nullptr && ring_->generation == m.generation()) {
    if (stale(*ring_)) {
      return absl::AbortedError(absl::StrCat(
          "this call was made before worker ", options_.worker_id,
          " re-joined the ring of job ", options_.job_id, " (generation ",
          ring_->generation, "); the ring moved on without it: call again"));
    }
    return ring_;
  }
  if (m.job_state() == v1::JOB_STATE_WAITING) {
    return absl::UnavailableError(absl::StrCat(
        "job ", options_.job_id, " is below its minimum of ",
        m.min_world_size(), " members (generation ", m.generation(), ": ",
        m.change(), "); operations fail until enough members (re)join"));
  }
  // This worker numbers its calls like the ring only if it holds a number
  // from a ring of the membership it joined (or rejoined) in. A worker
  // admitted in an earlier generation that never ran an operation there
  // (a second admission came first) has none: the ring it built on joining
  // was waiting to adopt one. It is as new as a worker admitted now.
  const uint64_t last_ring = ring_ == nullptr ? 0 : ring_->generation;
  const bool numbered = ring_ != nullptr && numbered_generation != 0 &&
                        ring_->generation == numbered_generation && seq != 0;
  int rank = -1;
  uint64_t since = 0;
  for (const v1::Member& x : m.members()) {
    if (x.worker_id() == options_.worker_id && x.address() == address_ &&
        x.alive()) {
      rank = x.rank();
      since = x.since_generation();
    }
  }
  // Only a member that was in the ring before this one can carry the
  // ring's numbering; with none, the ring starts from this worker's number.
  bool others_older = false;
  for (const v1::Member& x : m.members()) {
    if (x.alive() && x.since_generation() < since &&
        !(x.worker_id() == options_.worker_id && x.address() == address_)) {
      others_older = true;
    }
  }
  const bool new_here = since > last_ring || !numbered;
  if (rank < 0) {
    return absl::UnavailableError(absl::StrCat(
        "worker ", options_.worker_id, " is not in the ring of job ",
        options_.job_id, " (generation ", m.generation(), ": ", m.change(),
        "); it is joining again"));
  }
  auto ring = std::make_shared<Ring>();
  ring->generation = m.generation();
  ring->rank = rank;
  ring->world = m.members_size();
  std::vector<std::string> addresses;
  for (const v1::Member& x : m.members()) {
    ring->members.push_back(PeerInfo{x.rank(), x.worker_id(), x.address()});
    addresses.push_back(x.address());
  }
  CommConfig c;
  c.rank = rank;
  c.world_size = ring->world;
  c.generation = ring->generation;
  c.members = ring->members;
  c.chunk_bytes = options_.chunk_bytes;
  c.default_timeout = options_.op_timeout;
  c.max_op_bytes = options_.max_op_bytes;
  c.test_reduce_delay = options_.test_reduce_delay;
  // New in a ring that already ran operations: take their numbering.
  c.first_op_seq = new_here && others_older ? 0 : std::max<uint64_t>(seq, 1);
  if (new_here && retry) {
    return absl::AbortedError(absl::StrCat(
        "worker ", options_.worker_id, " re-joined the ring of job ",
        options_.job_id, " (generation ", m.generation(),
        ") while this call ran: call again"));
  }
  ring->adopted = c.first_op_seq == 0;
  ring->epoch = epoch_;
  ring->built = admitted_at_;
  if (stale(*ring)) {
    return absl::AbortedError(absl::StrCat(
        "this call was made before worker ", options_.worker_id,
        " re-joined the ring of job ", options_.job_id, " (generation ",
        m.generation(), "); the ring moved on without it: call again"));
  }
  auto early = early_.find(ring->generation);
  if (early != early_.end()) {
    ring->inbox = early->second;
  } else {
    ring->inbox = std::make_shared<Inbox>();
  }
  early_.erase(early_.begin(), early_.upper_bound(ring->generation));
  reported_.erase(reported_.begin(),
                  reported_.lower_bound({ring->generation, -1}));
  const uint64_t generation = ring->generation;
  ring->inbox->SetLinkFailureHook(
      [this, generation](int peer, const absl::Status& status) {
        OnLinkFailed(generation, peer, status);
      });
  ring->transport = std::make_unique<GrpcTransport>(
      options_.job_id, ring->generation, rank, addresses, ring->inbox.get());
  ring->comm = std::make_unique<Communicator>(c, ring->transport.get(),
                                              ring->inbox.get());
  if (!servers_.empty()) {
    std::vector<std::string> server_addresses;
    for (const PeerInfo& p : servers_) server_addresses.push_back(p.address);
    ring->transport->SetServerAddresses(server_addresses);
    ring->comm->SetServers(servers_);
  }
  if (ring_ != nullptr) {
    ring->comm->InheritTelemetry(*ring_->comm);
    LogInfo(absl::StrCat("generation ", ring_->generation, "->",
                         ring->generation, ": now rank ", rank, " of ",
                         ring->world, c.first_op_seq == 0
                                          ? ", joining the ring's numbering"
                                          : absl::StrCat(", next op #",
                                                         c.first_op_seq)));
    retired_.push_back(std::move(ring_));
    // Keep the last two: peers may still finish an operation on them.
    while (retired_.size() > 2) {
      drop.push_back(std::move(retired_.front()));
      retired_.erase(retired_.begin());
    }
  }
  ring_ = ring;
  SetLogTag(absl::StrCat("worker ", options_.worker_id, " rank ", rank));
  return ring;
}

absl::StatusOr<std::shared_ptr<Inbox>> WorkerNode::InboxFor(
    uint64_t generation) {
  absl::MutexLock lock(&mu_);
  const uint64_t current = ring_ != nullptr ? ring_->generation : 0;
  if (ring_ != nullptr && generation == current) return ring_->inbox;
  for (const auto& r : retired_) {
    if (r->generation == generation) return r->inbox;
  }
  if (generation < current) {
    return absl::AbortedError(absl::StrCat(
        "generation ", generation, " of job ", options_.job_id,
        " is over: this worker is at generation ", current));
  }
  if (generation > std::max(current, latest_.generation()) + 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer link for generation ", generation, " of job ", options_.job_id,
        ", which is at generation ", latest_.generation()));
  }
  std::shared_ptr<Inbox>& inbox = early_[generation];
  if (inbox == nullptr) {
    inbox = std::make_shared<Inbox>();
    // A peer runs a newer generation: an operation of this one that is
    // still comparing fingerprints waits for that peer in vain. Stop it
    // (it re-runs on the new ring); one past that point finishes here.
    if (ring_ != nullptr) {
      ring_->comm->AbortIfUntouched(absl::AbortedError(absl::StrCat(
          "a peer already runs generation ", generation, " of job ",
          options_.job_id)));
    }
  }
  return inbox;
}

void WorkerNode::OnLinkFailed(uint64_t generation, int peer,
                              const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || ring_ == nullptr || ring_->generation != generation ||
      latest_.generation() != generation || peer < 0 ||
      peer >= ring_->world || peer == ring_->rank) {
    return;
  }
  if (!reported_.insert({generation, peer}).second) return;
  reports_.push_back(Report{generation,
                            ring_->members[static_cast<size_t>(peer)].worker_id,
                            std::string(status.message())});
}

std::string WorkerNode::metrics_address() const {
  return http_ ? http_->address() : "";
}

std::string WorkerNode::MetricsText() {
  std::shared_ptr<Ring> ring = CurrentRing();
  if (ring == nullptr) return "";
  const int rank = ring->rank;
  const uint64_t generation = ring->generation;
  const Telemetry t = ring->comm->GetTelemetry();
  const std::string base = absl::StrCat(
      "job=\"", PromEscape(options_.job_id), "\",rank=\"", rank, "\"");
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
  const int g = ring->world;
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

WorkerNode::~WorkerNode() { Shutdown(); }

void WorkerNode::Shutdown(bool leave) {
  if (http_) http_->Stop();
  if (shut_down_) return;
  shut_down_ = true;
  const absl::Time t0 = absl::Now();
  if (!stop_.HasBeenNotified()) stop_.Notify();
  std::shared_ptr<Ring> ring;
  bool joined;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
    ring = ring_;
    joined = is_joined_;
  }
  if (ring) ring->comm->Abort(absl::UnavailableError("worker is shutting down"));
  for (std::thread* t : {&heartbeat_, &watch_, &background_}) {
    if (t->joinable()) t->join();
  }
  const absl::Time t1 = absl::Now();
  if (joined && leave) {
    grpc::ClientContext ctx;
    SetTimeout(ctx, absl::Milliseconds(300));
    v1::LeaveRequest req;
    req.set_job_id(options_.job_id);
    req.set_worker_id(options_.worker_id);
    v1::LeaveReply reply;
    rendezvous_->Leave(&ctx, req, &reply);
  }
  const absl::Time t2 = absl::Now();
  {
    std::vector<std::shared_ptr<Ring>> rings;
    std::map<uint64_t, std::shared_ptr<Inbox>> early;
    {
      absl::MutexLock lock(&mu_);
      rings = std::move(retired_);
      rings.push_back(std::move(ring_));
      early.swap(early_);
    }
    ring.reset();
    rings.clear();  // closes the links, outside the lock
  }
  const absl::Time t3 = absl::Now();
  // A clean stop lets in-flight calls finish briefly; a simulated death
  // cancels them at once.
  server_->Shutdown(absl::ToChronoTime(
      absl::Now() + (leave ? absl::Milliseconds(100) : absl::ZeroDuration())));
  server_->Wait();
  LogInfo(absl::StrFormat(
      "stopped in %.0f ms (threads %.0f, leave %.0f, links %.0f, server %.0f)",
      absl::ToDoubleMilliseconds(absl::Now() - t0),
      absl::ToDoubleMilliseconds(t1 - t0), absl::ToDoubleMilliseconds(t2 - t1),
      absl::ToDoubleMilliseconds(t3 - t2),
      absl::ToDoubleMilliseconds(absl::Now() - t3)));
}

void WorkerNode::Wait() { server_->Wait(); }

int WorkerNode::rank() const {
  std::shared_ptr<Ring> ring = CurrentRing();
  return ring ? ring->rank : -1;
}
int WorkerNode::world_size() const {
  std::shared_ptr<Ring> ring = CurrentRing();
  return ring ? ring->world : 0;
}
Communicator* WorkerNode::communicator() {
  std::shared_ptr<Ring> ring = CurrentRing();
  return ring ? ring->comm.get() : nullptr;
}
int WorkerNode::open_peer_streams() const {
  return peer_service_->open_streams();
}

absl::StatusOr<OpResult> WorkerNode::Execute(const v1::OpSpec& spec,
                                             void* data) {
  HostOpBuffer buffer(data);
  return Run(spec, buffer);
}

absl::StatusOr<OpResult> WorkerNode::ExecuteOnDevice(
    const v1::OpSpec& spec, const v1::DeviceTensor& tensor) {
  if (device_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", options_.worker_id,
        " has no usable GPU: send host tensors, or start it with --device"));
  }
  DeviceHandle h;
  h.device = tensor.device();
  h.ipc_handle = tensor.ipc_handle();
  h.offset = tensor.offset();
  h.pid = tensor.pid();
  h.pointer = tensor.pointer();
  absl::StatusOr<void*> ptr = device_->Resolve(h);
  if (!ptr.ok()) return ptr.status();
  std::unique_ptr<OpBuffer> buffer = device_->MakeBuffer(*ptr);
  return Run(spec, *buffer);
}

absl::StatusOr<OpResult> WorkerNode::RunOn(Ring& ring, const v1::OpSpec& spec,
                                           OpBuffer& buffer,
                                           absl::Duration timeout) {
  Communicator* comm = ring.comm.get();
  switch (spec.kind()) {
    case v1::ALL_REDUCE:
      if (!IsValidDType(spec.dtype()) || !IsValidReduceOp(spec.op())) {
        return absl::InvalidArgumentError(
            "all_reduce: dtype and reduce op must be set and valid");
      }
    {
      if (spec.algorithm() < 0 || spec.algorithm() > 3) {
        return absl::InvalidArgumentError("all_reduce: unknown algorithm");
      }
      Algorithm algorithm = static_cast<Algorithm>(spec.algorithm());
      if (algorithm == Algorithm::kAuto) algorithm = options_.default_algorithm;
      if (algorithm == Algorithm::kParameterServer) {
        absl::Status s = EnsureServers(absl::Now() + timeout);
        if (!s.ok()) return s;
      }
      auto result = comm->AllReduce(buffer, spec.count(),
                                     static_cast<DType>(spec.dtype()),
                                     static_cast<ReduceOp>(spec.op()), timeout,
                                     algorithm);
      if (!result.ok() && algorithm == Algorithm::kParameterServer) {
        // The server may have moved: look it up again next time.
        absl::MutexLock lock(&servers_mu_);
        have_servers_ = false;
      }
      return result;
    }
    case v1::BROADCAST:
      if (!IsValidDType(spec.dtype())) {
        return absl::InvalidArgumentError("broadcast: dtype must be valid");
      }
      return comm->Broadcast(buffer, spec.count(),
                              static_cast<DType>(spec.dtype()), spec.root(),
                              timeout);
    case v1::BARRIER:
      return comm->Barrier(timeout);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown operation kind ", spec.kind()));
  }
}

absl::StatusOr<OpResult> WorkerNode::Run(const v1::OpSpec& spec,
                                         OpBuffer& buffer) {
  uint64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    epoch = epoch_;
  }
  const absl::Time issued =
      spec.issued_unix_ms() > 0
          ? absl::FromUnixMillis(static_cast<int64_t>(spec.issued_unix_ms()))
          : absl::InfiniteFuture();
  absl::MutexLock run_lock(&run_mu_);
  const absl::Duration timeout = spec.timeout_ms() > 0
                                     ? absl::Milliseconds(spec.timeout_ms())
                                     : options_.op_timeout;
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t retry_seq = 0;
  std::string retry_cause;
  for (int attempt = 0;; ++attempt) {
    CatchUp();
    const uint64_t seq = retry_seq > 0 ? retry_seq : next_seq_;
    uint64_t numbered = 0;
    if (std::shared_ptr<Ring> now = CurrentRing();
        now != nullptr && now->comm->next_op_seq() != 0) {
      numbered = now->generation;
    }
    absl::StatusOr<std::shared_ptr<Ring>> ring =
        AcquireRing(seq, retry_seq > 0, epoch, issued, numbered);
    if (!ring.ok()) {
      // The call is numbered all the same: the other ranks' copies of it
      // fail too (or already ran), and the next call is the next number.
      if (next_seq_ != 0 && retry_seq == 0) ++next_seq_;
      return ring.status();
    }
    Communicator* comm = (*ring)->comm.get();
    if (comm->next_op_seq() != 0 && seq != 0) comm->set_next_op_seq(seq);
    absl::StatusOr<OpResult> result =
        RunOn(**ring, spec, buffer,
              std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    next_seq_ = comm->next_op_seq();
    if (result.ok()) return result;
    if (retry_seq > 0) {
      // The re-run failed too: say why it was re-run (that names the lost
      // peer), not only what it waited for on the new ring.
      return absl::Status(
          result.status().code(),
          absl::StrCat(result.status().message(), " (re-run on generation ",
                       (*ring)->generation, " after: ", retry_cause, ")"));
    }
    // Failed before it sent any data, because the membership changed (a
    // peer's link broke, the rendezvous pushed a new generation, a peer
    // already runs the next one): no rank can have completed it, so run it
    // again on the new ring with the same sequence number. The new
    // generation may still be on its way (the rendezvous probes a broken
    // link's peer first): wait for it briefly.
    auto untouched = result.status().GetPayload(kUntouchedPayload);
    uint64_t n = 0;
    const absl::StatusCode code = result.status().code();
    if (!untouched.has_value() || !absl::SimpleAtoi(std::string(*untouched), &n) ||
        (code != absl::StatusCode::kAborted &&
         code != absl::StatusCode::kUnavailable) ||
        attempt >= 4 || absl::Now() >= deadline) {
      return result;
    }
    {
      absl::MutexLock lock(&mu_);
      const uint64_t failed_on = (*ring)->generation;
      auto newer = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || latest_.generation() > failed_on;
      };
      mu_.AwaitWithDeadline(
          absl::Condition(&newer),
          std::min(deadline, absl::Now() + absl::Milliseconds(1500)));
      if (stopping_ || latest_.generation() <= failed_on ||
          latest_.job_state() == v1::JOB_STATE_WAITING) {
        return result;
      }
    }
    LogInfo(absl::StrCat("operation #", n, " had not touched the buffer when "
                         "the membership changed: running it on the new ring"));
    retry_seq = n;
    retry_cause = std::string(result.status().message());
  }
}

void WorkerNode::HeartbeatLoop(absl::Duration interval) {
  bool now_again = false;
  while (now_again || !stop_.WaitForNotificationWithTimeout(interval)) {
    now_again = false;
    if (stop_.HasBeenNotified()) break;
    v1::HeartbeatRequest req;
    req.set_job_id(options_.job_id);
    req.set_worker_id(options_.worker_id);
    req.set_incarnation(incarnation_);
    bool claiming;
    {
      absl::MutexLock lock(&mu_);
      req.set_generation(latest_.generation());
      claiming = claim_ && ring_ != nullptr &&
                 ring_->generation == latest_.generation() &&
                 latest_.job_state() != v1::JOB_STATE_WAITING;
      if (claiming) *req.mutable_claim() = latest_;
    }
    *req.mutable_telemetry() = CollectTelemetry();
    v1::HeartbeatReply reply;
    grpc::ClientContext ctx;
    SetTimeout(ctx, std::max(interval, absl::Seconds(1)));
    grpc::Status s = rendezvous_->Heartbeat(&ctx, req, &reply);
    if (s.ok()) {
      {
        absl::MutexLock lock(&mu_);
        if (claim_) LogInfo("the rendezvous knows this ring again");
        claim_ = false;
      }
      if (reply.has_membership()) OnMembership(reply.membership());
      continue;
    }
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      absl::MutexLock lock(&mu_);
      if (!claiming) {
        // The rendezvous restarted (or dropped the job during a partition):
        // tell it what the ring is, right away.
        LogWarning(absl::StrCat("the rendezvous does not know this worker (",
                                s.error_message(), "): re-registering with "
                                "generation ", latest_.generation()));
        claim_ = true;
        now_again = true;
      } else {
        rejoin_ = true;  // the claim was refused: join as a new member
      }
    } else if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      std::shared_ptr<Ring> ring;
      {
        absl::MutexLock lock(&mu_);
        if (!rejoin_) LogWarning(s.error_message());
        rejoin_ = true;
        ring = ring_;
      }
      if (ring) {
        ring->comm->Abort(absl::AbortedError(absl::StrCat(
            "the rendezvous declared this worker lost: ", s.error_message())));
      }
    }
    // Any other error (the rendezvous is down or partitioned away) does
    // not stop the ring: operations go on, heartbeats retry.
  }
}

void WorkerNode::WatchLoop() {
  while (!stop_.HasBeenNotified()) {
    v1::WatchRequest req;
    req.set_job_id(options_.job_id);
    req.set_worker_id(options_.worker_id);
    {
      absl::MutexLock lock(&mu_);
      req.set_known_generation(latest_.generation());
    }
    grpc::ClientContext ctx;
    if (!Track(&ctx)) break;
    std::unique_ptr<grpc::ClientReader<v1::Membership>> reader =
        rendezvous_->Watch(&ctx, req);
    v1::Membership m;
    while (reader->Read(&m)) OnMembership(m);
    reader->Finish().IgnoreError();
    Untrack(&ctx);
    stop_.WaitForNotificationWithTimeout(absl::Milliseconds(300));
  }
}

void WorkerNode::BackgroundLoop() {
  while (!stop_.HasBeenNotified()) {
    std::optional<Report> report;
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
      v1::ReportFailureRequest req;
      req.set_job_id(options_.job_id);
      req.set_worker_id(options_.worker_id);
      req.set_generation(report->generation);
      req.set_suspect_worker_id(report->suspect);
      req.set_reason(report->reason);
      v1::ReportFailureReply reply;
      grpc::ClientContext ctx;
      SetTimeout(ctx, absl::Seconds(3));
      if (!Track(&ctx)) break;
      grpc::Status s = rendezvous_->ReportFailure(&ctx, req, &reply);
      Untrack(&ctx);
      LogInfo(absl::StrCat("reported the broken link with ", report->suspect,
                           ": ", s.ok() ? (reply.declared_lost()
                                               ? "declared lost"
                                               : "not declared lost")
                                        : s.error_message(),
                           s.ok() ? absl::StrCat(" (", reply.verdict(), ")")
                                  : std::string()));
      continue;
    }
    if (!rejoin) continue;
    LogInfo(absl::StrCat("joining job ", options_.job_id, " again"));
    v1::JoinReply reply;
    absl::Status s = JoinOnce(absl::Now() + options_.join_timeout, &reply);
    if (s.ok()) {
      OnMembership(reply.membership());
      LogInfo(absl::StrCat("admitted again: rank ", reply.rank(), " of ",
                           reply.world_size(), ", generation ",
                           reply.generation()));
    } else if (!stop_.HasBeenNotified()) {
      LogWarning(s.ToString());
      absl::MutexLock lock(&mu_);
      rejoin_ = true;
    }
  }
}

absl::Status WorkerNode::EnsureServers(absl::Time deadline) {
  absl::MutexLock lock(&servers_mu_);
  if (have_servers_) return absl::OkStatus();
  bool said = false;
  for (;;) {
    v1::LookupServersRequest req;
    req.set_job_id(options_.job_id);
    v1::LookupServersReply reply;
    grpc::ClientContext ctx;
    SetTimeout(ctx, absl::Seconds(2));
    grpc::Status s = rendezvous_->LookupServers(&ctx, req, &reply);
    if (s.ok()) {
      std::vector<PeerInfo> servers;
      std::vector<std::string> addresses;
      for (const v1::Member& m : reply.servers()) {
        servers.push_back(PeerInfo{m.rank(), m.worker_id(), m.address()});
        addresses.push_back(m.address());
      }
      std::shared_ptr<Ring> ring = CurrentRing();
      if (ring != nullptr) {
        ring->transport->SetServerAddresses(addresses);
        ring->comm->SetServers(servers);
      }
      {
        absl::MutexLock lock(&mu_);
        servers_ = servers;
      }
      have_servers_ = true;
      if (said) LogInfo("parameter server found");
      return absl::OkStatus();
    }
    if (!said) {
      LogInfo(s.error_message());  // "waiting for parameter server of job X"
      said = true;
    }
    if (absl::Now() + absl::Milliseconds(200) >= deadline ||
        stop_.HasBeenNotified()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "all_reduce (ps): no parameter server before the deadline: ",
          s.error_message()));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

v1::WorkerTelemetry WorkerNode::CollectTelemetry() {
  v1::WorkerTelemetry t;
  std::shared_ptr<Ring> ring = CurrentRing();
  if (ring == nullptr) return t;
  const Telemetry tel = ring->comm->GetTelemetry();
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
  const Progress p = ring->comm->GetProgress();
  t.set_awaited_rank(-1);
  if (p.busy) {
    t.set_current_op(p.op);
    t.set_phase(std::string(PhaseName(p.phase)));
    t.set_step(p.step);
    t.set_chunk(p.chunk + 1);
    t.set_chunks(std::max(p.chunks, 1));
    t.set_awaited_rank(p.awaited_rank);
    if (p.awaited_rank >= 0) {
      t.set_waiting_for_s(absl::ToDoubleSeconds(absl::Now() - p.waiting_since));
    }
  }
  return t;
}

}  // namespace halka
