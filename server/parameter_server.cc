#include "server/parameter_server.h"

#include <deque>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "worker/core/payload.h"
#include "worker/core/reduce.h"
#include "worker/core/ring_plan.h"
#include "worker/frame_codec.h"

namespace halka {

// One worker's stream. Writes are queued and go out one at a time.
class ParameterServerService::Stream
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  Stream(ParameterServerService* service, grpc::CallbackServerContext* ctx)
      : service_(service) {
    absl::Status s = ParseMetadata(ctx);
    if (!s.ok()) {
      finished_ = true;
      Finish(ToGrpcStatus(s));
      return;
    }
    {
      absl::MutexLock lock(&service_->mu_);
      service_->streams_[rank_] = this;
    }
    StartRead(&buffer_);
  }

  // Queues a frame; `keep` owns the payload until it is written.
  void Enqueue(grpc::ByteBuffer frame, std::shared_ptr<void> keep) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    queue_.push_back(Pending{std::move(frame), std::move(keep)});
    if (!writing_) {
      writing_ = true;
      StartWrite(&queue_.front().frame);
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    if (!ok) queue_.clear();
    if (ok && !queue_.empty()) {
      StartWrite(&queue_.front().frame);
      return;
    }
    writing_ = false;
    MaybeFinishLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      read_done_ = true;
      MaybeFinishLocked();
      return;
    }
    absl::StatusOr<InFrame> frame = DecodeFrame(buffer_);
    buffer_.Clear();
    if (!frame.ok()) {
      absl::MutexLock lock(&mu_);
      read_done_ = true;
      status_ = ToGrpcStatus(frame.status());
      MaybeFinishLocked();
      return;
    }
    service_->OnFrame(rank_, world_, *std::move(frame));
    StartRead(&buffer_);
  }

  void OnDone() override {
    if (rank_ >= 0) service_->OnStreamClosed(rank_, this);
    if (counted_) service_->limiter_.Release(peer_);
    delete this;
  }

 private:
  struct Pending {
    grpc::ByteBuffer frame;
    std::shared_ptr<void> keep;
  };

  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (read_done_ && !writing_ && !finished_) {
      finished_ = true;
      Finish(status_);
    }
  }

  absl::Status ParseMetadata(grpc::CallbackServerContext* ctx) {
    peer_ = ctx->peer();
    if (absl::Status s = service_->limiter_.Acquire(peer_); !s.ok()) return s;
    counted_ = true;
    const auto& md = ctx->client_metadata();
    auto get = [&](const char* key) -> std::string {
      auto it = md.find(key);
      return it == md.end() ? std::string()
                            : std::string(it->second.data(), it->second.size());
    };
    if (get("halka-job") != service_->job_id_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parameter server of job '", service_->job_id_,
          "' reached by a worker of job '", get("halka-job"), "'"));
    }
    if (!absl::SimpleAtoi(get("halka-rank"), &rank_) ||
        !absl::SimpleAtoi(get("halka-world-size"), &world_) || world_ < 1 ||
        world_ > 4096 || rank_ < 0 || rank_ >= world_) {
      rank_ = -1;
      return absl::InvalidArgumentError(
          "parameter server stream without a valid halka-rank and "
          "halka-world-size");
    }
    return absl::OkStatus();
  }

  ParameterServerService* const service_;
  std::string peer_;
  bool counted_ = false;
  grpc::ByteBuffer buffer_;
  int rank_ = -1;
  int world_ = 0;
  absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

ParameterServerService::ParameterServerService(std::string job_id, int shard,
                                               int shards)
    : job_id_(std::move(job_id)), shard_(shard), shards_(shards) {}

ParameterServerService::~ParameterServerService() = default;

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ParameterServerService::Reduce(grpc::CallbackServerContext* context) {
  return new Stream(this, context);
}

PsStats ParameterServerService::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void ParameterServerService::FailOp(uint64_t op_seq, const absl::Status& status,
                                    int skip) {
  auto it = ops_.find(op_seq);
  if (it == ops_.end()) return;
  FrameMeta meta;
  meta.kind = FrameKind::kAbort;
  meta.generation = it->second.generation;
  meta.op_seq = op_seq;
  meta.sender_rank = -1;
  meta.origin_rank = -1;
  meta.abort_code = status.code();
  meta.message = std::string(status.message());
  for (auto& [rank, stream] : streams_) {
    if (rank == skip || rank >= it->second.world) continue;
    stream->Enqueue(EncodeFrame(meta, {}), nullptr);
  }
  ops_.erase(it);
  ++stats_.ops_failed;
}

void ParameterServerService::OnStreamClosed(int rank, Stream* stream) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(rank);
  if (it == streams_.end() || it->second != stream) return;  // replaced
  streams_.erase(it);
  std::vector<uint64_t> pending;
  for (const auto& [seq, op] : ops_) pending.push_back(seq);
  for (uint64_t seq : pending) {
    FailOp(seq,
           absl::UnavailableError(absl::StrCat(
               "parameter server shard ", shard_, ": the stream of rank ",
               rank, " closed in the middle of the operation")),
           rank);
  }
}

void ParameterServerService::OnFrame(int rank, int world, InFrame frame) {
  absl::MutexLock lock(&mu_);
  const FrameMeta& m = frame.meta;
  const std::string who = absl::StrCat("parameter server shard ", shard_);
  if (m.kind == FrameKind::kAbort) {
    FailOp(m.op_seq,
           absl::Status(m.abort_code == absl::StatusCode::kOk
                            ? absl::StatusCode::kAborted
                            : m.abort_code,
                        m.message),
           rank);
    return;
  }
  auto [it, created] = ops_.try_emplace(m.op_seq);
  Op& op = it->second;
  if (created) {
    op.world = world;
    op.generation = m.generation;
    op.have_fp.assign(static_cast<size_t>(world), false);
  }
  if (m.kind == FrameKind::kFingerprint) {
    if (op.have_fp[static_cast<size_t>(rank)]) {
      FailOp(m.op_seq, absl::DataLossError(absl::StrCat(
                           who, ": a second fingerprint from rank ", rank)), -1);
      return;
    }
    if (op.fp_rank < 0) {
      op.fp = m.fingerprint;
      op.fp_rank = rank;
      const std::vector<Range> parts = PlanSegments(op.fp.count, shards_);
      op.shard_offset = parts[static_cast<size_t>(shard_)].offset;
      op.shard_count = parts[static_cast<size_t>(shard_)].count;
    } else if (m.fingerprint != op.fp) {
      FailOp(m.op_seq,
             absl::FailedPreconditionError(absl::StrCat(
                 who, ": ranks disagree on the operation: rank ", op.fp_rank,
                 " calls ", op.fp.ToString(), " but rank ", rank, " calls ",
                 m.fingerprint.ToString())),
             -1);
      return;
    }
    op.have_fp[static_cast<size_t>(rank)] = true;
    ++op.fps;
    if (op.fps == op.world && op.shard_count == 0) {
      ops_.erase(it);
      ++stats_.ops_completed;
    }
    return;
  }
  // DATA: must fit this shard's part of the fingerprinted operation.
  const size_t es = DTypeSize(op.fp.dtype);
  if (!op.have_fp[static_cast<size_t>(rank)] || m.phase != Phase::kPsPush ||
      m.dtype != op.fp.dtype || m.segment != shard_ ||
      m.offset < op.shard_offset ||
      m.offset + m.count > op.shard_offset + op.shard_count ||
      frame.PayloadBytes() != m.count * es) {
    FailOp(m.op_seq,
           absl::DataLossError(absl::StrCat(
               who, ": a frame from rank ", rank, " does not fit ",
               op.fp.ToString(), " (offset ", m.offset, ", count ", m.count,
               ")")),
           -1);
    return;
  }
  Chunk& c = op.chunks[m.offset];
  if (c.frames.empty()) {
    c.frames.resize(static_cast<size_t>(op.world));
    c.have.assign(static_cast<size_t>(op.world), false);
    c.count = m.count;
  }
  if (c.have[static_cast<size_t>(rank)] || c.count != m.count) {
    FailOp(m.op_seq, absl::DataLossError(absl::StrCat(
                         who, ": duplicate or inconsistent chunk at offset ",
                         m.offset, " from rank ", rank)), -1);
    return;
  }
  stats_.bytes_in += frame.PayloadBytes();
  c.frames[static_cast<size_t>(rank)] = std::move(frame);
  c.have[static_cast<size_t>(rank)] = true;
  ++c.arrived;
  Flush(it->first, op);
  if (op.sent_elems == op.shard_count && op.fps == op.world) {
    ops_.erase(it);
    ++stats_.ops_completed;
  }
}

void ParameterServerService::Flush(uint64_t op_seq, Op& op) {
  const size_t es = DTypeSize(op.fp.dtype);
  // Results leave in offset order: a later chunk can only be complete when
  // every rank has also sent every earlier one.
  while (!op.chunks.empty() && op.chunks.begin()->second.arrived == op.world) {
    const uint64_t offset = op.chunks.begin()->first;
    Chunk& c = op.chunks.begin()->second;
    const uint64_t count = c.count;
    auto result = std::make_shared<std::vector<uint8_t>>(count * es);
    for (int r = 0; r < op.world; ++r) {
      ApplyPayload(op.fp.dtype, op.fp.op, /*reduce=*/r > 0, result->data(),
                   c.frames[static_cast<size_t>(r)]);
    }
    if (op.fp.op == ReduceOp::kAvg) {
      FinalizeAvg(op.fp.dtype, result->data(), count, op.world);
    }
    op.chunks.erase(op.chunks.begin());
    FrameMeta meta;
    meta.kind = FrameKind::kData;
    meta.generation = op.generation;
    meta.op_seq = op_seq;
    meta.phase = Phase::kPsPull;
    meta.segment = shard_;
    meta.offset = offset;
    meta.count = count;
    meta.dtype = op.fp.dtype;
    meta.op = op.fp.op;
    meta.sender_rank = -1;
    grpc::ByteBuffer frame = EncodeFrame(meta, *result);
    for (int r = 0; r < op.world; ++r) {
      auto s = streams_.find(r);
      if (s == streams_.end()) continue;  // its closing fails the op
      s->second->Enqueue(frame, result);
      stats_.bytes_out += result->size();
    }
    op.sent_elems += count;
  }
}

absl::StatusOr<std::unique_ptr<ParameterServerNode>> ParameterServerNode::Start(
    PsOptions options) {
  if (options.shards < 1 || options.shard < 0 ||
      options.shard >= options.shards) {
    return absl::InvalidArgumentError("ps: --shard must be in [0, --shards)");
  }
  if (options.server_id.empty()) {
    options.server_id = absl::StrCat("ps-", options.shard);
  }
  auto creds = ServerCredentialsFor(options.listen, ServerRole::kSingleJob);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<ParameterServerNode> n(new ParameterServerNode());
  n->options_ = options;
  n->service_ = std::make_unique<ParameterServerService>(
      options.job_id, options.shard, options.shards);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(builder);
  int port = 0;
  builder.AddListeningPort(options.listen, *creds, &port);
  builder.RegisterService(n->service_.get());
  n->server_ = builder.BuildAndStart();
  if (!n->server_ || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("ps: cannot listen on ", options.listen));
  }
  n->address_ = DialableAddress(options.listen, port, options.advertise);
  if (!options.rendezvous.empty()) {
    n->rendezvous_ = v1::Rendezvous::NewStub(MakeChannel(options.rendezvous));
    n->registrar_ = std::thread([p = n.get()] { p->RegisterLoop(); });
  }
  return n;
}

void ParameterServerNode::RegisterLoop() {
  bool announced = false;
  absl::Duration wait = absl::ZeroDuration();
  while (!stop_.WaitForNotificationWithTimeout(wait)) {
    v1::RegisterServerRequest req;
    req.set_job_id(options_.job_id);
    req.set_server_id(options_.server_id);
    req.set_address(address_);
    req.set_shard(options_.shard);
    req.set_shards(options_.shards);
    v1::RegisterServerReply reply;
    grpc::ClientContext ctx;
    SetTimeout(ctx, absl::Seconds(2));
    grpc::Status s = rendezvous_->RegisterServer(&ctx, req, &reply);
    if (s.ok() && !announced) {
      LogInfo(absl::StrCat("registered as parameter server shard ",
                           options_.shard, " of ", options_.shards, " for job ",
                           options_.job_id, " at ", address_));
      announced = true;
    } else if (!s.ok()) {
      LogWarning(absl::StrCat("cannot register with the rendezvous at ",
                              options_.rendezvous, ": ", s.error_message()));
    }
    wait = s.ok() ? options_.register_interval : absl::Milliseconds(500);
  }
}

ParameterServerNode::~ParameterServerNode() { Shutdown(); }

void ParameterServerNode::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  stop_.Notify();
  if (registrar_.joinable()) registrar_.join();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

}  // namespace halka
