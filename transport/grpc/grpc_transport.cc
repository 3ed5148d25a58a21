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
#include "seal/wire_seal.h"  // WipeKey
#include "transport/link_path.h"
#include "transport/path_offer.h"

namespace halka {

inline constexpr char kLinkMethod[] = "/halka.v1.Peer/Link";
inline constexpr char kPsMethod[] = "/halka.v1.ParameterServer/Reduce";

// A message of a link that agreed to batches takes the frames queued
// behind its first while it holds under kBatchJoinBytes (a fingerprint, a
// small frame), at most kMaxBatchFrames: a 1 MiB chunk leaves alone, as
// its peer reduces each message only once the whole of it came.
inline constexpr size_t kBatchJoinBytes = 64 << 10;
inline constexpr size_t kMaxBatchFrames = 64;
static_assert(kMaxBatchFrames <= kMaxFramesPerMessage);

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
    if (to_ < world) {
      // Batches of frames in one message, if the peer reads them (its
      // answer: OnReadInitialMetadataDone).
      ctx_.AddMetadata(kFrameBatchesKey, kFrameBatchesVersion);
      // Offer the faster paths (transport/path_offer.h); frames wait for
      // the answer.
      absl::MutexLock lock(&mu_);
      offers_ = MakePathOffers(owner_->setup_, to_,
                               owner_->addresses_[static_cast<size_t>(to_)]);
      for (const auto& offer : offers_) {
        std::string value = offer->value();
        ctx_.AddMetadata(offer->offer_key(), value);
        WipeKey(&value);  // gRPC's own copy goes with the call
      }
      if (!offers_.empty()) path_ = Path::kOffered;
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
        if (path_ == Path::kGrpc) WriteNextOnStream();
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
  void Withdraw(const OpId& op) {
    std::shared_ptr<LinkPath> path;
    std::deque<Pending> dropped;
    {
      absl::MutexLock lock(&mu_);
      path = taken_;
      // The front, being written, stays where it is (gRPC has its buffer);
      // the rest is taken off the back and filtered.
      const size_t in_flight = writing_ ? in_flight_ : 0;
      std::deque<Pending> rest;
      while (queue_.size() > in_flight) {
        rest.push_front(std::move(queue_.back()));
        queue_.pop_back();
      }
      for (Pending& p : rest) {
        if (p.frame.DataOf(op)) {
          dropped.push_back(std::move(p));
        } else {
          queue_.push_back(std::move(p));
        }
      }
    }
    for (Pending& p : dropped) p.Release();
    if (path) path->Withdraw(op);
  }

  // The transport's writes are no longer held: start the next.
  void Flush() {
    absl::MutexLock lock(&mu_);
    if (path_ == Path::kGrpc) WriteNextOnStream();
  }

  // The peer's answers to the offers (or the stream's end): the first
  // offer (fastest first) whose answer takes it is the link's path.
  void OnReadInitialMetadataDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (ok) {
      const auto& md = ctx_.GetServerInitialMetadata();
      auto it = md.find(kFrameBatchesKey);
      batches_ = it != md.end() && it->second == kFrameBatchesVersion;
    }
    if (path_ != Path::kOffered) return;
    std::vector<std::string> answers;
    std::vector<bool> usable;
    for (const auto& offer : offers_) {
      answers.emplace_back();
      if (ok) {
        const auto& md = ctx_.GetServerInitialMetadata();
        auto it = md.find(offer->answer_key());
        if (it != md.end()) {
          answers.back().assign(it->second.data(), it->second.size());
        }
      }
      usable.push_back(ok && offer->Accepts(answers.back()));
    }
    const int chosen = ChoosePath(usable);
    const size_t refused = chosen < 0 ? offers_.size()
                                      : static_cast<size_t>(chosen);
    for (size_t i = 0; ok && i < refused; ++i) offers_[i]->Refused();
    if (chosen >= 0 && OpenPath(static_cast<size_t>(chosen),
                                answers[static_cast<size_t>(chosen)])) {
      // Taken, or opening (its frames wait for OnPathReady).
    } else {
      path_ = Path::kGrpc;
      if (!ok) failed_ = true;  // the stream is ending: OnDone releases
      if (ok) WriteNextOnStream();
    }
    // Both ends hold what they need now (or it is not used): an offer's
    // leftovers (a ring's name) go.
    for (const auto& offer : offers_) offer->Settled();
  }

  // No answer to the offers in 5 s: the frames take the gRPC stream.
  void OnAnswerLate() {
    absl::MutexLock lock(&mu_);
    if (done_ || path_ != Path::kOffered) return;
    path_ = Path::kGrpc;
    for (const auto& offer : offers_) offer->Settled();
    WriteNextOnStream();
  }

  // The chosen path opened (its frames go there from now on), or could
  // not be (they take the gRPC stream). On the path's thread.
  void OnPathReady(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (path_ != Path::kOpening || opening_ == nullptr) return;
    offers_[chosen_]->OnReady(status);
    if (status.ok()) {
      path_ = Path::kTaken;
      TakePath(std::move(opening_));
      return;
    }
    // opening_ stays until OnDone closes it: this runs on its thread.
    path_ = Path::kGrpc;
    WriteNextOnStream();
  }

  // The taken path broke: the link's failure, as a broken stream's.
  void OnPathFailed(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_ || done_ || reported_) return;
      reported_ = true;
      failed_ = true;
    }
    owner_->inbox_->LinkFailed(to_, status);
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
      for (size_t i = 0; i < in_flight_; ++i) {
        finished.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      in_flight_ = 0;
      batch_.Clear();
      writing_ = false;
      if (!ok) {
        failed_ = true;
        while (!queue_.empty()) {
          finished.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      } else {
        WriteNextOnStream();
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
    std::shared_ptr<LinkPath> opening;
    std::vector<std::unique_ptr<PathOffer>> offers;
    bool report;
    {
      absl::MutexLock lock(&mu_);
      dropped.swap(queue_);
      report = !cancelled_ && !reported_;
      reported_ = true;
      taken = std::move(taken_);
      opening = std::move(opening_);
      offers.swap(offers_);
    }
    for (Pending& p : dropped) p.Release();
    // Releases what it still holds; a path with a thread waits for it (and
    // its callbacks), also while it is still opening (not yet taken).
    if (taken) taken->Close();
    if (opening) opening->Close();
    offers.clear();  // after the paths' callbacks, which use them
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
  // Opens offers_[i], the chosen one: false if it cannot (the frames take
  // the stream).
  bool OpenPath(size_t i, const std::string& answer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    PathOffer::Events events;
    events.ready = [this](const absl::Status& s) { OnPathReady(s); };
    events.failed = [this](const absl::Status& s) { OnPathFailed(s); };
    absl::StatusOr<PathOffer::Opened> opened =
        offers_[i]->Open(answer, std::move(events));
    if (!opened.ok()) {
      offers_[i]->OnReady(opened.status());
      return false;
    }
    chosen_ = i;
    if (!opened->ready_now) {
      path_ = Path::kOpening;
      opening_ = std::move(opened->path);
      return true;
    }
    offers_[i]->OnReady(absl::OkStatus());
    path_ = Path::kTaken;
    TakePath(std::move(opened->path));
    return true;
  }
  // The gRPC stream carries the frames: start writing the first one
  // queued, unless the transport holds its writes (HoldWrites: Flush
  // starts it). Where the peer agreed to batches, the frames queued behind
  // a small first one go in the same message.
  void WriteNextOnStream() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (failed_ || closing_ || queue_.empty() || writing_ ||
        owner_->holding()) {
      return;
    }
    writing_ = true;
    size_t n = 1;
    size_t bytes = queue_.front().frame.Bytes();
    while (batches_ && n < queue_.size() && n < kMaxBatchFrames &&
           bytes < kBatchJoinBytes) {
      bytes += queue_[n].frame.Bytes();
      ++n;
    }
    in_flight_ = n;
    if (n == 1) {
      StartWrite(&queue_.front().bytes);
      return;
    }
    std::vector<grpc::Slice> slices;
    for (size_t i = 0; i < n; ++i) AppendSlices(queue_[i].frame, &slices);
    batch_ = grpc::ByteBuffer(slices.data(), slices.size());
    owner_->setup_.counters->grpc_frames_batched.fetch_add(
        n - 1, std::memory_order_relaxed);
    StartWrite(&batch_);
  }
  // Where this link's frames go. kOffered: paths were offered and frames
  // wait in queue_ for the answer; kOpening: the chosen path is opening
  // (opening_) and they wait for it; kTaken: taken_ carries them.
  enum class Path { kGrpc, kOffered, kOpening, kTaken };
  GrpcTransport* const owner_;
  const int to_;
  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer response_;
  grpc::Alarm answer_alarm_;  // OnAnswerLate
  absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // The frames at queue_'s front that the write in flight carries (one,
  // or a batch in batch_).
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ByteBuffer batch_ ABSL_GUARDED_BY(mu_);
  // The peer reads several frames in one message (kFrameBatchesKey).
  bool batches_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // the hold is released
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool reported_ ABSL_GUARDED_BY(mu_) = false;  // the failure, once
  std::shared_ptr<OutLink> self_ ABSL_GUARDED_BY(mu_);
  Path path_ ABSL_GUARDED_BY(mu_) = Path::kGrpc;
  // What this link offered, fastest first; kept until OnDone (an opening
  // path reports to its offer).
  std::vector<std::unique_ptr<PathOffer>> offers_ ABSL_GUARDED_BY(mu_);
  size_t chosen_ ABSL_GUARDED_BY(mu_) = 0;  // kOpening, kTaken: its offer
  // The chosen path while it opens; kept (closed in OnDone) if it fails.
  std::shared_ptr<LinkPath> opening_ ABSL_GUARDED_BY(mu_);
  // The path the frames take (kTaken); null: the gRPC stream's queue_.
  std::shared_ptr<LinkPath> taken_ ABSL_GUARDED_BY(mu_);
};

GrpcTransport::GrpcTransport(std::string job_id, uint64_t generation, int rank,
                             std::vector<std::string> addresses, Inbox* inbox,
                             LinkSetup links)
    : job_id_(std::move(job_id)),
      generation_(generation),
      rank_(rank),
      addresses_(std::move(addresses)),
      inbox_(inbox),
      setup_(CompletedLinkSetup(std::move(links))) {
  // An outbound link's OnDone may drop the last reference to its channel
  // after this transport is gone: never the process's last reference to
  // gRPC's callback queue (common/grpc_util.h).
  KeepGrpcForTheProcess();
}

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

void GrpcTransport::Withdraw(const OpId& op) {
  std::vector<std::shared_ptr<OutLink>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [rank, link] : links_) all.push_back(link);
  }
  for (auto& link : all) link->Withdraw(op);
}

void GrpcTransport::HoldWrites() { holds_.fetch_add(1); }

void GrpcTransport::ReleaseWrites() {
  if (holds_.fetch_sub(1) != 1) return;
  std::vector<std::shared_ptr<OutLink>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [rank, link] : links_) all.push_back(link);
    for (auto& link : retired_) all.push_back(link);
  }
  for (auto& link : all) link->Flush();
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
