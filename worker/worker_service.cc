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

// Inline data travels in messages of at most this many bytes.
constexpr size_t kInlineChunkBytes = size_t{1} << 20;

}  // namespace

grpc::Status WorkerService::Run(grpc::ServerContext*, const v1::RunRequest* req,
                                v1::RunReply* reply) {
  const absl::Time arrived = absl::Now();
  const v1::OpSpec& spec = req->spec();
  if (req->has_device_tensor()) {
    auto result = node_->ExecuteOnDevice(spec, req->device_tensor(), arrived);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *reply->mutable_stats() = ToStats(*result);
    return grpc::Status::OK;
  }
  absl::StatusOr<uint64_t> bytes =
      ValidateOpSpec(spec, node_->options().max_op_bytes);
  if (!bytes.ok()) return ToGrpcStatus(bytes.status());
  if (absl::Status s = ValidateShmRegion(*req, *bytes); !s.ok()) {
    return ToGrpcStatus(s);
  }
  uint8_t* data = nullptr;
  if (*bytes > 0) {
    auto base = shm_.Map(req->shm_name(), req->shm_size());
    if (!base.ok()) return ToGrpcStatus(base.status());
    data = *base + req->shm_offset();
  }
  auto result = node_->Execute(spec, data, arrived);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *reply->mutable_stats() = ToStats(*result);
  return grpc::Status::OK;
}

grpc::Status WorkerService::RunInline(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::InlineReply, v1::InlineRequest>* stream) {
  const absl::Time arrived = absl::Now();
  StreamLimiter::Scoped counted(inline_streams_, ctx->peer());
  if (!counted.status().ok()) return ToGrpcStatus(counted.status());
  v1::InlineRequest msg;
  if (!stream->Read(&msg)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "run_inline: no request");
  }
  const v1::OpSpec spec = msg.spec();
  absl::StatusOr<uint64_t> checked =
      ValidateOpSpec(spec, node_->options().max_op_bytes);
  if (!checked.ok()) return ToGrpcStatus(checked.status());
  const uint64_t bytes = *checked;
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
  auto result = node_->Execute(spec, buffer.data(), arrived);
  if (!result.ok()) return ToGrpcStatus(result.status());
  for (size_t off = 0; off < buffer.size(); off += kInlineChunkBytes) {
    v1::InlineReply out;
    out.set_data(buffer.data() + off,
                 std::min(kInlineChunkBytes, buffer.size() - off));
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
