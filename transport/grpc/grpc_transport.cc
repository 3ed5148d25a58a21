#include "transport/grpc/grpc_transport.h"

#include <chrono>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "grpcpp/alarm.h"
#include "grpcpp/generic/generic_stub.h"
#include "codec/frame_codec.h"
#include "codec/link_metadata.h"
#include "common/security.h"
#include "transport/link_path.h"
#include "transport/shm/shm_link.h"
#include "transport/tcp/wire_link.h"

namespace halka {

inline constexpr char kLinkMethod[] = "/halka.v1.Peer/Link";
inline constexpr char kPsMethod[] = "/halka.v1.ParameterServer/Reduce";

// One outbound stream. Owned by the transport through a shared_ptr; holds a
// reference to itself from StartCall until OnDone, the reactor's last
// callback, so gRPC never calls into a destroyed object.
class GrpcTransport::OutLink
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public std::enable_shared_from_this<OutLink> {
 public:
  OutLink(GrpcTransport* owner, int to, std::shared_ptr<grpc::Channel> channel)
      : owner_(owner), to_(to), stub_(std::move(channel)) {}

  void Start() {
    const int world = static_cast<int>(owner_->addresses_.size());
    AddLinkMetadata(LinkMetadata{owner_->job_id_, owner_->generation_,
                                 owner_->rank_, world},
                    &ctx_);
    const size_t ring_bytes =
        owner_->setup_.shm_ring_bytes && to_ < world
            ? owner_->setup_.shm_ring_bytes(to_)
            : 0;
    if (ring_bytes > 0 &&
        PeerMayShareHost(owner_->addresses_[static_cast<size_t>(to_)])) {
      // Offer a same-host data path; frames wait for the answer.
      absl::StatusOr<std::shared_ptr<ShmRing>> ring =
          ShmRing::Create(ring_bytes);
      if (ring.ok()) {
        ctx_.AddMetadata(kLinkShmOfferKey, FormatShmOffer(**ring));
        absl::MutexLock lock(&mu_);
        ring_ = *std::move(ring);
        path_ = Path::kOffered;
      }
    }
    if (owner_->setup_.wire_links && to_ < world &&
        !owner_->setup_.wire_fallbacks->RecentlyFailed(
            owner_->addresses_[static_cast<size_t>(to_)])) {
      // Offer the wire too (a same-host offer, if taken, comes first); the
      // key travels inside TLS, and only on a TLS channel.
      absl::StatusOr<std::string> key = std::string();
      if (owner_->setup_.security.client_tls()) key = WireSeal::NewKey();
      if (key.ok()) {
        std::string offer = FormatWireOffer(*key);  // the key in hex
        ctx_.AddMetadata(kLinkWireOfferKey, offer);
        WipeKey(&offer);  // gRPC's own copy goes with the call
        absl::MutexLock lock(&mu_);
        wire_key_ = WipedKey(*std::move(key));
        wire_offered_ = true;
        path_ = Path::kOffered;
      }
    }
    self_ = shared_from_this();
    bool offered;
    {
      absl::MutexLock lock(&mu_);
      offered = path_ == Path::kOffered;
    }
    if (offered) {
      // A peer too old to know the offers answers nothing until its stream
      // ends: the frames must not wait for it.
      answer_alarm_.Set(
          std::chrono::system_clock::now() + std::chrono::seconds(5),
          [weak = weak_from_this()](bool fired) {
            if (auto self = weak.lock(); self != nullptr && fired) {
              self->OnAnswerLate();
            }
          });
    }
    stub_.PrepareBidiStreamingCall(&ctx_, to_ < world ? kLinkMethod : kPsMethod,
                                   grpc::StubOptions(), this);
    // Writes start from outside reactions (Enqueue): hold the stream open
    // until no more can start, or gRPC may destroy it under a StartWrite.
    AddHold();
    StartRead(&response_);
    StartCall();
  }

  // False when the stream is finished: the frame was not taken, and the
  // caller reconnects or releases it.
  bool Enqueue(const OutFrame& frame, std::function<void()>* on_released) {
    std::shared_ptr<LinkPath> path;
    OutFrame taken = frame;
    {
      absl::MutexLock lock(&mu_);
      if (done_ || failed_ || closing_) return false;
      taken.on_released = std::move(*on_released);
      if (taken_ == nullptr) {  // the gRPC stream, or still choosing
        grpc::ByteBuffer bytes = AsByteBuffer(taken);
        queue_.push_back(Pending{std::move(taken), std::move(bytes)});
        if (path_ == Path::kGrpc && !writing_) {
          writing_ = true;
          StartWrite(&queue_.front().bytes);
        }
        return true;
      }
      path = taken_;
    }
    // Ordered behind earlier frames by the path's own lock.
    path->SendOne(std::move(taken));
    return true;
  }

  // The operation failed: its data frames leave the queue (the one gRPC
  // is writing stays: gRPC holds it), or the path withdraws them.
  void Withdraw(uint64_t op_seq) {
    std::shared_ptr<LinkPath> path;
    std::deque<Pending> dropped;
    {
      absl::MutexLock lock(&mu_);
      path = taken_;
      // The front, being written, stays where it is (gRPC has its buffer);
      // the rest is taken off the back and filtered.
      const size_t in_flight = writing_ && !queue_.empty() ? 1 : 0;
      std::deque<Pending> rest;
      while (queue_.size() > in_flight) {
        rest.push_front(std::move(queue_.back()));
        queue_.pop_back();
      }
      for (Pending& p : rest) {
        if (p.frame.data && p.frame.op_seq == op_seq) {
          dropped.push_back(std::move(p));
        } else {
          queue_.push_back(std::move(p));
        }
      }
    }
    for (Pending& p : dropped) p.Release();
    if (path) path->Withdraw(op_seq);
  }

  // The peer's answers to the offers (or the stream's end).
  void OnReadInitialMetadataDone(bool ok) override {
    std::shared_ptr<ShmRing> ring;
    {
      absl::MutexLock lock(&mu_);
      if (path_ != Path::kOffered) return;
      ring = std::move(ring_);
      std::string answer;
      std::string wire_answer;
      if (ok) {
        const auto& md = ctx_.GetServerInitialMetadata();
        auto it = md.find(kLinkShmAnswerKey);
        if (it != md.end()) answer.assign(it->second.data(), it->second.size());
        it = md.find(kLinkWireAnswerKey);
        if (it != md.end()) {
          wire_answer.assign(it->second.data(), it->second.size());
        }
      }
      int port = 0;
      std::string token;
      const PathKind chosen = ChoosePath(
          ok && ring != nullptr && answer == "ok",
          ok && wire_offered_ && ParseWireAnswer(wire_answer, &port, &token));
      if (chosen == PathKind::kShm) {
        counts().shm.accepted.fetch_add(1);
        path_ = Path::kShm;
        TakePath(std::make_shared<ShmSender>(ring));
      } else if (chosen == PathKind::kWire) {
        // Frames keep waiting until the connection is up (OnWireReady).
        if (ring != nullptr) counts().shm.refused.fetch_add(1);
        wire_ = std::make_shared<WireSender>(
            HostOf(owner_->addresses_[static_cast<size_t>(to_)]), port,
            token, wire_key_.str(),
            [this](const absl::Status& s) { OnWireReady(s); },
            [this](const absl::Status& s) { OnWireFailed(s); });
      } else {
        if (ok && ring != nullptr) counts().shm.refused.fetch_add(1);
        if (ok && wire_offered_) counts().wire.refused.fetch_add(1);
        path_ = Path::kGrpc;
        if (!ok) failed_ = true;  // the stream is ending: OnDone releases
        if (ok && !queue_.empty() && !writing_) {
          writing_ = true;
          StartWrite(&queue_.front().bytes);
        }
      }
    }
    // Both ends have it mapped now (or it is not used): drop the name.
    if (ring != nullptr) ring->Unlink();
  }

  // No answer to the offers in 5 s: the frames take the gRPC stream.
  void OnAnswerLate() {
    std::shared_ptr<ShmRing> ring;
    {
      absl::MutexLock lock(&mu_);
      if (done_ || path_ != Path::kOffered || wire_ != nullptr) return;
      ring = std::move(ring_);
      path_ = Path::kGrpc;
      if (!failed_ && !closing_ && !queue_.empty() && !writing_) {
        writing_ = true;
        StartWrite(&queue_.front().bytes);
      }
    }
    if (ring != nullptr) ring->Unlink();
  }

  // The wire connection is up (its frames go there from now on), or could
  // not be made (they take the gRPC stream). On the sender's thread.
  void OnWireReady(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (path_ != Path::kOffered || wire_ == nullptr) return;
    if (status.ok()) {
      counts().wire.accepted.fetch_add(1);
      path_ = Path::kWire;
      TakePath(wire_);
      return;
    }
    counts().wire.fell_back.fetch_add(1);
    owner_->setup_.wire_fallbacks->Note(
        owner_->addresses_[static_cast<size_t>(to_)], status);
    path_ = Path::kGrpc;
    if (!failed_ && !closing_ && !queue_.empty() && !writing_) {
      writing_ = true;
      StartWrite(&queue_.front().bytes);
    }
  }

  // The wire connection broke: the link's failure, as a broken stream's.
  void OnWireFailed(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_ || done_ || reported_) return;
      reported_ = true;
      failed_ = true;
    }
    owner_->inbox_->LinkFailed(
        to_, absl::Status(status.code(),
                          absl::StrCat("wire link: ", status.message())));
    Cancel();
  }

  void Cancel() {
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      cancelled_ = true;
    }
    ctx_.TryCancel();
    ReleaseHold();
  }

  // Once: no write starts after this, and the stream may finish.
  void ReleaseHold() {
    {
      absl::MutexLock lock(&mu_);
      if (closing_) return;
      closing_ = true;
    }
    RemoveHold();
  }

  bool usable() {
    absl::MutexLock lock(&mu_);
    return !done_ && !failed_ && !closing_;
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  void WaitDone() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

  void OnWriteDone(bool ok) override {
    std::deque<Pending> finished;
    {
      absl::MutexLock lock(&mu_);
      finished.push_back(std::move(queue_.front()));
      queue_.pop_front();
      if (!ok) {
        failed_ = true;
        while (!queue_.empty()) {
          finished.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        writing_ = false;
      } else if (!queue_.empty()) {
        StartWrite(&queue_.front().bytes);
      } else {
        writing_ = false;
      }
    }
    // The written frame's payload is on the wire: hand the memory back.
    // Never call out under our lock.
    for (Pending& p : finished) p.Release();
  }

  void OnReadDone(bool ok) override {
    // Peers answer nothing but their final status; a parameter server sends
    // results (and aborts) back on the same stream.
    if (!ok) {
      ReleaseHold();  // the stream is ending
      return;
    }
    absl::StatusOr<InFrame> frame = DecodeFrame(response_);
    response_.Clear();
    if (!frame.ok()) {
      owner_->inbox_->LinkFailed(
          to_, absl::Status(frame.status().code(),
                            absl::StrCat("reply: ", frame.status().message())));
      Cancel();
      return;
    }
    absl::Status delivered = owner_->inbox_->Deliver(to_, *std::move(frame));
    if (!delivered.ok()) {
      owner_->inbox_->LinkFailed(to_, delivered);
      Cancel();
      return;
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    std::deque<Pending> dropped;
    std::shared_ptr<LinkPath> taken;
    std::shared_ptr<WireSender> wire;
    std::shared_ptr<ShmRing> ring;
    bool report;
    {
      absl::MutexLock lock(&mu_);
      dropped.swap(queue_);
      report = !cancelled_ && !reported_;
      reported_ = true;
      taken = std::move(taken_);
      wire = std::move(wire_);
      ring = std::move(ring_);
    }
    for (Pending& p : dropped) p.Release();
    // Releases what it still holds; a wire waits for its thread (and its
    // callbacks), also while it is still connecting (not yet taken).
    if (taken) taken->Close();
    if (wire) wire->Close();
    if (report) {
      // Named like the serving end's report of the same event (peer_service):
      // whichever end notices first, the error says the link ended.
      const absl::StatusCode code =
          status.ok() ? absl::StatusCode::kUnavailable
                      : static_cast<absl::StatusCode>(status.error_code());
      owner_->inbox_->LinkFailed(
          to_, absl::Status(code, absl::StrCat("the link to rank ", to_,
                                               " ended: ",
                                               status.ok()
                                                   ? "the peer closed it"
                                                   : status.error_message())));
    }
    std::shared_ptr<OutLink> self;
    answer_alarm_.Cancel();
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      self = std::move(self_);
    }
    // `self` may be the last reference: nothing touches members after this.
  }

 private:
  // A frame on the gRPC stream's queue: the frame (it keeps the bytes) and
  // the gRPC buffer over them that a write takes.
  struct Pending {
    OutFrame frame;
    grpc::ByteBuffer bytes;
    void Release() { ReleaseOnce(frame.on_released); }
  };
  // From now on the link's frames take `path`, those held first.
  void TakePath(std::shared_ptr<LinkPath> path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    taken_ = std::move(path);
    std::vector<OutFrame> held;
    for (Pending& p : queue_) {
      held.push_back(std::move(p.frame));
    }
    queue_.clear();
    taken_->Send(std::move(held));
  }
  LinkCounters& counts() const { return *owner_->setup_.counters; }
  // Where this link's frames go. kOffered: a ring was offered and frames
  // wait in queue_ for the answer.
  enum class Path { kGrpc, kOffered, kShm, kWire };
  GrpcTransport* const owner_;
  const int to_;
  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer response_;
  grpc::Alarm answer_alarm_;  // OnAnswerLate
  absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // the hold is released
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool reported_ ABSL_GUARDED_BY(mu_) = false;  // the failure, once
  std::shared_ptr<OutLink> self_ ABSL_GUARDED_BY(mu_);
  Path path_ ABSL_GUARDED_BY(mu_) = Path::kGrpc;
  std::shared_ptr<ShmRing> ring_ ABSL_GUARDED_BY(mu_);  // offered
  // The path the frames take (kShm, kWire); null: the gRPC stream's queue_.
  std::shared_ptr<LinkPath> taken_ ABSL_GUARDED_BY(mu_);
  bool wire_offered_ ABSL_GUARDED_BY(mu_) = false;
  // "" on a plaintext channel; wiped (WipeKey) when the link goes.
  WipedKey wire_key_ ABSL_GUARDED_BY(mu_);
  // From the answer on: connecting, then (kWire, as taken_) carrying them.
  std::shared_ptr<WireSender> wire_ ABSL_GUARDED_BY(mu_);
};

namespace {
// The setup with counters and fallbacks of the transport's own where the
// worker gave none.
GrpcTransport::LinkSetup Completed(GrpcTransport::LinkSetup links) {
  if (links.counters == nullptr) {
    links.counters = std::make_shared<LinkCounters>();
  }
  if (links.wire_fallbacks == nullptr) {
    links.wire_fallbacks = std::make_shared<WireFallbacks>();
  }
  return links;
}
}  // namespace

GrpcTransport::GrpcTransport(std::string job_id, uint64_t generation, int rank,
                             std::vector<std::string> addresses, Inbox* inbox,
                             LinkSetup links)
    : job_id_(std::move(job_id)),
      generation_(generation),
      rank_(rank),
      addresses_(std::move(addresses)),
      inbox_(inbox),
      setup_(Completed(std::move(links))) {}

GrpcTransport::~GrpcTransport() {
  std::vector<std::shared_ptr<OutLink>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [rank, link] : links_) all.push_back(link);
    for (auto& link : retired_) all.push_back(link);
    links_.clear();
    retired_.clear();
  }
  for (auto& link : all) link->Cancel();
  for (auto& link : all) link->WaitDone();
}

std::shared_ptr<GrpcTransport::OutLink> GrpcTransport::LinkTo(int to) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(to);
  if (it != links_.end() && it->second->usable()) return it->second;
  if (it != links_.end()) {
    retired_.push_back(std::move(it->second));
    links_.erase(it);
  }
  // Forget retired links that have finished.
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                [](const std::shared_ptr<OutLink>& l) {
                                  return l->done();
                                }),
                 retired_.end());
  auto& channel = channels_[to];
  if (!channel) {
    const int g = static_cast<int>(addresses_.size());
    channel = MakeChannel(to < g ? addresses_[static_cast<size_t>(to)]
                                 : servers_[static_cast<size_t>(to - g)],
                          setup_.security);
  }
  auto link = std::make_shared<OutLink>(this, to, channel);
  link->Start();
  links_[to] = link;
  return link;
}

absl::Status GrpcTransport::Send(int to, const FrameMeta& meta,
                                 absl::Span<const uint8_t> payload,
                                 std::function<void()> on_released) {
  std::string address;
  {
    absl::MutexLock lock(&mu_);
    const int g = static_cast<int>(addresses_.size());
    if (to >= 0 && to < g) {
      address = addresses_[static_cast<size_t>(to)];
    } else if (to >= g && to < g + static_cast<int>(servers_.size())) {
      address = servers_[static_cast<size_t>(to - g)];
    }
  }
  if (address.empty()) {
    if (on_released) on_released();
    return absl::InvalidArgumentError(absl::StrCat("send: no rank ", to));
  }
  const OutFrame frame = EncodeOutFrame(meta, payload);
  // A link that failed between operations is replaced once; a second
  // failure is the peer's real state.
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::shared_ptr<OutLink> link = LinkTo(to);
    if (link->Enqueue(frame, &on_released)) return absl::OkStatus();
  }
  if (on_released) on_released();
  return absl::UnavailableError(absl::StrCat("link to ", address, " is down"));
}

void GrpcTransport::SetServerAddresses(std::vector<std::string> addresses) {
  std::vector<std::shared_ptr<OutLink>> stale;
  {
    absl::MutexLock lock(&mu_);
    if (addresses == servers_) return;
    const int g = static_cast<int>(addresses_.size());
    for (auto it = links_.begin(); it != links_.end();) {
      if (it->first >= g) {
        stale.push_back(it->second);
        retired_.push_back(it->second);
        it = links_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = channels_.begin(); it != channels_.end();) {
      it = it->first >= g ? channels_.erase(it) : std::next(it);
    }
    servers_ = std::move(addresses);
  }
  for (auto& l : stale) l->Cancel();
}

void GrpcTransport::Withdraw(uint64_t op_seq) {
  std::vector<std::shared_ptr<OutLink>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [rank, link] : links_) all.push_back(link);
  }
  for (auto& link : all) link->Withdraw(op_seq);
}

void GrpcTransport::Reset(int to) {
  std::shared_ptr<OutLink> link;
  {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(to);
    if (it == links_.end()) return;
    link = it->second;
    retired_.push_back(link);
    links_.erase(it);
  }
  link->Cancel();
}

}  // namespace halka
