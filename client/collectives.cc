// The SDK's collectives on host memory: each checks its arguments, builds
// its request (client/op_spec.h) and says what the call moves (OpIo); the
// transfer itself (shared memory, a session, inline) is client.cc's.
#include <algorithm>

#include "client/client_proto.h"
#include "client/op_spec.h"
#include "core/dtype.h"
#include "halka/client.h"

namespace halka {

absl::StatusOr<OpInfo> Client::AllReduce(void* data, size_t count,
                                         DType dtype, ReduceOp op,
                                         OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec = AllReduceSpec(count, dtype, op, options);
  if (!spec.ok()) return spec.status();
  return ClientProto::Run(*this, *spec, OpIo::InPlace(data, count * DTypeSize(dtype)));
}

absl::StatusOr<OpInfo> Client::Broadcast(void* data, size_t count, DType dtype,
                                         int root, OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec = BroadcastSpec(count, dtype, root, options);
  if (!spec.ok()) return spec.status();
  return ClientProto::Run(*this, *spec, OpIo::InPlace(data, count * DTypeSize(dtype)));
}

absl::StatusOr<OpInfo> Client::Send(const void* data, size_t count,
                                    DType dtype, int to, int tag,
                                    OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec =
      PeerSpec(v1::SEND, count, dtype, to, tag, options);
  if (!spec.ok()) return spec.status();
  const size_t bytes = count * DTypeSize(dtype);
  return ClientProto::Run(*this, *spec, OpIo{data, bytes, nullptr, 0, bytes});
}

absl::StatusOr<OpInfo> Client::Recv(void* data, size_t count, DType dtype,
                                    int from, int tag, OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec =
      PeerSpec(v1::RECV, count, dtype, from, tag, options);
  if (!spec.ok()) return spec.status();
  const size_t bytes = count * DTypeSize(dtype);
  return ClientProto::Run(*this, *spec, OpIo{nullptr, 0, data, bytes, bytes});
}

absl::StatusOr<OpInfo> Client::AllGather(const void* send, size_t send_count,
                                         void* recv, size_t recv_count,
                                         DType dtype, OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec =
      SliceSpec(v1::ALL_GATHER, send, send_count, recv, recv_count, dtype,
                ReduceOp::kSum, options);
  if (!spec.ok()) return spec.status();
  return ClientProto::Run(*this, *spec,
                    SliceIo(send, send_count, recv, recv_count, dtype));
}

absl::StatusOr<OpInfo> Client::ReduceScatter(const void* send,
                                             size_t send_count, void* recv,
                                             size_t recv_count, DType dtype,
                                             ReduceOp op, OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec =
      SliceSpec(v1::REDUCE_SCATTER, send, send_count, recv, recv_count, dtype,
                op, options);
  if (!spec.ok()) return spec.status();
  return ClientProto::Run(*this, *spec,
                    SliceIo(send, send_count, recv, recv_count, dtype));
}

absl::StatusOr<OpInfo> Client::Reduce(const void* send, void* recv,
                                      size_t count, DType dtype, ReduceOp op,
                                      int root, OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec =
      RootedSpec(v1::REDUCE, count, 0, dtype, op, root, options);
  if (!spec.ok()) return spec.status();
  if (send == nullptr && count > 0) {
    return absl::InvalidArgumentError("reduce: null send buffer");
  }
  const size_t bytes = count * DTypeSize(dtype);
  return ClientProto::Run(*this, *spec, OpIo{send, bytes, recv, bytes, bytes, root});
}

absl::StatusOr<OpInfo> Client::Gather(const void* send, size_t send_count,
                                      void* recv, size_t recv_count,
                                      DType dtype, int root,
                                      OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec = RootedSpec(
      v1::GATHER, send_count, recv_count, dtype, ReduceOp::kSum, root, options);
  if (!spec.ok()) return spec.status();
  if (send == nullptr && send_count > 0) {
    return absl::InvalidArgumentError("gather: null send buffer");
  }
  OpIo io = SliceIo(send, send_count, recv, recv_count, dtype);
  io.root_only = root;
  return ClientProto::Run(*this, *spec, io);
}

absl::StatusOr<OpInfo> Client::Scatter(const void* send, size_t send_count,
                                       void* recv, size_t recv_count,
                                       DType dtype, int root,
                                       OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec = RootedSpec(
      v1::SCATTER, send_count, recv_count, dtype, ReduceOp::kSum, root,
      options);
  if (!spec.ok()) return spec.status();
  if (recv == nullptr && recv_count > 0) {
    return absl::InvalidArgumentError("scatter: null recv buffer");
  }
  // Only the root's send is read: the others may pass none.
  OpIo io = SliceIo(send, send == nullptr ? 0 : send_count, recv, recv_count,
                    dtype);
  io.buffer_bytes = std::max(send_count, recv_count) * DTypeSize(dtype);
  return ClientProto::Run(*this, *spec, io);
}

absl::StatusOr<OpInfo> Client::AllToAll(const void* send, void* recv,
                                        size_t count, DType dtype,
                                        OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec = RootedSpec(
      v1::ALL_TO_ALL, count, count, dtype, ReduceOp::kSum, 0, options);
  if (!spec.ok()) return spec.status();
  if ((send == nullptr || recv == nullptr) && count > 0) {
    return absl::InvalidArgumentError("all_to_all: null send or recv buffer");
  }
  const size_t bytes = count * DTypeSize(dtype);
  return ClientProto::Run(*this, *spec, OpIo{send, bytes, recv, bytes, bytes});
}

absl::StatusOr<OpInfo> Client::Barrier(OpOptions options) {
  return ClientProto::Run(*this, BarrierSpec(options), OpIo::InPlace(nullptr, 0));
}

}  // namespace halka
