// Validation of the SDK-facing requests (Worker.Run, Worker.RunInline),
// before any field is used: pure functions, so they are unit-tested and
// fuzzed (tests/fuzz/worker_requests_fuzz.cc) on their own.
#ifndef HALKA_WORKER_OP_REQUEST_H_
#define HALKA_WORKER_OP_REQUEST_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "halka/v1/worker.pb.h"

namespace halka {

// The payload bytes `spec` describes (0 for a barrier). Errors:
// INVALID_ARGUMENT (unknown kind, dtype, reduce op or algorithm; a negative
// broadcast root), RESOURCE_EXHAUSTED (more than `max_op_bytes`). Never
// overflows: count * element size is checked against the limit first.
absl::StatusOr<uint64_t> ValidateOpSpec(const v1::OpSpec& spec,
                                        uint64_t max_op_bytes);

// A Run request's shared-memory region for `bytes` of payload: the name is
// a halka object ("/halka-..." without another '/', at most 200 bytes) and
// [offset, offset + bytes) lies inside [0, shm_size). INVALID_ARGUMENT
// otherwise.
absl::Status ValidateShmRegion(const v1::RunRequest& req, uint64_t bytes);

}  // namespace halka

#endif  // HALKA_WORKER_OP_REQUEST_H_
