// libFuzzer target: the peer/PS frame decoder and validator (DecodeFrame)
// on arbitrary bytes, split into arbitrary gRPC slices as the wire may
// deliver them. A frame that decodes must have exactly count x dtype bytes
// of payload (or none for ABORT), every byte readable, and must survive
// EncodeFrame -> DecodeFrame unchanged. The same bytes as a message of a
// link that agreed to batches (DecodeFrames): every frame so, at most
// kMaxFramesPerMessage, and a message that is one frame is a batch of it.
#include <cstdint>
#include <cstring>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "codec/frame_codec.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // First byte: how many slices the rest is cut into (1..8).
  const size_t pieces = static_cast<size_t>(data[0] % 8) + 1;
  ++data;
  --size;
  std::vector<grpc::Slice> slices;
  size_t pos = 0;
  for (size_t i = 0; i < pieces; ++i) {
    const size_t n = i + 1 == pieces ? size - pos : (size - pos) / (pieces - i);
    slices.emplace_back(data + pos, n);  // copies: gRPC owns received slices
    pos += n;
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  absl::StatusOr<halka::InFrame> frame = halka::DecodeFrame(buffer);
  absl::StatusOr<std::vector<halka::InFrame>> batch =
      halka::DecodeFrames(buffer);
  if (!batch.ok()) {
    Check(batch.status().code() == absl::StatusCode::kDataLoss);
    Check(!frame.ok());
  } else {
    Check(!batch->empty() && batch->size() <= halka::kMaxFramesPerMessage);
    if (frame.ok()) Check(batch->size() == 1);
    for (const halka::InFrame& f : *batch) {
      Check(f.PayloadBytes() ==
            (f.meta.kind == halka::FrameKind::kAbort
                 ? 0
                 : f.meta.count * halka::DTypeSize(f.meta.dtype)));
    }
  }
  if (!frame.ok()) {
    Check(frame.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  const halka::FrameMeta& m = frame->meta;
  const size_t expected = m.kind == halka::FrameKind::kAbort
                              ? 0
                              : m.count * halka::DTypeSize(m.dtype);
  Check(frame->PayloadBytes() == expected);
  Check(expected <= halka::kMaxFramePayloadBytes);
  std::vector<uint8_t> payload;
  payload.reserve(expected);
  for (const auto& p : frame->pieces) payload.insert(payload.end(), p.begin(), p.end());
  // Round trip.
  grpc::ByteBuffer again = halka::EncodeFrame(m, payload);
  absl::StatusOr<halka::InFrame> back = halka::DecodeFrame(again);
  Check(back.ok());
  const halka::FrameMeta& b = back->meta;
  Check(b.kind == m.kind && b.generation == m.generation &&
        b.op_seq == m.op_seq && b.phase == m.phase && b.step == m.step &&
        b.segment == m.segment && b.offset == m.offset && b.count == m.count &&
        b.dtype == m.dtype && b.op == m.op);
  if (m.kind == halka::FrameKind::kFingerprint) Check(b.fingerprint == m.fingerprint);
  std::vector<uint8_t> payload2;
  for (const auto& p : back->pieces) payload2.insert(payload2.end(), p.begin(), p.end());
  Check(payload2 == payload);
  return 0;
}
