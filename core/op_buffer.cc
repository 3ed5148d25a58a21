#include "core/op_buffer.h"

#include <cstring>

#include "core/payload.h"
#include "core/reduce.h"

namespace halka {

absl::Status HostOpBuffer::Begin(DType dtype, ReduceOp op, size_t) {
  dtype_ = dtype;
  op_ = op;
  es_ = DTypeSize(dtype);
  return absl::OkStatus();
}

absl::StatusOr<const uint8_t*> HostOpBuffer::HostView(size_t offset, size_t) {
  return data_ + offset * es_;
}

uint8_t* HostOpBuffer::LandingView(size_t offset, size_t) {
  return data_ + offset * es_;
}

namespace {

absl::Status LandedInPlace(bool reduce, const uint8_t* dst, size_t bytes,
                           const InFrame& frame) {
  if (!reduce && frame.pieces.size() == 1 && frame.pieces[0].data() == dst &&
      frame.pieces[0].size() == bytes) {
    return absl::OkStatus();
  }
  return absl::InternalError(
      "a payload landed outside the range it was offered for");
}

}  // namespace

absl::Status HostOpBuffer::Apply(bool reduce, size_t offset, size_t count,
                                 const InFrame& frame) {
  if (frame.landed) {
    return LandedInPlace(reduce, data_ + offset * es_, count * es_, frame);
  }
  ApplyPayload(dtype_, op_, reduce, data_ + offset * es_, frame);
  return absl::OkStatus();
}

absl::Status HostOpBuffer::FinalizeAvg(size_t offset, size_t count,
                                       int divisor) {
  ::halka::FinalizeAvg(dtype_, data_ + offset * es_, count, divisor);
  return absl::OkStatus();
}

absl::Status HostOpBuffer::WriteBack(const uint8_t* host, size_t offset,
                                     size_t count) {
  if (count > 0) std::memcpy(data_ + offset * es_, host, count * es_);
  return absl::OkStatus();
}

}  // namespace halka
