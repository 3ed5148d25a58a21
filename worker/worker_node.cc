#include "worker/worker_node.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <list>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "worker/core/cuda/device_memory.h"
#include "worker/grpc_transport.h"

namespace halka {
namespace {

std::string DefaultWorkerId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, "-", getpid());
}

v1::OpStats ToStats(const OpResult& r, int rank, int world) {
  v1::OpStats s;
  s.set_op_seq(r.op_seq);
  s.set_algorithm(r.algorithm);
  s.set_bytes_sent(r.bytes_sent);
  s.set_bytes_received(r.bytes_received);
  s.set_seconds(absl::ToDoubleSeconds(r.elapsed));
  s.set_generation(r.generation);
  s.set_rank(rank);
  s.set_world_size(world);
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
      *reply->mutable_stats() =
          ToStats(*result, node_->rank(), node_->world_size());
      return grpc::Status::OK;
    }
    uint8_t* data = nullptr;
    const uint64_t es = IsValidDType(spec.dtype())
                            ? DTypeSize(static_cast<DType>(spec.dtype()))
                            : 0;
    if (spec.kind() != v1::BARRIER) {
      if (es == 0) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "run: invalid dtype");
      }
      if (spec.count() > node_->options_.max_op_bytes / es) {
        return grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("run: ", spec.count(), " elements exceed the limit of ",
                         node_->options_.max_op_bytes, " bytes"));
      }
      const uint64_t bytes = spec.count() * es;
      if (req->shm_offset() > req->shm_size() ||
          bytes > req->shm_size() - req->shm_offset()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "run: region lies outside the shm object");
      }
      if (bytes > 0) {
        auto base = shm_.Map(req->shm_name(), req->shm_size());
        if (!base.ok()) return ToGrpcStatus(base.status());
        data = *base + req->shm_offset();
      }
    }
    auto result = node_->Execute(spec, data);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *reply->mutable_stats() =
        ToStats(*result, node_->rank(), node_->world_size());
    return grpc::Status::OK;
  }

  grpc::Status RunInline(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::InlineReply, v1::InlineRequest>* stream)
      override {
    v1::InlineRequest msg;
    if (!stream->Read(&msg)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "run_inline: no request");
    }
    const v1::OpSpec spec = msg.spec();
    uint64_t bytes = 0;
    if (spec.kind() != v1::BARRIER) {
      if (!IsValidDType(spec.dtype())) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "run_inline: invalid dtype");
      }
      const uint64_t es = DTypeSize(static_cast<DType>(spec.dtype()));
      if (spec.count() > node_->options_.max_op_bytes / es) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("run_inline: ", spec.count(),
                                         " elements exceed the limit of ",
                                         node_->options_.max_op_bytes,
                                         " bytes"));
      }
      bytes = spec.count() * es;
    }
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
    *done.mutable_stats() = ToStats(*result, node_->rank(), node_->world_size());
    stream->Write(done);
    return grpc::Status::OK;
  }

  grpc::Status GetInfo(grpc::ServerContext*, const v1::InfoRequest*,
                       v1::InfoReply* reply) override {
    absl::MutexLock lock(&node_->mu_);
    if (!node_->is_joined_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "worker has not joined its job yet");
    }
    reply->set_job_id(node_->options_.job_id);
    reply->set_worker_id(node_->options_.worker_id);
    reply->set_rank(node_->joined_.rank());
    reply->set_world_size(node_->joined_.world_size());
    reply->set_generation(node_->generation_);
    *reply->mutable_members() = node_->joined_.members();
    reply->set_device(node_->options_.device);
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
  ShmCache shm_;
};

WorkerNode::WorkerNode(WorkerOptions options) : options_(std::move(options)) {}

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
  node->inbox_ = std::make_unique<Inbox>();
  node->peer_service_ = std::make_unique<PeerService>(o.job_id, node->inbox_.get());
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
    auto http = HttpServer::Start(host.empty() ? "0.0.0.0" : host,
                                  o.metrics_port, std::move(handlers));
    if (!http.ok()) return http.status();
    http_ = std::move(*http);
    LogInfo(absl::StrCat("/metrics on ", http_->address()));
  }
  v1::JoinRequest req;
  req.set_job_id(o.job_id);
  req.set_worker_id(o.worker_id);
  req.set_address(address_);
  req.set_world_size(o.world_size);
  req.set_device(o.device);
  if (o.requested_rank >= 0) {
    req.set_requested_rank(o.requested_rank);
    req.set_has_requested_rank(true);
  }
  req.set_wait_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(o.join_timeout)));
  v1::JoinReply reply;
  // The rendezvous may start after the workers: retry UNAVAILABLE until
  // the join timeout.
  const absl::Time deadline = absl::Now() + o.join_timeout;
  grpc::Status s;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline + absl::Seconds(2)));
    ctx.set_wait_for_ready(true);
    s = rendezvous_->Join(&ctx, req, &reply);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE ||
        absl::Now() >= deadline || stop_.HasBeenNotified()) {
      break;
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
  CommConfig c;
  c.rank = reply.rank();
  c.world_size = reply.world_size();
  c.generation = reply.generation();
  c.chunk_bytes = o.chunk_bytes;
  c.default_timeout = o.op_timeout;
  c.max_op_bytes = o.max_op_bytes;
  c.test_reduce_delay = o.test_reduce_delay;
  std::vector<std::string> addresses;
  for (const v1::Member& m : reply.members()) {
    c.members.push_back(PeerInfo{m.rank(), m.worker_id(), m.address()});
    addresses.push_back(m.address());
  }
  peer_service_->SetWorld(reply.world_size());
  transport_ = std::make_unique<GrpcTransport>(o.job_id, reply.generation(),
                                               reply.rank(), addresses,
                                               inbox_.get());
  comm_ = std::make_unique<Communicator>(c, transport_.get(), inbox_.get());
  {
    absl::MutexLock lock(&mu_);
    joined_ = reply;
    generation_ = reply.generation();
    is_joined_ = true;
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  SetLogTag(absl::StrCat("worker ", o.worker_id, " rank ", reply.rank()));
  LogInfo(absl::StrCat("joined job ", o.job_id, ": rank ", reply.rank(), " of ",
                       reply.world_size(), ", generation ", reply.generation(),
                       ", serving on ", address_));
  const absl::Duration interval =
      absl::Milliseconds(std::max<uint32_t>(reply.heartbeat_interval_ms(), 50));
  heartbeat_ = std::thread([this, interval] { HeartbeatLoop(interval); });
  return absl::OkStatus();
}

std::string WorkerNode::metrics_address() const {
  return http_ ? http_->address() : "";
}

std::string WorkerNode::MetricsText() {
  int rank = -1;
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!is_joined_) return "";
    rank = joined_.rank();
    generation = generation_;
  }
  const Telemetry t = comm_->GetTelemetry();
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
  const int g = world_size();
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
  if (comm_) comm_->Abort(absl::UnavailableError("worker is shutting down"));
  if (heartbeat_.joinable()) heartbeat_.join();
  const absl::Time t1 = absl::Now();
  bool joined;
  {
    absl::MutexLock lock(&mu_);
    joined = is_joined_;
  }
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
  transport_.reset();
  const absl::Time t3 = absl::Now();
  // A clean stop lets in-flight calls finish briefly; a simulated death
  // cancels them at once.
  server_->Shutdown(absl::ToChronoTime(
      absl::Now() + (leave ? absl::Milliseconds(100) : absl::ZeroDuration())));
  server_->Wait();
  LogInfo(absl::StrFormat(
      "stopped in %.0f ms (heartbeat %.0f, leave %.0f, links %.0f, server %.0f)",
      absl::ToDoubleMilliseconds(absl::Now() - t0),
      absl::ToDoubleMilliseconds(t1 - t0), absl::ToDoubleMilliseconds(t2 - t1),
      absl::ToDoubleMilliseconds(t3 - t2),
      absl::ToDoubleMilliseconds(absl::Now() - t3)));
}

void WorkerNode::Wait() { server_->Wait(); }

int WorkerNode::rank() const {
  absl::MutexLock lock(&mu_);
  return joined_.rank();
}
int WorkerNode::world_size() const {
  absl::MutexLock lock(&mu_);
  return joined_.world_size();
}
Communicator* WorkerNode::communicator() { return comm_.get(); }
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

absl::StatusOr<OpResult> WorkerNode::Run(const v1::OpSpec& spec,
                                         OpBuffer& buffer) {
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError("worker has not joined its job yet");
  }
  const absl::Duration timeout = absl::Milliseconds(spec.timeout_ms());
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
        const absl::Duration t = timeout > absl::ZeroDuration()
                                     ? timeout
                                     : options_.op_timeout;
        absl::Status s = EnsureServers(absl::Now() + t);
        if (!s.ok()) return s;
      }
      auto result = comm_->AllReduce(buffer, spec.count(),
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
      return comm_->Broadcast(buffer, spec.count(),
                              static_cast<DType>(spec.dtype()), spec.root(),
                              timeout);
    case v1::BARRIER:
      return comm_->Barrier(timeout);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown operation kind ", spec.kind()));
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
      transport_->SetServerAddresses(addresses);
      comm_->SetServers(servers);
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
  const Telemetry tel = comm_->GetTelemetry();
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
  const Progress p = comm_->GetProgress();
  t.set_awaited_rank(-1);
  if (p.busy) {
    t.set_current_op(p.op);
    t.set_phase(std::string(PhaseName(p.phase)));
    t.set_step(p.step);
    t.set_awaited_rank(p.awaited_rank);
    if (p.awaited_rank >= 0) {
      t.set_waiting_for_s(absl::ToDoubleSeconds(absl::Now() - p.waiting_since));
    }
  }
  return t;
}

void WorkerNode::HeartbeatLoop(absl::Duration interval) {
  while (!stop_.WaitForNotificationWithTimeout(interval)) {
    v1::HeartbeatRequest req;
    req.set_job_id(options_.job_id);
    req.set_worker_id(options_.worker_id);
    {
      absl::MutexLock lock(&mu_);
      req.set_generation(generation_);
    }
    *req.mutable_telemetry() = CollectTelemetry();
    v1::HeartbeatReply reply;
    grpc::ClientContext ctx;
    SetTimeout(ctx, std::max(interval, absl::Seconds(1)));
    grpc::Status s = rendezvous_->Heartbeat(&ctx, req, &reply);
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        comm_->Abort(absl::AbortedError(absl::StrCat(
            "the rendezvous declared this worker dead: ", s.error_message())));
      }
      continue;  // a rendezvous outage does not stop the ring
    }
    uint64_t mine;
    {
      absl::MutexLock lock(&mu_);
      mine = generation_;
    }
    if (reply.generation() != mine) {
      std::string lost;
      for (int d : reply.dead_ranks()) {
        if (d >= 0 && d < static_cast<int>(comm_->config().members.size())) {
          absl::StrAppend(&lost, lost.empty() ? "" : ", ",
                          DescribePeer(comm_->config().members[d]));
        }
      }
      const std::string msg = absl::StrCat(
          "job ", options_.job_id, " generation ", mine, "->",
          reply.generation(), ": lost ", lost.empty() ? "a member" : lost);
      LogWarning(msg);
      comm_->Abort(absl::AbortedError(msg));
      absl::MutexLock lock(&mu_);
      generation_ = reply.generation();
    }
  }
}

}  // namespace halka
