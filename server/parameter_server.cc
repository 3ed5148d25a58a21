#include "server/parameter_server.h"

#include <deque>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "codec/frame_codec.h"
#include "codec/link_metadata.h"

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
      service_->state_.StreamOpened(rank_);
    }
    StartRead(&buffer_);
  }

  // Queues a frame; `keep` owns the payload until it is written.
  void Enqueue(grpc::ByteBuffer frame, std::shared_ptr<const void> keep) {
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
    delete this;
  }

 private:
  struct Pending {
    grpc::ByteBuffer frame;
    std::shared_ptr<const void> keep;
  };

  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (read_done_ && !writing_ && !finished_) {
      finished_ = true;
      Finish(status_);
    }
  }

  absl::Status ParseMetadata(grpc::CallbackServerContext* ctx) {
    slot_.emplace(service_->limiter_, ctx->peer());
    if (!slot_->status().ok()) return slot_->status();
    const ReceivedLinkMetadata md = ParseLinkMetadata(ctx->client_metadata());
    if (md.job_id != service_->job_id_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parameter server of job '", service_->job_id_,
          "' reached by a worker of job '", md.job_id, "'"));
    }
    if (!md.rank.has_value() || !md.world_size.has_value() ||
        *md.world_size < 1 || *md.world_size > 4096 || *md.rank < 0 ||
        *md.rank >= *md.world_size) {
      return absl::InvalidArgumentError(
          "parameter server stream without a valid halka-rank and "
          "halka-world-size");
    }
    rank_ = *md.rank;
    world_ = *md.world_size;
    return absl::OkStatus();
  }

  ParameterServerService* const service_;
  // This stream's place under the service's limit; freed with the reactor.
  std::optional<StreamLimiter::Scoped> slot_;
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
    : job_id_(std::move(job_id)), state_(shard, shards) {}

ParameterServerService::~ParameterServerService() = default;

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ParameterServerService::Reduce(grpc::CallbackServerContext* context) {
  return new Stream(this, context);
}

PsStats ParameterServerService::stats() const {
  absl::MutexLock lock(&mu_);
  return state_.stats();
}

void ParameterServerService::Dispatch(const std::vector<PsSend>& sends) {
  for (const PsSend& send : sends) {
    grpc::ByteBuffer frame =
        send.payload ? EncodeFrame(send.meta, *send.payload)
                     : EncodeFrame(send.meta, {});
    for (int rank : send.to) {
      auto it = streams_.find(rank);
      if (it != streams_.end()) it->second->Enqueue(frame, send.payload);
    }
  }
}

void ParameterServerService::OnStreamClosed(int rank, Stream* stream) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(rank);
  if (it == streams_.end() || it->second != stream) return;  // replaced
  streams_.erase(it);
  Dispatch(state_.StreamClosed(rank));
}

void ParameterServerService::OnFrame(int rank, int world, InFrame frame) {
  absl::MutexLock lock(&mu_);
  Dispatch(state_.OnFrame(rank, world, std::move(frame)));
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
