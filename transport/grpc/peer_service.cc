#include "transport/grpc/peer_service.h"

#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "codec/frame_codec.h"
#include "codec/link_metadata.h"
#include "core/status_macros.h"

namespace halka {

// One inbound stream.
class PeerService::InLink
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  InLink(PeerService* service, grpc::CallbackServerContext* ctx)
      : service_(service) {
    absl::Status s = ParseMetadata(ctx);
    if (!s.ok()) {
      FinishOnce(ToGrpcStatus(s));
      return;
    }
    AnswerOffers(ctx);
    StartRead(&buffer_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    absl::Status s = TakeMessage();
    buffer_.Clear();
    if (!s.ok()) {
      FinishOnce(ToGrpcStatus(s));
      return;
    }
    {
      absl::MutexLock lock(&finish_mu_);
      if (finished_) return;  // the ring's reader ended the stream
    }
    StartRead(&buffer_);
  }

  // The stream ended abruptly: the peer cancelled it (it dropped the link:
  // its operation failed, its ring moved on) or its connection broke (the
  // peer died, the network or a third party cut it). An operation waiting
  // for this peer's frames fails at once, naming the link, instead of at
  // its deadline; inboxes are per generation, so a ring that moved on is
  // not disturbed. Reported in OnDone, once the path has delivered what
  // the peer wrote before its end (a shared-memory ring's records, the
  // wire's bytes): a rank that finished its operation and left must not
  // fail a peer whose copy of it would still take those frames.
  void OnCancel() override { cancelled_.store(true); }

  void OnDone() override {
    // Delivers what came that way, as far as the kind can; no callback of
    // it runs after this.
    if (path_) path_->Stop();
    if (cancelled_.load() && inbox_ != nullptr && from_ >= 0) {
      inbox_->LinkFailed(
          from_, absl::UnavailableError(absl::StrCat(
                     "the link from rank ", from_,
                     " ended: its gRPC stream was cancelled or its "
                     "connection closed")));
    }
    {
      absl::MutexLock lock(&service_->mu_);
      --service_->open_streams_;
    }
    delete this;
  }

 private:
  // The frame in buffer_, or, where this link agreed to batches, every
  // frame in it, in order; the first error ends the link.
  absl::Status TakeMessage() {
    if (!batches_) return Take(DecodeFrame(buffer_));
    absl::StatusOr<std::vector<InFrame>> frames = DecodeFrames(buffer_);
    if (!frames.ok()) return Take(frames.status());
    for (InFrame& f : *frames) {
      HALKA_RETURN_IF_ERROR(Take(std::move(f)));
    }
    return absl::OkStatus();
  }

  // Checks a received frame against the link and delivers it; an error
  // (reported to the inbox) ends the link.
  absl::Status Take(absl::StatusOr<InFrame> frame) {
    if (frame.ok() && frame->meta.sender_rank != from_) {
      frame = absl::DataLossError(absl::StrCat(
          "frame claims sender rank ", frame->meta.sender_rank,
          " on the link of rank ", from_));
    }
    if (frame.ok() && frame->meta.generation != generation_) {
      frame = absl::DataLossError(absl::StrCat(
          "frame of generation ", frame->meta.generation,
          " on a link of generation ", generation_));
    }
    if (!frame.ok()) {
      absl::Status s(frame.status().code(),
                     absl::StrCat("from rank ", from_, ": ",
                                  frame.status().message()));
      inbox_->LinkFailed(from_, s);
      return s;
    }
    absl::Status delivered = inbox_->Deliver(from_, *std::move(frame));
    if (!delivered.ok()) inbox_->LinkFailed(from_, delivered);
    return delivered;
  }

  // Ends the stream once, whichever of the reactor and the ring's reader
  // gets there first.
  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&finish_mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);
  }

  // Answers the offers in the order of the kinds (fastest first): the
  // first one this worker can take it takes, and it answers none after it
  // (ChoosePath, transport/paths.h): a link holds one path.
  void AnswerOffers(grpc::CallbackServerContext* ctx) {
    const auto& md = ctx->client_metadata();
    bool answered = false;
    // This end reads batches of frames (DecodeFrames) when offered them.
    if (auto it = md.find(kFrameBatchesKey);
        service_->frame_batches_ && it != md.end() &&
        it->second == kFrameBatchesVersion) {
      ctx->AddInitialMetadata(kFrameBatchesKey, kFrameBatchesVersion);
      batches_ = true;
      answered = true;
    }
    for (const auto& acceptor : service_->acceptors_) {
      auto it = md.find(acceptor->offer_key());
      if (it == md.end()) continue;
      PathAcceptor::Answer answer = acceptor->Accept(
          std::string(it->second.data(), it->second.size()), End());
      ctx->AddInitialMetadata(acceptor->answer_key(), HeaderValue(answer.text));
      answered = true;
      if (answer.path != nullptr) {
        path_ = std::move(answer.path);
        break;
      }
    }
    if (answered) StartSendInitialMetadata();
  }

  // What a path this link takes reports to: frames are checked and
  // delivered as the stream's are.
  InPathEnd End() {
    InPathEnd end;
    end.from = from_;
    end.inbox = inbox_;
    end.deliver = [this](absl::StatusOr<InFrame> f) {
      return Take(std::move(f));
    };
    end.rejected = [this](const absl::Status& s) {
      FinishOnce(ToGrpcStatus(s));
    };
    end.failed = [this](const absl::Status& s) { PathFailed(s); };
    return end;
  }

  // A header value: printable ASCII.
  static std::string HeaderValue(std::string s) {
    for (char& c : s) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    return s;
  }

  // The path itself is corrupt (or, for a wire, cut inside a record).
  void PathFailed(const absl::Status& s) {
    absl::Status e(s.code(), absl::StrCat("from rank ", from_, ": ",
                                          s.message()));
    inbox_->LinkFailed(from_, e);
    FinishOnce(ToGrpcStatus(e));
  }

  absl::Status ParseMetadata(grpc::CallbackServerContext* ctx) {
    {
      absl::MutexLock lock(&service_->mu_);
      ++service_->open_streams_;
    }
    slot_.emplace(service_->limiter_, ctx->peer());
    if (!slot_->status().ok()) return slot_->status();
    const ReceivedLinkMetadata md = ParseLinkMetadata(ctx->client_metadata());
    if (md.job_id != service_->job_id_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "peer link for job '", md.job_id, "' reached a worker of job '",
          service_->job_id_, "'"));
    }
    if (!md.generation.has_value()) {
      return absl::InvalidArgumentError(
          "peer link without a valid halka-generation");
    }
    generation_ = *md.generation;
    absl::StatusOr<std::shared_ptr<Inbox>> inbox =
        service_->resolver_(generation_);
    if (!inbox.ok()) return inbox.status();
    inbox_ = *std::move(inbox);
    if (!md.rank.has_value() || *md.rank < 0 ||
        *md.rank >= inbox_->max_ranks()) {
      return absl::InvalidArgumentError("peer link without a valid halka-rank");
    }
    from_ = *md.rank;
    return absl::OkStatus();
  }

  PeerService* const service_;
  // This stream's place under the service's limit; freed with the reactor.
  std::optional<StreamLimiter::Scoped> slot_;
  grpc::ByteBuffer buffer_;
  bool batches_ = false;  // the peer may send several frames per message
  int from_ = -1;
  uint64_t generation_ = 0;
  std::shared_ptr<Inbox> inbox_;
  // The path the peer's frames take besides the stream (null: none).
  std::unique_ptr<InPath> path_;
  absl::Mutex finish_mu_;
  bool finished_ ABSL_GUARDED_BY(finish_mu_) = false;
  std::atomic<bool> cancelled_{false};  // OnCancel ran; OnDone reports it
};

PeerService::PeerService(std::string job_id, InboxResolver resolver,
                         Options options)
    : job_id_(std::move(job_id)),
      resolver_(std::move(resolver)),
      acceptors_(MakePathAcceptors(options)),
      frame_batches_(options.frame_batches) {}

int PeerService::open_streams() const {
  absl::MutexLock lock(&mu_);
  return open_streams_;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PeerService::Link(
    grpc::CallbackServerContext* context) {
  return new InLink(this, context);
}

}  // namespace halka
