// Where an operation's buffer lives, and how the algorithms touch it.
//
// The algorithms never dereference the caller's buffer themselves: they ask
// for a host-readable view of a range to send, and hand received payloads
// over to be reduced or copied into a range. For host memory all of this is
// direct (no copy). A device buffer (CUDA) stages through pinned host
// memory and reduces with kernels on the GPU.
// Thread-safety: used by one operation's thread at a time.
#ifndef HALKA_CORE_OP_BUFFER_H_
#define HALKA_CORE_OP_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/frame.h"

namespace halka {

class OpBuffer {
 public:
  virtual ~OpBuffer() = default;

  // Called once before the operation moves data.
  virtual absl::Status Begin(DType dtype, ReduceOp op, size_t count) = 0;
  // Host-readable bytes of elements [offset, offset + count). The bytes
  // stay valid and unchanged until the same range is next written (Apply,
  // WriteBack) or the operation ends.
  virtual absl::StatusOr<const uint8_t*> HostView(size_t offset,
                                                  size_t count) = 0;
  // Host memory a link's reader may write elements [offset, offset +
  // count) into directly (core/landing.h); nullptr where it may not
  // (a device buffer).
  virtual uint8_t* LandingView(size_t offset, size_t count) {
    (void)offset;
    (void)count;
    return nullptr;
  }
  // dst[range] = dst[range] op payload (reduce) or = payload (copy). A
  // landed frame (a copy whose payload is in the range already) costs
  // nothing; one that is not where the range is fails with INTERNAL.
  virtual absl::Status Apply(bool reduce, size_t offset, size_t count,
                             const InFrame& frame) = 0;
  // dst[range] /= divisor (AVG).
  virtual absl::Status FinalizeAvg(size_t offset, size_t count,
                                   int divisor) = 0;
  // dst[range] = host bytes.
  virtual absl::Status WriteBack(const uint8_t* host, size_t offset,
                                 size_t count) = 0;
  // Called once after the last write; a device buffer synchronises here.
  virtual absl::Status End() = 0;
  // "host" or "cuda:N".
  virtual std::string Where() const = 0;
  // Every view is the caller's host memory itself (no copy to make).
  virtual bool in_host_memory() const { return false; }
};

// The caller's host memory, touched in place.
class HostOpBuffer final : public OpBuffer {
 public:
  explicit HostOpBuffer(void* data) : data_(static_cast<uint8_t*>(data)) {}
  absl::Status Begin(DType dtype, ReduceOp op, size_t count) override;
  absl::StatusOr<const uint8_t*> HostView(size_t offset, size_t count) override;
  uint8_t* LandingView(size_t offset, size_t count) override;
  absl::Status Apply(bool reduce, size_t offset, size_t count,
                     const InFrame& frame) override;
  absl::Status FinalizeAvg(size_t offset, size_t count, int divisor) override;
  absl::Status WriteBack(const uint8_t* host, size_t offset,
                         size_t count) override;
  absl::Status End() override { return absl::OkStatus(); }
  std::string Where() const override { return "host"; }
  bool in_host_memory() const override { return true; }

 private:
  uint8_t* const data_;
  DType dtype_ = DType::kFloat32;
  ReduceOp op_ = ReduceOp::kSum;
  size_t es_ = 4;
};

}  // namespace halka

#endif  // HALKA_CORE_OP_BUFFER_H_
