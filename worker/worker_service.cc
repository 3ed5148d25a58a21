#include "worker/worker_service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/op_request.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

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
  s.set_peer(r.peer);
  s.set_model_seconds(r.model_seconds);
  return s;
}

}  // namespace

grpc::Status WorkerService::Run(grpc::ServerContext*, const v1::RunRequest* req,
                                v1::RunReply* reply) {
  return RunOne(*req, reply);
}

grpc::Status WorkerService::RunOne(const v1::RunRequest& req,
                                   v1::RunReply* reply) {
  const WorkerNode::Arrival arrival = node_->Arrive();
  const v1::OpSpec& spec = req.spec();
  if (req.has_device_tensor()) {
    auto result = node_->ExecuteOnDevice(spec, req.device_tensor(), arrival);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *reply->mutable_stats() = ToStats(*result);
    return grpc::Status::OK;
  }
  absl::StatusOr<uint64_t> bytes =
      ValidateOpSpec(spec, node_->options().max_op_bytes);
  if (!bytes.ok()) return ToGrpcStatus(node_->Refuse(arrival, bytes.status(), &spec));
  if (absl::Status s = ValidateShmRegion(req, *bytes); !s.ok()) {
    return ToGrpcStatus(node_->Refuse(arrival, s, &spec));
  }
  uint8_t* data = nullptr;
  std::shared_ptr<const ShmCache::Mapping> mapping;  // held until the end
  if (*bytes > 0) {
    auto mapped =
        shm_.Map(req.shm_name(), req.shm_size(), req.shm_capability());
    if (!mapped.ok()) {
      return ToGrpcStatus(node_->Refuse(arrival, mapped.status(), &spec));
    }
    mapping = std::move(*mapped);
    data = mapping->base + req.shm_offset();
  }
  auto result = node_->Execute(spec, data, arrival);
  if (result.ok() && mapping != nullptr && mapping->broken()) {
    // The client shrank its object while the operation ran: what the
    // worker read from it (and so the result) is not the client's data.
    result = absl::DataLossError(absl::StrCat(
        "shm object ", req.shm_name(), " shrank while the operation ran "
        "(truncated by another process): the result is not valid"));
  }
  if (!result.ok()) return ToGrpcStatus(result.status());
  *reply->mutable_stats() = ToStats(*result);
  return grpc::Status::OK;
}

absl::Status WorkerService::RunInProcess(const v1::RunRequest& req,
                                         void* data, size_t bytes,
                                         v1::RunReply* reply) {
  const WorkerNode::Arrival arrival = node_->Arrive();
  const v1::OpSpec& spec = req.spec();
  if (req.has_device_tensor() || !req.shm_name().empty()) {
    return node_->Refuse(
        arrival,
        absl::InvalidArgumentError(
            "an in-process call carries its buffer, not a device tensor "
            "or a shared-memory object"),
        &spec);
  }
  absl::StatusOr<uint64_t> need =
      ValidateOpSpec(spec, node_->options().max_op_bytes);
  if (!need.ok()) return node_->Refuse(arrival, need.status(), &spec);
  if (*need > bytes || (*need > 0 && data == nullptr)) {
    return node_->Refuse(
        arrival,
        absl::InvalidArgumentError(absl::StrCat(
            "the operation needs a buffer of ", *need, " bytes; the call "
            "gave ", data == nullptr ? 0 : bytes)),
        &spec);
  }
  in_process_calls_.fetch_add(1);
  auto result = node_->Execute(spec, data, arrival);
  if (!result.ok()) return result.status();
  *reply->mutable_stats() = ToStats(*result);
  return absl::OkStatus();
}

namespace {

// How long a session's thread sleeps on its requests ring before it looks
// at the call (cancelled?) again; the client's close and StopSessions wake
// it at once.
constexpr absl::Duration kSessionPoll = absl::Milliseconds(50);
// A request is a RunRequest (a name, a spec, at most a device handle); an
// error text in a reply is cut to this many bytes.
constexpr size_t kSessionRequestMax = size_t{8} << 10;
constexpr size_t kSessionMessageMax = size_t{4} << 10;

}  // namespace

grpc::Status WorkerService::Session(grpc::ServerContext* ctx,
                                    const v1::SessionOffer* offer,
                                    grpc::ServerWriter<v1::SessionEvent>* writer) {
  auto refuse = [&](const absl::Status& s) {
    return ToGrpcStatus(absl::Status(
        s.code(), absl::StrCat("session: ", s.message())));
  };
  StreamLimiter::Scoped counted(sessions_, ctx->peer());
  if (!counted.status().ok()) return refuse(counted.status());
  absl::StatusOr<std::shared_ptr<ShmRing>> requests =
      AcceptShmOffer(offer->requests(), kSessionRingBytes);
  if (!requests.ok()) return refuse(requests.status());
  // This worker reads it: with its own --shm_spin_us.
  (*requests)->set_spin_before_sleep(node_->options().shm_spin);
  absl::StatusOr<std::shared_ptr<ShmRing>> replies =
      AcceptShmOffer(offer->replies(), kSessionRingBytes);
  if (!replies.ok()) return refuse(replies.status());
  {
    absl::MutexLock lock(&sessions_mu_);
    if (sessions_stopping_.load()) {
      return refuse(absl::UnavailableError("the worker is stopping"));
    }
    session_rings_.insert(*requests);
  }
  struct Registered {
    WorkerService& service;
    const std::shared_ptr<ShmRing>& requests;
    const std::shared_ptr<ShmRing>& replies;
    ~Registered() {
      {
        absl::MutexLock lock(&service.sessions_mu_);
        service.session_rings_.erase(requests);
      }
      requests->Close();
      replies->Close();  // wakes a client waiting for an answer
    }
  } registered{*this, *requests, *replies};
  v1::SessionEvent open;
  open.set_open(true);
  if (!writer->Write(open)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  }
  uint64_t seq = 0;
  for (;;) {
    // Looked at before every request, from this process's own state (the
    // rings' closed word is the client's to write too): a client that
    // keeps its ring busy cannot hold a stopping worker.
    if (sessions_stopping_.load()) {
      return refuse(absl::UnavailableError("the worker is stopping"));
    }
    if (ctx->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    absl::StatusOr<std::optional<ShmRing::Record>> rec =
        (*requests)->Next(kSessionPoll);
    absl::Status s = rec.status();
    if (s.ok() && rec->has_value()) {
      s = ServeSessionCall(**rec, **requests, **replies, &seq);
    }
    if (!s.ok()) {
      node_->log().Warning(absl::StrCat("session of ", ctx->peer(),
                                        " ended: ", s.ToString()));
      return refuse(s);
    }
    if (!rec->has_value() && (*requests)->closed() &&
        !sessions_stopping_.load()) {
      return grpc::Status::OK;  // the client ended it
    }
  }
}

absl::Status WorkerService::ServeSessionCall(const ShmRing::Record& rec,
                                             ShmRing& requests,
                                             ShmRing& replies, uint64_t* seq) {
  v1::SessionCall call;
  const bool whole = rec.flags == (ShmRing::kFirst | ShmRing::kLast) &&
                     rec.bytes <= kSessionRequestMax;
  const bool parsed =
      whole && call.ParseFromArray(rec.data, static_cast<int>(rec.bytes));
  requests.Release(rec.id);
  if (!whole) {
    return absl::DataLossError(absl::StrCat(
        "a request of ", rec.frame_bytes, " bytes (at most ",
        kSessionRequestMax, " in one record)"));
  }
  if (!parsed) return absl::DataLossError("a request that does not parse");
  if (call.seq() != *seq + 1) {
    return absl::DataLossError(absl::StrCat("request ", call.seq(),
                                            " after request ", *seq));
  }
  *seq = call.seq();
  session_calls_.fetch_add(1);
  v1::SessionResult result;
  result.set_seq(call.seq());
  const grpc::Status s = RunOne(call.run(), result.mutable_reply());
  result.set_code(static_cast<int>(s.error_code()));
  result.set_message(s.error_message().substr(0, kSessionMessageMax));
  if (!replies.TryWrite(result.SerializeAsString())) {
    return absl::DataLossError(
        "no room for the reply: the client left earlier replies unread");
  }
  return absl::OkStatus();
}

void WorkerService::StopSessions() {
  absl::MutexLock lock(&sessions_mu_);
  sessions_stopping_.store(true);
  for (const std::shared_ptr<ShmRing>& r : session_rings_) r->Close();
}

InlineBudget::Charge::~Charge() {
  if (bytes_ > 0) budget_.in_use_.fetch_sub(bytes_);
}

absl::Status InlineBudget::Charge::Add(uint64_t bytes) {
  const uint64_t before = budget_.in_use_.fetch_add(bytes);
  if (before + bytes > budget_.limit_) {
    budget_.in_use_.fetch_sub(bytes);
    return absl::ResourceExhaustedError(absl::StrCat(
        "run_inline: inline uploads in flight would hold ", before + bytes,
        " bytes, over this worker's budget of ", budget_.limit_,
        " (--max_inline_bytes); send the tensor through shared memory, or "
        "fewer at once"));
  }
  bytes_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> WorkerService::Upload(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::InlineReply, v1::InlineRequest>* stream,
    v1::InlineRequest& msg, uint64_t bytes, bool may_be_empty,
    absl::Time deadline, InlineBudget::Charge& charge) {
  // The upload shares the operation's deadline: past it the stream is
  // cancelled, whatever the client does.
  CallWatchdog::Armed armed(watchdog_, ctx, deadline);
  std::vector<uint8_t> buffer;  // grows as data arrives
  auto missing = [&] {
    return absl::StrCat("got ", buffer.size(), " of ", bytes,
                        " bytes of data");
  };
  for (;;) {
    const std::string& data = msg.data();
    if (data.size() > bytes - buffer.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "run_inline: more data than count x dtype (", bytes, " bytes): ",
          buffer.size() == bytes ? "a message after the buffer was full"
                                 : "the last message overflows it"));
    }
    if (absl::Status s = charge.Add(data.size()); !s.ok()) return s;
    buffer.insert(buffer.end(), data.begin(), data.end());
    msg.Clear();
    if (!stream->Read(&msg)) break;  // the client half-closed (or went away)
  }
  if (armed.fired()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "run_inline: the upload did not end within the operation's deadline: ",
        missing(), buffer.size() == bytes
                       ? ", but the client never half-closed the stream"
                       : ""));
  }
  if (ctx->IsCancelled()) {
    return absl::CancelledError(
        absl::StrCat("run_inline: the client went away during the upload: ",
                     missing()));
  }
  if (buffer.size() != bytes && !(may_be_empty && buffer.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat("run_inline: ", missing(), ", expected ", bytes));
  }
  return buffer;
}

grpc::Status WorkerService::RunInline(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::InlineReply, v1::InlineRequest>* stream) {
  const WorkerNode::Arrival arrival = node_->Arrive();
  v1::OpSpec spec;
  bool have_spec = false;  // its caller's order is known once it was read
  auto refuse = [&](absl::Status s) {
    s = node_->Refuse(arrival, std::move(s), have_spec ? &spec : nullptr);
    node_->log().Warning(absl::StrCat("inline call from ", ctx->peer(), " refused: ",
                            s.ToString()));
    return ToGrpcStatus(s);
  };
  StreamLimiter::Scoped counted(inline_streams_, ctx->peer());
  if (!counted.status().ok()) return refuse(counted.status());
  v1::InlineRequest msg;
  {
    // Even the first message is awaited no longer than an operation.
    CallWatchdog::Armed armed(
        watchdog_, ctx, arrival.at + node_->options().op_timeout);
    if (!stream->Read(&msg)) {
      return refuse(absl::InvalidArgumentError(
          armed.fired() ? "run_inline: no request within the deadline"
                        : "run_inline: no request"));
    }
  }
  spec = msg.spec();
  have_spec = true;
  spec.clear_input_slice();  // an inline all-gather's upload is slice 0
  absl::StatusOr<uint64_t> checked =
      ValidateOpSpec(spec, node_->options().max_op_bytes);
  if (!checked.ok()) return refuse(checked.status());
  InlineBudget::Charge charge(budget_);
  absl::StatusOr<std::vector<uint8_t>> buffer = Upload(
      ctx, stream, msg, InlineUploadBytes(spec, *checked),
      InlineUploadMayBeEmpty(spec), CallDeadline(spec, arrival.at, node_->options().op_timeout), charge);
  if (!buffer.ok()) return refuse(buffer.status());
  if (buffer->size() < *checked) {
    // An all-gather's result is larger than its upload.
    if (absl::Status s = charge.Add(*checked - buffer->size()); !s.ok()) {
      return refuse(s);
    }
    buffer->resize(*checked);
  }
  auto result = node_->Execute(spec, buffer->data(), arrival);
  if (!result.ok()) return ToGrpcStatus(result.status());
  const ByteRange reply = InlineReplyRange(spec, result->rank, buffer->size());
  for (uint64_t off = 0; off < reply.size; off += kInlineChunkBytes) {
    v1::InlineReply out;
    out.set_data(buffer->data() + reply.offset + off,
                 std::min<uint64_t>(kInlineChunkBytes, reply.size - off));
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

grpc::Status WorkerService::GetInfo(grpc::ServerContext*,
                                    const v1::InfoRequest*,
                                    v1::InfoReply* reply) {
  absl::StatusOr<v1::InfoReply> info = node_->Describe();
  if (!info.ok()) return ToGrpcStatus(info.status());
  *reply = std::move(*info);
  return grpc::Status::OK;
}

grpc::Status WorkerService::GetRingHealth(grpc::ServerContext*,
                                          const v1::RingHealthRequest* req,
                                          v1::RingHealth* reply) {
  return node_->GetRingHealth(*req, reply);
}

grpc::Status WorkerService::GetTimeline(grpc::ServerContext*,
                                        const v1::TimelineRequest*,
                                        v1::Timeline* reply) {
  absl::StatusOr<v1::Timeline> t = node_->Timeline();
  if (!t.ok()) return ToGrpcStatus(t.status());
  *reply = std::move(*t);
  return grpc::Status::OK;
}

}  // namespace halka
