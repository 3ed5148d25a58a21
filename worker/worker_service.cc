#include "worker/worker_service.h"

#include <algorithm>
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
  return s;
}

}  // namespace

grpc::Status WorkerService::Run(grpc::ServerContext*, const v1::RunRequest* req,
                                v1::RunReply* reply) {
  const WorkerNode::Arrival arrival = node_->Arrive();
  const v1::OpSpec& spec = req->spec();
  if (req->has_device_tensor()) {
    auto result = node_->ExecuteOnDevice(spec, req->device_tensor(), arrival);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *reply->mutable_stats() = ToStats(*result);
    return grpc::Status::OK;
  }
  absl::StatusOr<uint64_t> bytes =
      ValidateOpSpec(spec, node_->options().max_op_bytes);
  if (!bytes.ok()) return ToGrpcStatus(node_->Refuse(arrival, bytes.status()));
  if (absl::Status s = ValidateShmRegion(*req, *bytes); !s.ok()) {
    return ToGrpcStatus(node_->Refuse(arrival, s));
  }
  uint8_t* data = nullptr;
  std::shared_ptr<const ShmCache::Mapping> mapping;  // held until the end
  if (*bytes > 0) {
    auto mapped = shm_.Map(req->shm_name(), req->shm_size());
    if (!mapped.ok()) {
      return ToGrpcStatus(node_->Refuse(arrival, mapped.status()));
    }
    mapping = std::move(*mapped);
    data = mapping->base + req->shm_offset();
  }
  auto result = node_->Execute(spec, data, arrival);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *reply->mutable_stats() = ToStats(*result);
  return grpc::Status::OK;
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
    v1::InlineRequest& msg, uint64_t bytes, absl::Time deadline,
    InlineBudget::Charge& charge) {
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
  if (buffer.size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("run_inline: ", missing(), ", expected ", bytes));
  }
  return buffer;
}

grpc::Status WorkerService::RunInline(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::InlineReply, v1::InlineRequest>* stream) {
  const WorkerNode::Arrival arrival = node_->Arrive();
  auto refuse = [&](absl::Status s) {
    s = node_->Refuse(arrival, std::move(s));
    LogWarning(absl::StrCat("inline call from ", ctx->peer(), " refused: ",
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
  v1::OpSpec spec = msg.spec();
  spec.clear_input_slice();  // an inline all-gather's upload is slice 0
  absl::StatusOr<uint64_t> checked =
      ValidateOpSpec(spec, node_->options().max_op_bytes);
  if (!checked.ok()) return refuse(checked.status());
  InlineBudget::Charge charge(budget_);
  absl::StatusOr<std::vector<uint8_t>> buffer = Upload(
      ctx, stream, msg, InlineUploadBytes(spec, *checked),
      CallDeadline(spec, arrival.at, node_->options().op_timeout), charge);
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

}  // namespace halka
