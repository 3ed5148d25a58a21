#include "codec/frame_codec.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "halka/v1/peer.pb.h"

namespace halka {
namespace {

void ToProto(const Fingerprint& fp, v1::OpFingerprint* out) {
  out->set_op_seq(fp.op_seq);
  out->set_kind(static_cast<v1::OpKind>(fp.kind));
  out->set_dtype(static_cast<v1::DType>(fp.dtype));
  out->set_count(fp.count);
  out->set_op(static_cast<v1::ReduceOp>(fp.op));
  out->set_root(fp.root);
  out->set_algorithm(static_cast<v1::Algorithm>(fp.algorithm));
  out->set_resolved_algorithm(static_cast<v1::Algorithm>(fp.resolved));
}

absl::Status FromProto(const v1::OpFingerprint& in, Fingerprint* fp) {
  // Collectives only: SEND and RECV (6, 7) carry no fingerprint.
  const bool collective =
      (in.kind() >= v1::ALL_REDUCE && in.kind() <= v1::REDUCE_SCATTER) ||
      (in.kind() >= v1::REDUCE && in.kind() <= v1::ALL_TO_ALL);
  // An algorithm past the last this build knows is a newer worker's: it
  // is kept (up to kMaxAlgorithmValue), so that the comparison names the
  // difference (CheckRunsAlike) instead of the link failing on the frame.
  auto algorithm_ok = [](int a) { return a >= 0 && a <= kMaxAlgorithmValue; };
  if (!collective || !IsValidDType(in.dtype()) ||
      !IsValidReduceOp(in.op()) || !algorithm_ok(in.algorithm()) ||
      !algorithm_ok(in.resolved_algorithm())) {
    return absl::DataLossError("frame: fingerprint with invalid enums");
  }
  fp->op_seq = in.op_seq();
  fp->kind = static_cast<OpKind>(in.kind());
  fp->dtype = static_cast<DType>(in.dtype());
  fp->count = in.count();
  fp->op = static_cast<ReduceOp>(in.op());
  fp->root = in.root();
  fp->algorithm = static_cast<Algorithm>(in.algorithm());
  fp->resolved = static_cast<Algorithm>(in.resolved_algorithm());
  return absl::OkStatus();
}

absl::Status ParseHead(absl::string_view head, FrameMeta* m) {
  v1::FrameHeader h;
  if (!h.ParseFromArray(head.data(), static_cast<int>(head.size()))) {
    return absl::DataLossError("frame: header does not parse");
  }
  if (!v1::FrameKind_IsValid(h.kind()) || h.kind() == 0) {
    return absl::DataLossError(absl::StrCat("frame: unknown kind ", h.kind()));
  }
  m->kind = static_cast<FrameKind>(h.kind());
  m->generation = h.generation();
  m->op_seq = h.op_seq();
  if (m->kind == FrameKind::kData) {
    if (h.phase() < v1::PHASE_REDUCE_SCATTER || h.phase() > v1::Phase_MAX ||
        !IsValidDType(h.dtype()) ||
        !IsValidReduceOp(h.op())) {
      return absl::DataLossError("frame: data frame with invalid enums");
    }
  }
  if (!v1::Phase_IsValid(h.phase())) {
    return absl::DataLossError(absl::StrCat("frame: unknown phase ", h.phase()));
  }
  m->phase = static_cast<Phase>(h.phase() == 0 ? 1 : h.phase());
  m->step = h.step();
  m->segment = h.segment();
  m->offset = h.offset();
  m->count = h.count();
  m->dtype = IsValidDType(h.dtype()) ? static_cast<DType>(h.dtype())
                                    : DType::kFloat32;
  m->op = IsValidReduceOp(h.op()) ? static_cast<ReduceOp>(h.op())
                                 : ReduceOp::kSum;
  m->origin_rank = h.origin_rank();
  m->sender_rank = h.sender_rank();
  m->group = h.group();
  if (m->kind == FrameKind::kPeer) {
    if (h.group() != 0) {
      return absl::DataLossError(absl::StrCat(
          "frame: a message piece of group ", h.group(),
          " (point-to-point messages belong to the job)"));
    }
    // Bytes: a piece [offset, offset + count) of a message of
    // message_bytes, which DecodeFrame bounds by the payload's length.
    if (h.dtype() != v1::UINT8 || h.op_seq() == 0 ||
        h.offset() > h.message_bytes() ||
        h.count() > h.message_bytes() - h.offset()) {
      return absl::DataLossError(absl::StrCat(
          "frame: message piece [", h.offset(), ", +", h.count(),
          ") of a message of ", h.message_bytes(), " bytes, message #",
          h.op_seq(), " (dtype ", h.dtype(), ")"));
    }
    m->message_bytes = h.message_bytes();
  }
  if (m->kind == FrameKind::kFingerprint) {
    return FromProto(h.fingerprint(), &m->fingerprint);
  }
  if (m->kind == FrameKind::kAbort) {
    m->abort_code = h.abort_code() > 16
                       ? absl::StatusCode::kUnknown
                       : static_cast<absl::StatusCode>(h.abort_code());
    m->message = h.message().substr(0, 4096);
    // Ranks only (a negative entry is none); at most one per rank of a
    // ring the frame size allows.
    for (int32_t r : h.late_ranks()) {
      if (r >= 0 && m->late_ranks.size() < kMaxLateRanks) {
        m->late_ranks.push_back(r);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string EncodeFrameHead(const FrameMeta& meta) {
  v1::FrameHeader h;
  h.set_kind(static_cast<v1::FrameKind>(meta.kind));
  h.set_generation(meta.generation);
  h.set_op_seq(meta.op_seq);
  h.set_phase(static_cast<v1::Phase>(meta.phase));
  h.set_step(meta.step);
  h.set_segment(meta.segment);
  h.set_offset(meta.offset);
  h.set_count(meta.count);
  h.set_dtype(static_cast<v1::DType>(meta.dtype));
  h.set_op(static_cast<v1::ReduceOp>(meta.op));
  if (meta.kind == FrameKind::kFingerprint) {
    ToProto(meta.fingerprint, h.mutable_fingerprint());
  }
  h.set_origin_rank(meta.origin_rank);
  h.set_sender_rank(meta.sender_rank);
  if (meta.kind == FrameKind::kPeer) h.set_message_bytes(meta.message_bytes);
  h.set_group(meta.group);
  if (meta.kind == FrameKind::kAbort) {
    h.set_abort_code(static_cast<uint32_t>(meta.abort_code));
    h.set_message(meta.message);
    for (int32_t r : meta.late_ranks) h.add_late_ranks(r);
  }
  const size_t hlen = h.ByteSizeLong();
  std::string head(4 + hlen, '\0');
  const uint32_t le = static_cast<uint32_t>(hlen);  // x86/ARM: little endian
  std::memcpy(head.data(), &le, 4);
  h.SerializeToArray(head.data() + 4, static_cast<int>(hlen));
  return head;
}

grpc::ByteBuffer EncodeFrame(const FrameMeta& meta,
                             absl::Span<const uint8_t> payload) {
  grpc::Slice slices[2] = {grpc::Slice(EncodeFrameHead(meta)), grpc::Slice()};
  size_t n = 1;
  if (!payload.empty()) {
    slices[1] = grpc::Slice(payload.data(), payload.size(),
                            grpc::Slice::STATIC_SLICE);
    n = 2;
  }
  return grpc::ByteBuffer(slices, n);
}

OutFrame EncodeOutFrame(const FrameMeta& meta,
                        absl::Span<const uint8_t> payload) {
  auto head = std::make_shared<std::string>(EncodeFrameHead(meta));
  OutFrame frame;
  frame.parts.emplace_back(reinterpret_cast<const uint8_t*>(head->data()),
                           head->size());
  if (!payload.empty()) frame.parts.push_back(payload);
  frame.keepalive = std::move(head);
  frame.data = meta.kind == FrameKind::kData && !payload.empty();
  frame.op_seq = meta.op_seq;
  frame.group = meta.group;
  return frame;
}

void AppendSlices(const OutFrame& frame, std::vector<grpc::Slice>* slices) {
  for (absl::Span<const uint8_t> part : frame.parts) {
    slices->emplace_back(part.data(), part.size(), grpc::Slice::STATIC_SLICE);
  }
}

grpc::ByteBuffer AsByteBuffer(const OutFrame& frame) {
  std::vector<grpc::Slice> slices;
  slices.reserve(frame.parts.size());
  AppendSlices(frame, &slices);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::StatusOr<FrameMeta> DecodeFrameHead(absl::Span<const uint8_t> header) {
  FrameMeta m;
  absl::Status parsed = ParseHead(
      absl::string_view(reinterpret_cast<const char*>(header.data()),
                        header.size()),
      &m);
  if (!parsed.ok()) return parsed;
  return m;
}


namespace {

// Reads frames one after another out of pieces read back to back, without
// joining them. Each frame's payload is the bytes its header says
// (count x dtype; an ABORT none).
class FrameCursor {
 public:
  explicit FrameCursor(absl::Span<const absl::Span<const uint8_t>> bytes)
      : slices_(bytes) {
    for (const auto& s : slices_) left_ += s.size();
  }
  size_t remaining() const { return left_; }

  // The next frame; its pieces point into the slices.
  absl::StatusOr<InFrame> Next() {
    if (left_ < 4) return absl::DataLossError("frame: shorter than 4 bytes");
    uint32_t hlen = 0;
    Read(&hlen, 4);
    if (hlen > kMaxFrameHeaderBytes || hlen > left_) {
      return absl::DataLossError(
          absl::StrCat("frame: header length ", hlen, " is out of bounds"));
    }
    std::string head(hlen, '\0');
    Read(head.data(), hlen);
    InFrame f;
    FrameMeta& m = f.meta;
    absl::Status parsed = ParseHead(head, &m);
    if (!parsed.ok()) return parsed;
    // Data frames carry count elements; a fingerprint frame may carry the
    // whole (small) buffer of an eager operation.
    if (m.count > kMaxFramePayloadBytes ||
        m.count * DTypeSize(m.dtype) > kMaxFramePayloadBytes) {
      return absl::DataLossError(absl::StrCat(
          "frame: count ", m.count, " exceeds the frame limit of ",
          kMaxFramePayloadBytes, " bytes"));
    }
    const uint64_t expected =
        m.kind == FrameKind::kAbort ? 0 : m.count * DTypeSize(m.dtype);
    if (expected > left_) {
      return absl::DataLossError(absl::StrCat(
          "frame: payload of ", left_, " bytes does not match count ",
          m.count, " of ", DTypeName(m.dtype), " (", expected, " bytes)"));
    }
    size_t want = expected;
    while (want > 0) {
      const absl::Span<const uint8_t>& s = slices_[si_];
      const size_t take = std::min(want, s.size() - pos_);
      if (take > 0) f.pieces.push_back(s.subspan(pos_, take));
      Advance(take);
      want -= take;
    }
    return f;
  }

 private:
  void Read(void* dst, size_t len) {
    uint8_t* out = static_cast<uint8_t*>(dst);
    while (len > 0) {
      const absl::Span<const uint8_t>& s = slices_[si_];
      const size_t take = std::min(len, s.size() - pos_);
      std::memcpy(out, s.data() + pos_, take);
      out += take;
      len -= take;
      Advance(take);
    }
  }
  void Advance(size_t n) {
    pos_ += n;
    left_ -= n;
    while (si_ < slices_.size() && pos_ == slices_[si_].size()) {
      ++si_;
      pos_ = 0;
    }
  }

  absl::Span<const absl::Span<const uint8_t>> slices_;
  size_t si_ = 0, pos_ = 0, left_ = 0;
};

std::shared_ptr<std::vector<grpc::Slice>> DumpSlices(
    const grpc::ByteBuffer& buffer, std::vector<absl::Span<const uint8_t>>* spans) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!buffer.Dump(slices.get()).ok()) return nullptr;
  spans->reserve(slices->size());
  for (const grpc::Slice& s : *slices) spans->emplace_back(s.begin(), s.size());
  return slices;
}

}  // namespace

absl::StatusOr<InFrame> DecodeFrame(
    absl::Span<const absl::Span<const uint8_t>> bytes,
    std::shared_ptr<void> keepalive) {
  FrameCursor cursor(bytes);
  absl::StatusOr<InFrame> f = cursor.Next();
  if (!f.ok()) return f;
  if (cursor.remaining() != 0) {
    const uint64_t expected = f->PayloadBytes();
    return absl::DataLossError(absl::StrCat(
        "frame: payload of ", expected + cursor.remaining(),
        " bytes does not match count ", f->meta.count, " of ",
        DTypeName(f->meta.dtype), " (", expected, " bytes)"));
  }
  f->keepalive = std::move(keepalive);
  return f;
}

absl::StatusOr<InFrame> DecodeFrame(const grpc::ByteBuffer& buffer) {
  std::vector<absl::Span<const uint8_t>> spans;
  std::shared_ptr<std::vector<grpc::Slice>> slices = DumpSlices(buffer, &spans);
  if (slices == nullptr) return absl::DataLossError("frame: unreadable buffer");
  return DecodeFrame(spans, std::move(slices));
}

absl::StatusOr<std::vector<InFrame>> DecodeFrames(
    const grpc::ByteBuffer& buffer) {
  std::vector<absl::Span<const uint8_t>> spans;
  std::shared_ptr<std::vector<grpc::Slice>> slices = DumpSlices(buffer, &spans);
  if (slices == nullptr) return absl::DataLossError("frame: unreadable buffer");
  FrameCursor cursor(spans);
  std::vector<InFrame> frames;
  do {
    if (frames.size() == kMaxFramesPerMessage) {
      return absl::DataLossError(absl::StrCat(
          "message: more than ", kMaxFramesPerMessage, " frames"));
    }
    absl::StatusOr<InFrame> f = cursor.Next();
    if (!f.ok()) {
      return absl::Status(f.status().code(),
                          absl::StrCat("frame ", frames.size() + 1,
                                       " of a message: ", f.status().message()));
    }
    f->keepalive = slices;
    frames.push_back(*std::move(f));
  } while (cursor.remaining() > 0);
  return frames;
}

}  // namespace halka
