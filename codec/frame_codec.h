// Frames on the wire: [u32 LE header length][FrameHeader][payload].
//
// Encoding never copies the payload: it becomes a grpc::Slice over the
// caller's memory that gRPC does not own. Decoding never
// copies it either: the InFrame's pieces point into the received slices,
// which the InFrame keeps alive. Every decoded frame is validated (lengths,
// enums, payload size against count x dtype) before anyone touches it.
#ifndef HALKA_CODEC_FRAME_CODEC_H_
#define HALKA_CODEC_FRAME_CODEC_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "grpcpp/support/byte_buffer.h"
#include "core/frame.h"

namespace halka {

inline constexpr size_t kMaxFrameHeaderBytes = 64 * 1024;
inline constexpr uint64_t kMaxFramePayloadBytes = 32 << 20;

// The buffer points into `payload` without owning it: the payload must stay
// valid and unchanged until the write of this buffer has completed
// (OnWriteDone). gRPC may keep the slice itself referenced for longer (in
// 1.51 until the stream ends), but never reads it after the write
// completed, which is why release is tied to the write and not to the
// slice's refcount.
grpc::ByteBuffer EncodeFrame(const FrameMeta& meta,
                             absl::Span<const uint8_t> payload);

// The same frame as every link path takes it (core/frame.h): parts are the
// head (owned by keepalive) and the payload (borrowed, as above). No copy
// of the payload; on_released is left for the caller to set.
OutFrame EncodeOutFrame(const FrameMeta& meta,
                        absl::Span<const uint8_t> payload);

// A gRPC buffer over an OutFrame's parts, copying nothing: valid while the
// frame's keepalive and borrowed payload are (the gRPC path holds the
// frame until the write of the buffer completed).
grpc::ByteBuffer AsByteBuffer(const OutFrame& frame);
// The same slices appended to `slices`: several frames' make one message
// of a link that agreed to batches.
void AppendSlices(const OutFrame& frame, std::vector<grpc::Slice>* slices);

// Errors: DATA_LOSS naming what is wrong with the frame.
absl::StatusOr<InFrame> DecodeFrame(const grpc::ByteBuffer& buffer);

// A message of a link that agreed to batches (kFrameBatchesKey): one or
// more frames back to back, each [u32 LE header length][FrameHeader]
// [payload of exactly the bytes its header says: count x dtype, an ABORT
// none]. Every frame is checked as DecodeFrame checks one; they share the
// message's slices. Errors: DATA_LOSS naming the frame (its place in the
// message) and what is wrong, or more than kMaxFramesPerMessage frames.
inline constexpr size_t kMaxFramesPerMessage = 256;
absl::StatusOr<std::vector<InFrame>> DecodeFrames(
    const grpc::ByteBuffer& buffer);

// The same over a frame's bytes in pieces (read back to back) that
// `keepalive` keeps valid: the InFrame's pieces point into them and it
// takes `keepalive`. For transports other than gRPC (a shared-memory ring).
absl::StatusOr<InFrame> DecodeFrame(
    absl::Span<const absl::Span<const uint8_t>> bytes,
    std::shared_ptr<void> keepalive);

// The header alone (the FrameHeader bytes after the length), checked as
// DecodeFrame checks it, for a reader that decides where the payload goes
// before it reads it (core/landing.h). Errors: DATA_LOSS.
absl::StatusOr<FrameMeta> DecodeFrameHead(absl::Span<const uint8_t> header);

// [u32 LE header length][FrameHeader]: what precedes the payload.
std::string EncodeFrameHead(const FrameMeta& meta);

}  // namespace halka

#endif  // HALKA_CODEC_FRAME_CODEC_H_
