// libFuzzer target: the worker's SDK-facing requests (Worker.Run and the
// first message of Worker.RunInline) as a hostile client could send them.
// The first input byte picks the request type; the rest is parsed as that
// proto (as gRPC would) and handed to the pure validation the handlers use
// (worker/op_request.h). Checked: no crash or sanitizer report; only the
// documented codes; and what passes is safe to use: the byte count matches
// count x element size within the limit, and the shm region lies inside
// the object without overflow.
#include <cstdint>
#include <string>

#include "halka/v1/worker.pb.h"
#include "core/dtype.h"
#include "worker/op_request.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

constexpr uint64_t kLimit = uint64_t{16} << 30;

void CheckSpec(const halka::v1::OpSpec& spec, const halka::v1::RunRequest* run) {
  absl::StatusOr<uint64_t> bytes = halka::ValidateOpSpec(spec, kLimit);
  if (!bytes.ok()) {
    Check(bytes.status().code() == absl::StatusCode::kInvalidArgument ||
          bytes.status().code() == absl::StatusCode::kResourceExhausted);
    return;
  }
  Check(*bytes <= kLimit);
  if (spec.kind() == halka::v1::BARRIER) {
    Check(*bytes == 0);
  } else {
    Check(halka::IsValidDType(spec.dtype()));
    const uint64_t es =
        halka::DTypeSize(static_cast<halka::DType>(spec.dtype()));
    const uint64_t count = halka::BufferCount(spec);
    Check(*bytes == count * es && count <= kLimit / es);
    Check(count >= spec.count());
    if (spec.kind() == halka::v1::ALL_GATHER ||
        spec.kind() == halka::v1::REDUCE_SCATTER) {
      Check(count >= spec.recv_count());
      // What RunInline uploads and replies lies inside the buffer.
      Check(halka::InlineUploadBytes(spec, *bytes) <= *bytes);
      for (int rank : {0, 1, 7, 1 << 30}) {
        const halka::ByteRange reply =
            halka::InlineReplyRange(spec, rank, *bytes);
        Check(reply.offset <= *bytes && reply.size <= *bytes - reply.offset);
      }
    }
  }
  if (run == nullptr) return;
  absl::Status region = halka::ValidateShmRegion(*run, *bytes);
  if (!region.ok()) {
    Check(region.code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  if (*bytes > 0) {
    Check(run->shm_offset() <= run->shm_size());
    Check(*bytes <= run->shm_size() - run->shm_offset());
    Check(run->shm_name().rfind("/halka-", 0) == 0);
    Check(run->shm_name().find('/', 1) == std::string::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char* body = reinterpret_cast<const char*>(data + 1);
  const int length = static_cast<int>(size - 1);
  if (data[0] % 2 == 0) {
    halka::v1::RunRequest req;
    if (!req.ParseFromArray(body, length)) return 0;
    CheckSpec(req.spec(), &req);
  } else {
    halka::v1::InlineRequest req;
    if (!req.ParseFromArray(body, length)) return 0;
    CheckSpec(req.spec(), nullptr);
  }
  return 0;
}
