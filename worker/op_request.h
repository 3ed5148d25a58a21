// Validation of the SDK-facing requests (Worker.Run, Worker.RunInline),
// before any field is used: pure functions, so they are unit-tested and
// fuzzed (tests/fuzz/worker_requests_fuzz.cc) on their own.
#ifndef HALKA_WORKER_OP_REQUEST_H_
#define HALKA_WORKER_OP_REQUEST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "halka/v1/worker.pb.h"

namespace halka {

// The elements of the buffer a call works on: `count`, and for an
// all-gather, reduce-scatter, gather or scatter the larger of count and
// recv_count (the gathered result, or the data to reduce or scatter). 0
// for a barrier.
uint64_t BufferCount(const v1::OpSpec& spec);

// The payload bytes of the buffer `spec` describes (BufferCount x element
// size; 0 for a barrier). Errors: INVALID_ARGUMENT (unknown kind, dtype,
// reduce op or algorithm; a negative broadcast root), RESOURCE_EXHAUSTED
// (more than `max_op_bytes`). Never overflows: the count is checked against
// the limit first. Whether an all-gather's or reduce-scatter's counts fit
// the ring's world is checked when it runs (Communicator).
absl::StatusOr<uint64_t> ValidateOpSpec(const v1::OpSpec& spec,
                                        uint64_t max_op_bytes);

// SEND or RECV: only two ranks call; it takes no number of the job's
// collectives (no SkipNumber on refusal, no caller place).
bool IsPointToPoint(const v1::OpSpec& spec);
// A collective of a group of the job's ranks (OpSpec.group_ranks), and the
// most ranks a group may name.
bool IsGroupOp(const v1::OpSpec& spec);
inline constexpr int kMaxGroupRanks = 1 << 16;

// Worker.RunInline of a valid spec whose buffer holds `buffer_bytes`: the
// bytes the client uploads (an all-gather or gather: its contribution,
// count elements, which land in slice 0; a recv: none; otherwise the whole
// buffer), ...
uint64_t InlineUploadBytes(const v1::OpSpec& spec, uint64_t buffer_bytes);
// ... whether it may upload nothing instead (a scatter: only the root's
// data is read; the others may send none) ...
bool InlineUploadMayBeEmpty(const v1::OpSpec& spec);
// ... and the bytes the reply streams back once the call ran as `rank`: a
// reduce-scatter's or scatter's slice `rank` (recv_count elements); a
// reduce's or gather's whole buffer on the root and nothing elsewhere;
// otherwise the whole buffer. An empty range when the slice lies outside
// the buffer.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t size = 0;
};
ByteRange InlineReplyRange(const v1::OpSpec& spec, int rank,
                           uint64_t buffer_bytes);

// A shared-memory object name a client may hand in: "/halka-..." without
// another '/' or a NUL, at most 200 bytes. INVALID_ARGUMENT otherwise.
absl::Status ValidateShmName(const std::string& name);

// A Run request's shared-memory region for `bytes` of payload: the name is
// a halka object ("/halka-..." without another '/', at most 200 bytes) and
// [offset, offset + bytes) lies inside [0, shm_size). INVALID_ARGUMENT
// otherwise.
absl::Status ValidateShmRegion(const v1::RunRequest& req, uint64_t bytes);

// When a call must end: `timeout_ms` after it arrived at the worker, or
// `default_timeout` (the worker's --op_timeout) when the caller set none.
// The clock starts at arrival, so time spent queued behind another call or
// uploading inline data counts.
absl::Time CallDeadline(const v1::OpSpec& spec, absl::Time arrived,
                        absl::Duration default_timeout);

}  // namespace halka

#endif  // HALKA_WORKER_OP_REQUEST_H_
