#include "client/shm_session.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_util.h"

namespace halka {
namespace {

// A request is a RunRequest: a name, a spec, at most a device handle. The
// worker refuses larger ones (worker/worker_service.cc).
constexpr size_t kMaxRequestBytes = size_t{8} << 10;

absl::Status Prefixed(const absl::Status& s, absl::string_view what) {
  return absl::Status(s.code(), absl::StrCat(what, s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmSession>> ShmSession::Open(
    v1::Worker::Stub& stub, absl::Duration timeout, absl::Duration spin) {
  std::unique_ptr<ShmSession> s(new ShmSession());
  absl::StatusOr<std::shared_ptr<ShmRing>> requests =
      ShmRing::Create(kSessionRingBytes);
  if (!requests.ok()) return requests.status();
  absl::StatusOr<std::shared_ptr<ShmRing>> replies =
      ShmRing::Create(kSessionRingBytes);
  if (!replies.ok()) return replies.status();
  s->requests_ = std::move(*requests);
  s->replies_ = std::move(*replies);
  s->replies_->set_spin_before_sleep(spin);  // this client reads it
  v1::SessionOffer offer;
  offer.set_requests(FormatShmOffer(*s->requests_));
  offer.set_replies(FormatShmOffer(*s->replies_));
  // No deadline on the stream (it lasts as long as the session); the
  // answer is awaited below for `timeout`, and a worker that is not up yet
  // fails the call at once (the caller then uses Run, which waits).
  s->ctx_.set_wait_for_ready(false);
  s->stream_ = stub.Session(&s->ctx_, offer);
  ShmSession* raw = s.get();
  s->reader_ = std::thread([raw] { raw->ReadLoop(); });
  bool opened = false;
  absl::Status end;
  {
    absl::MutexLock lock(&s->mu_);
    auto answered = [raw]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(raw->mu_) {
      return raw->opened_ || raw->ended_;
    };
    s->mu_.AwaitWithTimeout(absl::Condition(&answered), timeout);
    opened = s->opened_;
    end = s->ended_ ? s->end_
                    : absl::DeadlineExceededError(absl::StrCat(
                          "no answer within ", absl::FormatDuration(timeout)));
  }
  if (!opened) return Prefixed(end, "session: ");  // ~ShmSession joins
  // Both ends have them mapped: the names are no longer needed.
  s->requests_->Unlink();
  s->replies_->Unlink();
  return s;
}

ShmSession::~ShmSession() {
  if (requests_) requests_->Close();  // the worker's thread ends at once
  if (replies_) replies_->Close();
  ctx_.TryCancel();
  if (reader_.joinable()) reader_.join();
}

void ShmSession::ReadLoop() {
  v1::SessionEvent event;
  const bool opened = stream_->Read(&event) && event.open();
  if (opened) {
    absl::MutexLock lock(&mu_);
    opened_ = true;
  }
  // The worker writes nothing more: Read returns when the stream ends.
  if (opened) {
    while (stream_->Read(&event)) {
    }
  }
  const absl::Status status = FromGrpcStatus(stream_->Finish());
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    end_ = !status.ok() ? status
           : opened     ? absl::UnavailableError("the worker ended it")
                        : absl::InternalError("the worker did not open it");
  }
  requests_->Close();
  replies_->Close();  // wakes a call waiting for its answer
}

absl::Status ShmSession::EndStatus() {
  absl::MutexLock lock(&mu_);
  // The rings close before the stream's end is known when the worker
  // closed them (it stops) or the client did; wait a little for the why.
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_; };
  mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(1));
  return ended_ ? end_ : absl::UnavailableError("the rings were closed");
}

absl::StatusOr<v1::RunReply> ShmSession::Run(const v1::RunRequest& req,
                                             absl::Time deadline,
                                             bool* sent) {
  *sent = false;
  if (broken_) return absl::UnavailableError("session: over");
  v1::SessionCall call;
  call.set_seq(seq_ + 1);
  *call.mutable_run() = req;
  const std::string bytes = call.SerializeAsString();
  if (bytes.size() > kMaxRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session: a request of ", bytes.size(), " bytes"));
  }
  if (replies_->closed() || requests_->closed() ||
      !requests_->TryWrite(bytes)) {
    // Closed, or the worker still holds an earlier request: not ours to
    // wait behind.
    broken_ = true;
    return absl::UnavailableError("session: the requests ring is not free");
  }
  *sent = true;
  ++seq_;
  for (;;) {
    const absl::Duration left = deadline - halka::Now();
    absl::StatusOr<std::optional<ShmRing::Record>> rec =
        replies_->Next(std::max(left, absl::ZeroDuration()));
    if (!rec.ok()) {
      broken_ = true;
      return Prefixed(rec.status(), "session: ");
    }
    if (!rec->has_value()) {
      if (replies_->closed()) {
        broken_ = true;
        return Prefixed(EndStatus(),
                        "session with the worker ended before it answered: ");
      }
      if (left <= absl::ZeroDuration()) {
        broken_ = true;
        return absl::DeadlineExceededError(
            "session: the worker did not answer by the call's deadline");
      }
      continue;
    }
    const ShmRing::Record& r = **rec;
    v1::SessionResult result;
    const bool parsed =
        r.flags == (ShmRing::kFirst | ShmRing::kLast) &&
        result.ParseFromArray(r.data, static_cast<int>(r.bytes));
    replies_->Release(r.id);
    if (!parsed || result.seq() != seq_) {
      broken_ = true;
      return absl::DataLossError(absl::StrCat(
          "session: a corrupt reply (", r.bytes, " bytes, answer to ",
          parsed ? absl::StrCat(result.seq()) : std::string("?"),
          ", expected ", seq_, ")"));
    }
    if (result.code() != 0) {
      return FromGrpcStatus(
          grpc::Status(static_cast<grpc::StatusCode>(result.code()),
                       result.message()));
    }
    return std::move(*result.mutable_reply());
  }
}

std::optional<absl::StatusOr<v1::RunReply>> SessionSlot::TryRun(
    grpc::Channel& channel, v1::Worker::Stub& stub, const v1::RunRequest& req,
    absl::Time deadline, bool* ended) {
  if (ended != nullptr) *ended = false;
  // Another thread's call holds the session: this one takes a call of its
  // own rather than queue behind it.
  if (!mu_.TryLock()) return std::nullopt;
  struct Unlock {
    absl::Mutex& mu;
    ~Unlock() { mu.Unlock(); }
  } unlock{mu_};
  mu_.AssertHeld();
  if (session_ == nullptr) {
    if (halka::Now() < retry_at_) return std::nullopt;
    // Opening starts a call without a deadline (the session's): connect
    // first, within the time this call allows.
    const absl::Time open_by = std::min(halka::Now() + kOpenTimeout, deadline);
    if (!channel.WaitForConnected(absl::ToChronoTime(open_by))) {
      retry_at_ = halka::Now() + kRetryAfter;
      return std::nullopt;
    }
    absl::StatusOr<std::unique_ptr<ShmSession>> opened =
        ShmSession::Open(stub, open_by - halka::Now(), spin_);
    if (!opened.ok()) {
      // A worker without sessions, or one that cannot map our rings, will
      // not change its mind; one that was busy or not up yet may.
      const absl::StatusCode c = opened.status().code();
      const bool final = c == absl::StatusCode::kUnimplemented ||
                         c == absl::StatusCode::kFailedPrecondition ||
                         c == absl::StatusCode::kNotFound ||
                         c == absl::StatusCode::kPermissionDenied ||
                         c == absl::StatusCode::kInvalidArgument;
      retry_at_ = final ? absl::InfiniteFuture() : halka::Now() + kRetryAfter;
      return std::nullopt;
    }
    session_ = std::move(*opened);
  }
  bool sent = false;
  absl::StatusOr<v1::RunReply> reply = session_->Run(req, deadline, &sent);
  const bool over = !session_->usable();
  if (over) session_.reset();  // the next call opens another
  if (!sent) {
    if (ended != nullptr) *ended = over;
    return std::nullopt;
  }
  return reply;
}

}  // namespace halka
