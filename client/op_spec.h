// The validated request (v1::OpSpec) of each SDK collective: the checks a
// call fails with INVALID_ARGUMENT before anything reaches the worker, and
// the SDK's enums (halka/types.h) turned into the wire's; and the buffers
// a call moves (OpIo). Internal to the SDK (client.cc).
#ifndef HALKA_CLIENT_OP_SPEC_H_
#define HALKA_CLIENT_OP_SPEC_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "halka/client.h"
#include "halka/v1/worker.pb.h"

namespace halka {

// An all-reduce.
absl::StatusOr<v1::OpSpec> AllReduceSpec(size_t count, DType dtype,
                                         ReduceOp op,
                                         const OpOptions& options);

// An all-gather or a reduce-scatter (kind). Whether the counts fit the
// ring's world is the worker's to say (it names the world).
absl::StatusOr<v1::OpSpec> SliceSpec(v1::OpKind kind, const void* send,
                                     size_t send_count, const void* recv,
                                     size_t recv_count, DType dtype,
                                     ReduceOp op, const OpOptions& options);

// A reduce to `root` (REDUCE), a gather to it (GATHER: count = send_count,
// recv_count = world x send_count), a scatter from it (SCATTER: count =
// send_count = world x recv_count), an all-to-all (ALL_TO_ALL, count
// elements; root ignored). Whether the counts fit the ring's world is the
// worker's to say.
absl::StatusOr<v1::OpSpec> RootedSpec(v1::OpKind kind, size_t count,
                                      size_t recv_count, DType dtype,
                                      ReduceOp op, int root,
                                      const OpOptions& options);

// A broadcast from `root`.
absl::StatusOr<v1::OpSpec> BroadcastSpec(size_t count, DType dtype, int root,
                                         const OpOptions& options);

// A send (to `peer`) or a recv (from `peer`, -1: any rank), kind SEND/RECV.
absl::StatusOr<v1::OpSpec> PeerSpec(v1::OpKind kind, size_t count,
                                    DType dtype, int peer, int tag,
                                    const OpOptions& options);

// A barrier.
v1::OpSpec BarrierSpec(const OpOptions& options);

// What a call moves: the worker's buffer of buffer_bytes starts with
// `send` (send_bytes); the result (recv_bytes) goes to `recv`: from the
// start of the buffer, or a reduce-scatter's or scatter's slice of this
// rank; with root_only >= 0 (reduce, gather) only when this rank is that
// root (recv may be null elsewhere).
struct OpIo {
  const void* send;
  size_t send_bytes;
  void* recv;
  size_t recv_bytes;
  size_t buffer_bytes;
  int root_only = -1;
  static OpIo InPlace(void* data, size_t bytes) {
    return OpIo{data, bytes, data, bytes, bytes};
  }
};
// An all-gather's or a reduce-scatter's (counts in elements of dtype).
OpIo SliceIo(const void* send, size_t send_count, void* recv,
             size_t recv_count, DType dtype);
// An all-gather: sets spec's input_slice to where the contribution is in
// recv (in place: true), else to 0 (false: the caller copies it there).
bool InPlaceSlice(const OpIo& io, v1::OpSpec* spec);
// The same on host memory, copying the contribution when needed.
void PlaceContribution(const OpIo& io, v1::OpSpec* spec);

}  // namespace halka

#endif  // HALKA_CLIENT_OP_SPEC_H_
