#include "transport/grpc/peer_service.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "codec/frame_codec.h"
#include "codec/link_metadata.h"
#include "transport/link_path.h"
#include "transport/shm/shm_link.h"
#include "transport/tcp/wire_link.h"

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
    absl::StatusOr<InFrame> frame = DecodeFrame(buffer_);
    buffer_.Clear();
    absl::Status s = Take(std::move(frame));
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
  // not disturbed.
  void OnCancel() override {
    if (inbox_ == nullptr || from_ < 0) return;
    inbox_->LinkFailed(
        from_, absl::UnavailableError(absl::StrCat(
                   "the link from rank ", from_,
                   " ended: its gRPC stream was cancelled or its "
                   "connection closed")));
  }

  void OnDone() override {
    if (shm_) {
      shm_->Stop();  // delivers what was written, then joins
      inbox_->RemoveTap(shm_->tap().get());
    }
    // After Forget, the listener never hands this link a connection.
    if (!wire_token_.empty()) service_->options_.wire->Forget(wire_token_);
    if (wire_) wire_->Stop();
    {
      absl::MutexLock lock(&service_->mu_);
      --service_->open_streams_;
    }
    delete this;
  }

 private:
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

  // Maps a same-host peer's ring if it offered one, else takes its wire
  // offer if it made one, and says so in the initial metadata.
  void AnswerOffers(grpc::CallbackServerContext* ctx) {
    const auto& md = ctx->client_metadata();
    auto it = md.find(kLinkShmOfferKey);
    bool answered = false;
    if (it != md.end()) {
      ctx->AddInitialMetadata(
          kLinkShmAnswerKey,
          HeaderValue(AnswerShmOffer(
              std::string(it->second.data(), it->second.size()))));
      answered = true;
    }
    // The wire is answered only where it would be chosen (transport/link_path.h):
    // a link that took shared memory does not hold a wire token too.
    it = md.find(kLinkWireOfferKey);
    if (it != md.end() &&
        ChoosePath(shm_ != nullptr, /*wire_usable=*/true) == PathKind::kWire) {
      ctx->AddInitialMetadata(
          kLinkWireAnswerKey,
          HeaderValue(AnswerWireOffer(
              std::string(it->second.data(), it->second.size()))));
      answered = true;
    }
    if (answered) StartSendInitialMetadata();
  }

  // A header value: printable ASCII.
  static std::string HeaderValue(std::string s) {
    for (char& c : s) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    return s;
  }

  // Frames from another path than the stream (a ring, a wire connection)
  // are checked and delivered as the stream's are.
  absl::Status TakeFromPath(absl::StatusOr<InFrame> f) {
    absl::Status s = Take(std::move(f));
    if (!s.ok()) FinishOnce(ToGrpcStatus(s));
    return s;
  }
  // The path itself is corrupt (or, for a wire, cut inside a record).
  void PathFailed(const absl::Status& s) {
    absl::Status e(s.code(), absl::StrCat("from rank ", from_, ": ",
                                          s.message()));
    inbox_->LinkFailed(from_, e);
    FinishOnce(ToGrpcStatus(e));
  }

  std::string AnswerShmOffer(const std::string& offer) {
    if (!service_->options_.accept_shm) {
      return "no: this worker takes no shared-memory links";
    }
    absl::StatusOr<std::shared_ptr<ShmRing>> ring = AcceptShmOffer(offer);
    if (!ring.ok()) return absl::StrCat("no: ", ring.status().message());
    (*ring)->set_spin_before_sleep(service_->options_.shm_spin);
    shm_ = std::make_unique<ShmReceiver>(
        *std::move(ring),
        [this](absl::StatusOr<InFrame> f) { return Take(std::move(f)); },
        [this](const absl::Status& s) { FinishOnce(ToGrpcStatus(s)); },
        [this](const absl::Status& s) { PathFailed(s); });
    // The operation's thread takes this ring's frames itself while it
    // waits (one wake-up per record instead of two, none for a record that
    // is already there).
    inbox_->AddTap(shm_->tap());
    return "ok";
  }

  std::string AnswerWireOffer(std::string offer_hex) {
    // The offer carries the key in hex: both are wiped (WipedKey) when they
    // go, the key's copy in the listener's callback too.
    const WipedKey offer(std::move(offer_hex));
    WireListener* wire = service_->options_.wire;
    if (wire == nullptr) return "no: this worker takes no wire links";
    absl::StatusOr<std::string> parsed = ParseWireOffer(offer.str());
    if (!parsed.ok()) return absl::StrCat("no: ", parsed.status().message());
    const WipedKey key(*std::move(parsed));
    if (key.empty() && service_->options_.wire_sealed) {
      return "no: this worker serves TLS: a wire link must be sealed";
    }
    wire_token_ = wire->Expect([this, key](int fd) {
      // On the listener's thread, before Forget (OnDone) can return.
      wire_ = std::make_unique<WireReceiver>(
          fd, key.str(),
          [this](absl::StatusOr<InFrame> f) {
            return TakeFromPath(std::move(f));
          },
          [this](const absl::Status& s) {
            PathFailed(absl::Status(
                s.code(), absl::StrCat("wire link: ", s.message())));
          },
          // All-gather and broadcast chunks land in the operation's buffer.
          service_->options_.wire_landing ? inbox_->landings() : nullptr,
          from_, service_->options_.counters);
    });
    if (wire_token_.empty()) return "no: the wire listener is stopped";
    return FormatWireAnswer(wire->port(), wire_token_);
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
  int from_ = -1;
  uint64_t generation_ = 0;
  std::shared_ptr<Inbox> inbox_;
  std::unique_ptr<ShmReceiver> shm_;  // a same-host peer's frames
  std::string wire_token_;  // handed to the listener; "" if none
  std::unique_ptr<WireReceiver> wire_;  // set once, by the listener
  absl::Mutex finish_mu_;
  bool finished_ ABSL_GUARDED_BY(finish_mu_) = false;
};

PeerService::PeerService(std::string job_id, InboxResolver resolver,
                         Options options)
    : job_id_(std::move(job_id)),
      resolver_(std::move(resolver)),
      options_(std::move(options)) {}

int PeerService::open_streams() const {
  absl::MutexLock lock(&mu_);
  return open_streams_;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PeerService::Link(
    grpc::CallbackServerContext* context) {
  return new InLink(this, context);
}

}  // namespace halka
