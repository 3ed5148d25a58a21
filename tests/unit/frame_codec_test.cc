#include "codec/frame_codec.h"

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "halka/v1/peer.pb.h"
#include "tests/testing/frame_samples.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::AbortMeta;
using halka::testing::Flatten;
using halka::testing::FingerprintMeta;

// ---- helpers ---------------------------------------------------------------

// One slice holding a copy of `bytes` (an empty string gives one empty slice).
grpc::ByteBuffer OneSlice(const std::string& bytes) {
  grpc::Slice s(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&s, 1);
}

// Copies `bytes` into slices whose sizes cycle through `sizes`.
grpc::ByteBuffer Reslice(const std::string& bytes,
                         const std::vector<size_t>& sizes) {
  std::vector<grpc::Slice> slices;
  size_t pos = 0, i = 0;
  while (pos < bytes.size()) {
    const size_t n = std::min(sizes[i++ % sizes.size()], bytes.size() - pos);
    slices.emplace_back(bytes.data() + pos, n);
    pos += n;
  }
  if (slices.empty()) slices.emplace_back();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Like Reslice, but the decoder is guaranteed to see exactly these slice
// boundaries. gRPC merges slices when it builds a byte buffer: small copied
// (inlined) slices are packed together, and slices sharing a refcount (all
// static slices do) are joined when they are contiguous in memory. So each
// piece here is a static slice into `storage`, with a gap byte between
// pieces. Anything decoded must not outlive the Resliced.
struct Resliced {
  std::unique_ptr<std::string> storage;
  grpc::ByteBuffer buffer;
};

Resliced ResliceExactly(const std::string& bytes,
                        const std::vector<size_t>& sizes) {
  Resliced r;
  r.storage = std::make_unique<std::string>(2 * bytes.size() + 1, '#');
  std::vector<grpc::Slice> slices;
  size_t pos = 0, at = 0, i = 0;
  while (pos < bytes.size()) {
    const size_t n = std::min(sizes[i++ % sizes.size()], bytes.size() - pos);
    std::memcpy(r.storage->data() + at, bytes.data() + pos, n);
    slices.emplace_back(r.storage->data() + at, n, grpc::Slice::STATIC_SLICE);
    pos += n;
    at += n + 1;  // leave a gap so gRPC cannot join neighbours
  }
  if (slices.empty()) slices.emplace_back();
  r.buffer = grpc::ByteBuffer(slices.data(), slices.size());
  return r;
}

size_t SliceCount(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  return slices.size();
}

// Phases valid on the wire: 1..kMaxPhase. Data frames use 2..kMaxPhase.
constexpr int kMaxPhase = v1::Phase_MAX;

std::string Concat(const InFrame& f) {
  std::string out;
  for (const auto& p : f.pieces) {
    out.append(reinterpret_cast<const char*>(p.data()), p.size());
  }
  return out;
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

std::string AsString(const std::vector<uint8_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

// [u32 LE length][header bytes][payload]
std::string Wire(const std::string& header, const std::string& payload) {
  std::string out(4, '\0');
  const uint32_t len = static_cast<uint32_t>(header.size());
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + header + payload;
}

std::string Wire(const v1::FrameHeader& h, const std::string& payload) {
  return Wire(h.SerializeAsString(), payload);
}

v1::FrameHeader DataHeader(DType dtype, uint64_t count) {
  v1::FrameHeader h;
  h.set_kind(v1::DATA);
  h.set_generation(3);
  h.set_op_seq(9);
  h.set_phase(v1::PHASE_REDUCE_SCATTER);
  h.set_step(1);
  h.set_segment(2);
  h.set_offset(100);
  h.set_count(count);
  h.set_dtype(static_cast<v1::DType>(dtype));
  h.set_op(v1::SUM);
  h.set_origin_rank(0);
  h.set_sender_rank(1);
  return h;
}

v1::FrameHeader FingerprintHeader(uint64_t count) {
  v1::FrameHeader h;
  h.set_kind(v1::FINGERPRINT);
  h.set_phase(v1::PHASE_FINGERPRINT);
  h.set_count(count);
  h.set_dtype(v1::FLOAT32);
  h.set_op(v1::SUM);
  v1::OpFingerprint* fp = h.mutable_fingerprint();
  fp->set_op_seq(1);
  fp->set_kind(v1::ALL_REDUCE);
  fp->set_dtype(v1::FLOAT32);
  fp->set_count(count);
  fp->set_op(v1::SUM);
  fp->set_algorithm(v1::RING);
  return h;
}

void ExpectMetaEq(const FrameMeta& got, const FrameMeta& want) {
  EXPECT_EQ(got.kind, want.kind);
  EXPECT_EQ(got.generation, want.generation);
  EXPECT_EQ(got.op_seq, want.op_seq);
  EXPECT_EQ(got.phase, want.phase);
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.segment, want.segment);
  EXPECT_EQ(got.offset, want.offset);
  EXPECT_EQ(got.count, want.count);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.op, want.op);
  EXPECT_TRUE(got.fingerprint == want.fingerprint)
      << got.fingerprint.ToString() << " vs " << want.fingerprint.ToString();
  EXPECT_EQ(got.origin_rank, want.origin_rank);
  EXPECT_EQ(got.sender_rank, want.sender_rank);
  EXPECT_EQ(got.abort_code, want.abort_code);
  EXPECT_EQ(got.message, want.message);
  EXPECT_EQ(got.late_ranks, want.late_ranks);
}

FrameMeta DataMeta(DType dtype, uint64_t count, Phase phase, ReduceOp op) {
  FrameMeta m;
  m.kind = FrameKind::kData;
  m.generation = 0xDEADBEEFCAFEull;
  m.op_seq = 42;
  m.phase = phase;
  m.step = 7;
  m.segment = 11;
  m.offset = uint64_t{1} << 40;
  m.count = count;
  m.dtype = dtype;
  m.op = op;
  m.origin_rank = 2;
  m.sender_rank = 5;
  return m;
}



void ExpectDataLoss(const grpc::ByteBuffer& buffer, const std::string& what) {
  absl::StatusOr<InFrame> f = DecodeFrame(buffer);
  EXPECT_FALSE(f.ok()) << what << ": decoded a frame of kind "
                       << static_cast<int>(f->meta.kind) << ", phase "
                       << static_cast<int>(f->meta.phase);
  if (!f.ok()) {
    EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss)
        << what << ": " << f.status();
  }
}

void ExpectDataLoss(const std::string& bytes, const std::string& what) {
  ExpectDataLoss(OneSlice(bytes), what);
  Resliced r = ResliceExactly(bytes, {1, 3, 7});
  ExpectDataLoss(r.buffer, what + " (resliced)");
}

// ---- round trips -----------------------------------------------------------

TEST(FrameCodecTest, DataFrameRoundTripEveryDTypePhaseAndOp) {
  ASSERT_GE(kMaxPhase, 5);
  uint32_t seed = 0;
  for (DType dtype : kAllDTypes) {
    for (int p = 2; p <= kMaxPhase; ++p) {
      const Phase phase = static_cast<Phase>(p);
      for (ReduceOp op : kAllReduceOps) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", PhaseName(phase), " ",
                                  ReduceOpName(op)));
        const uint64_t count = 37 + seed % 5;
        const std::vector<uint8_t> payload =
            Pattern(count * DTypeSize(dtype), ++seed);
        const FrameMeta meta = DataMeta(dtype, count, phase, op);
        grpc::ByteBuffer buf = EncodeFrame(meta, payload);
        absl::StatusOr<InFrame> f = DecodeFrame(buf);
        ASSERT_TRUE(f.ok()) << f.status();
        ExpectMetaEq(f->meta, meta);
        EXPECT_EQ(f->PayloadBytes(), payload.size());
        EXPECT_EQ(Concat(*f), AsString(payload));
      }
    }
  }
}

TEST(FrameCodecTest, EncodingDoesNotCopyThePayload) {
  const std::vector<uint8_t> payload = Pattern(4096, 1);
  grpc::ByteBuffer buf =
      EncodeFrame(DataMeta(DType::kFloat32, 1024, Phase::kAllGather,
                           ReduceOp::kSum),
                  payload);
  absl::StatusOr<InFrame> f = DecodeFrame(buf);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->pieces.size(), 1u);
  EXPECT_EQ(f->pieces[0].data(), payload.data());
  EXPECT_EQ(f->pieces[0].size(), payload.size());
}

// The neutral frame every link path takes: the same bytes as EncodeFrame,
// the payload borrowed, and the gRPC buffer over it copying nothing.
TEST(FrameCodecTest, OutFrameIsTheSameFrameWithoutCopies) {
  const std::vector<uint8_t> payload = Pattern(4096, 2);
  const FrameMeta meta =
      DataMeta(DType::kFloat32, 1024, Phase::kReduceScatter, ReduceOp::kMax);
  const OutFrame out = EncodeOutFrame(meta, payload);
  ASSERT_EQ(out.parts.size(), 2u);
  EXPECT_EQ(out.parts[1].data(), payload.data());
  EXPECT_EQ(out.Bytes(), out.parts[0].size() + payload.size());
  EXPECT_EQ(Flatten(AsByteBuffer(out)), Flatten(EncodeFrame(meta, payload)));

  absl::StatusOr<InFrame> over_parts = DecodeFrame(
      absl::MakeConstSpan(out.parts), out.keepalive);
  ASSERT_TRUE(over_parts.ok()) << over_parts.status();
  ExpectMetaEq(over_parts->meta, meta);
  EXPECT_EQ(Concat(*over_parts), AsString(payload));

  const grpc::ByteBuffer buf = AsByteBuffer(out);
  absl::StatusOr<InFrame> over_grpc = DecodeFrame(buf);
  ASSERT_TRUE(over_grpc.ok()) << over_grpc.status();
  ASSERT_EQ(over_grpc->pieces.size(), 1u);
  EXPECT_EQ(over_grpc->pieces[0].data(), payload.data());
  ExpectMetaEq(over_grpc->meta, meta);

  // A frame with no payload is its head alone.
  const OutFrame bare = EncodeOutFrame(meta, {});
  EXPECT_EQ(bare.parts.size(), 1u);
  EXPECT_EQ(Flatten(AsByteBuffer(bare)), Flatten(EncodeFrame(meta, {})));
}

TEST(FrameCodecTest, FingerprintWithoutPayload) {
  const FrameMeta meta = FingerprintMeta(0, DType::kFloat32);
  absl::StatusOr<InFrame> f = DecodeFrame(EncodeFrame(meta, {}));
  ASSERT_TRUE(f.ok()) << f.status();
  ExpectMetaEq(f->meta, meta);
  EXPECT_EQ(f->PayloadBytes(), 0u);
  EXPECT_TRUE(f->pieces.empty());
}

TEST(FrameCodecTest, FingerprintWithPayloadEveryDType) {
  uint32_t seed = 100;
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const uint64_t count = 19;
    const std::vector<uint8_t> payload =
        Pattern(count * DTypeSize(dtype), ++seed);
    const FrameMeta meta = FingerprintMeta(count, dtype);
    absl::StatusOr<InFrame> f = DecodeFrame(EncodeFrame(meta, payload));
    ASSERT_TRUE(f.ok()) << f.status();
    ExpectMetaEq(f->meta, meta);
    EXPECT_EQ(Concat(*f), AsString(payload));
  }
}

TEST(FrameCodecTest, FingerprintEveryKindAndAlgorithm) {
  for (OpKind kind : {OpKind::kAllReduce, OpKind::kBroadcast, OpKind::kBarrier,
                      OpKind::kAllGather, OpKind::kReduceScatter,
                      OpKind::kReduce, OpKind::kGather, OpKind::kScatter,
                      OpKind::kAllToAll}) {
    // A value past the last this build knows (a newer worker's algorithm)
    // is kept, for the ranks to name the difference.
    for (Algorithm alg : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kNaive,
                          Algorithm::kParameterServer, Algorithm::kTwoLevel,
                          Algorithm::kTree, Algorithm::kRecursiveDoubling,
                          Algorithm::kHalvingDoubling,
                          static_cast<Algorithm>(v1::Algorithm_MAX + 1),
                          static_cast<Algorithm>(kMaxAlgorithmValue)}) {
      FrameMeta meta = FingerprintMeta(0, DType::kFloat32);
      meta.fingerprint.kind = kind;
      meta.fingerprint.algorithm = alg;
      meta.fingerprint.resolved = alg;  // what the sender runs
      meta.fingerprint.root = -1;
      absl::StatusOr<InFrame> f = DecodeFrame(EncodeFrame(meta, {}));
      ASSERT_TRUE(f.ok()) << f.status();
      ExpectMetaEq(f->meta, meta);
      EXPECT_EQ(f->meta.fingerprint.resolved, alg);  // == leaves it out
    }
  }
}

TEST(FrameCodecTest, AbortRoundTripEveryCode) {
  for (int c = 0; c <= 16; ++c) {
    SCOPED_TRACE(c);
    const FrameMeta meta =
        AbortMeta(static_cast<absl::StatusCode>(c),
                  absl::StrCat("rank 6 failed: reason #", c, " \xe2\x9c\x97"));
    absl::StatusOr<InFrame> f = DecodeFrame(EncodeFrame(meta, {}));
    ASSERT_TRUE(f.ok()) << f.status();
    ExpectMetaEq(f->meta, meta);
    EXPECT_TRUE(f->pieces.empty());
  }
}

// The late ranks an ABORT names (a deadline in the fingerprint exchange)
// survive, rank 0 included; none stays none; negative entries on the wire
// read as none, and at most kMaxLateRanks are read.
TEST(FrameCodecTest, AbortLateRanksRoundTrip) {
  for (const std::vector<int32_t>& late : std::vector<std::vector<int32_t>>{
           {}, {0}, {5}, {3, 0, 7}}) {
    SCOPED_TRACE(late.size());
    FrameMeta meta = AbortMeta(absl::StatusCode::kDeadlineExceeded,
                               "deadline exceeded waiting for rank 5");
    meta.late_ranks = late;
    absl::StatusOr<InFrame> f = DecodeFrame(EncodeFrame(meta, {}));
    ASSERT_TRUE(f.ok()) << f.status();
    ExpectMetaEq(f->meta, meta);
  }
  v1::FrameHeader h;
  h.set_kind(v1::ABORT);
  h.set_op_seq(3);
  h.add_late_ranks(-7);
  h.add_late_ranks(2);
  for (int i = 0; i < 100; ++i) h.add_late_ranks(i);
  absl::StatusOr<InFrame> f = DecodeFrame(OneSlice(Wire(h, "")));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->meta.late_ranks.size(), kMaxLateRanks);
  EXPECT_EQ(f->meta.late_ranks[0], 2);
  EXPECT_EQ(f->meta.late_ranks[1], 0);
}

// A piece of a point-to-point message: its place in the message, the
// message's size, number and tag survive; a piece that lies outside its
// message, claims another dtype or number 0 is refused.
TEST(FrameCodecTest, PeerPieceRoundTripsAndBadPiecesAreRefused) {
  FrameMeta meta;
  meta.kind = FrameKind::kPeer;
  meta.generation = 3;
  meta.op_seq = 12;
  meta.step = -7;  // a tag may be any int
  meta.offset = 4096;
  meta.count = 100;
  meta.dtype = DType::kUInt8;
  meta.sender_rank = 2;
  meta.origin_rank = 2;
  meta.message_bytes = 4196;
  const std::vector<uint8_t> payload(100, 0x5A);
  absl::StatusOr<InFrame> f = DecodeFrame(EncodeFrame(meta, payload));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->meta.kind, FrameKind::kPeer);
  EXPECT_EQ(f->meta.op_seq, 12u);
  EXPECT_EQ(f->meta.step, -7);
  EXPECT_EQ(f->meta.offset, 4096u);
  EXPECT_EQ(f->meta.count, 100u);
  EXPECT_EQ(f->meta.message_bytes, 4196u);
  EXPECT_EQ(f->meta.sender_rank, 2);
  EXPECT_EQ(f->PayloadBytes(), 100u);
  FrameMeta empty = meta;  // a message of no bytes is one empty piece
  empty.offset = 0;
  empty.count = 0;
  empty.message_bytes = 0;
  EXPECT_TRUE(DecodeFrame(EncodeFrame(empty, {})).ok());
  google::protobuf::LogSilencer quiet;
  FrameMeta past_end = meta;
  past_end.message_bytes = 4195;
  FrameMeta typed = meta;
  typed.dtype = DType::kFloat32;
  typed.count = 25;
  FrameMeta unnumbered = meta;
  unnumbered.op_seq = 0;
  for (const FrameMeta& bad : {past_end, typed, unnumbered}) {
    absl::StatusOr<InFrame> r = DecodeFrame(EncodeFrame(bad, payload));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("message"));
  }
}

// Whatever EncodeFrame produces, DecodeFrame must accept: an abort carries
// an arbitrary absl::Status message, which need not be valid UTF-8 (a path,
// a peer's bytes, a message cut in the middle of a multi-byte character).
TEST(FrameCodecTest, AbortWithNonUtf8MessageRoundTrips) {
  google::protobuf::LogSilencer quiet;
  for (const std::string& message :
       {std::string("open /data/caf\xe9.bin: no such file"),  // Latin-1
        std::string("truncated \xc3"),                         // cut UTF-8
        std::string("\xff\xfe\x00" "binary", 9)}) {
    SCOPED_TRACE(message);
    const FrameMeta meta = AbortMeta(absl::StatusCode::kInternal, message);
    absl::StatusOr<InFrame> f = DecodeFrame(EncodeFrame(meta, {}));
    EXPECT_TRUE(f.ok()) << f.status();
    if (f.ok()) ExpectMetaEq(f->meta, meta);
  }
}

TEST(FrameCodecTest, AbortCodeOutOfRangeBecomesUnknown) {
  v1::FrameHeader h;
  h.set_kind(v1::ABORT);
  h.set_abort_code(99);
  h.set_message("boom");
  absl::StatusOr<InFrame> f = DecodeFrame(OneSlice(Wire(h, "")));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->meta.abort_code, absl::StatusCode::kUnknown);
  EXPECT_EQ(f->meta.message, "boom");
}

TEST(FrameCodecTest, AbortMessageIsCapped) {
  const FrameMeta meta =
      AbortMeta(absl::StatusCode::kInternal, std::string(10000, 'm'));
  absl::StatusOr<InFrame> f = DecodeFrame(EncodeFrame(meta, {}));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->meta.message, std::string(4096, 'm'));
}

TEST(FrameCodecTest, ResliceAtOddBoundaries) {
  const std::vector<std::vector<size_t>> patterns = {
      {1}, {3}, {7}, {1, 3, 7}, {2, 5, 1, 11}, {4}, {13, 1}, {1000000}};
  uint32_t seed = 500;
  for (DType dtype : kAllDTypes) {
    const uint64_t count = 53;
    const std::vector<uint8_t> payload = Pattern(count * DTypeSize(dtype), ++seed);
    const FrameMeta metas[] = {
        DataMeta(dtype, count, Phase::kNaive, ReduceOp::kMin),
        FingerprintMeta(count, dtype)};
    for (const FrameMeta& meta : metas) {
      const std::string wire = Flatten(EncodeFrame(meta, payload));
      for (const auto& pattern : patterns) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " kind ",
                                  static_cast<int>(meta.kind), " first slice ",
                                  pattern[0]));
        Resliced r = ResliceExactly(wire, pattern);
        if (pattern.size() == 1 && pattern[0] == 1) {
          // The boundaries really reach the decoder: one slice per byte.
          ASSERT_EQ(SliceCount(r.buffer), wire.size());
        }
        absl::StatusOr<InFrame> f = DecodeFrame(r.buffer);
        ASSERT_TRUE(f.ok()) << f.status();
        ExpectMetaEq(f->meta, meta);
        EXPECT_EQ(f->PayloadBytes(), payload.size());
        EXPECT_EQ(Concat(*f), AsString(payload));
        if (pattern.size() == 1 && pattern[0] == 1) {
          EXPECT_EQ(f->pieces.size(), payload.size());
        }
        for (const auto& p : f->pieces) EXPECT_GT(p.size(), 0u);
        // A copied (and possibly coalesced by gRPC) reslicing decodes too.
        absl::StatusOr<InFrame> g = DecodeFrame(Reslice(wire, pattern));
        ASSERT_TRUE(g.ok()) << g.status();
        ExpectMetaEq(g->meta, meta);
        EXPECT_EQ(Concat(*g), AsString(payload));
      }
    }
  }
  // An abort frame too.
  const FrameMeta abort = AbortMeta(absl::StatusCode::kUnavailable, "peer gone");
  const std::string wire = Flatten(EncodeFrame(abort, {}));
  for (const auto& pattern : patterns) {
    Resliced r = ResliceExactly(wire, pattern);
    absl::StatusOr<InFrame> f = DecodeFrame(r.buffer);
    ASSERT_TRUE(f.ok()) << f.status();
    ExpectMetaEq(f->meta, abort);
  }
}

TEST(FrameCodecTest, EmptySlicesInTheMiddleAreSkipped) {
  const std::vector<uint8_t> payload = Pattern(40, 9);
  const FrameMeta meta =
      DataMeta(DType::kInt32, 10, Phase::kBroadcast, ReduceOp::kSum);
  const std::string wire = Flatten(EncodeFrame(meta, payload));
  std::string storage(2 * wire.size(), '#');
  std::vector<grpc::Slice> slices;
  slices.emplace_back();
  for (size_t i = 0; i < wire.size(); i += 5) {
    const size_t n = std::min<size_t>(5, wire.size() - i);
    char* at = storage.data() + 2 * i;  // gaps keep the slices apart
    std::memcpy(at, wire.data() + i, n);
    slices.emplace_back(at, n, grpc::Slice::STATIC_SLICE);
    slices.emplace_back();
  }
  grpc::ByteBuffer buf(slices.data(), slices.size());
  absl::StatusOr<InFrame> f = DecodeFrame(buf);
  ASSERT_TRUE(f.ok()) << f.status();
  ExpectMetaEq(f->meta, meta);
  EXPECT_EQ(Concat(*f), AsString(payload));
  // The payload starts wherever the header ended: every 5-byte slice that
  // overlaps it gives one piece, the empty ones none.
  const size_t first = (wire.size() - 40) / 5, last = (wire.size() - 1) / 5;
  EXPECT_EQ(f->pieces.size(), last - first + 1);
}

TEST(FrameCodecTest, DecodedPiecesOutliveTheBuffer) {
  const std::vector<uint8_t> payload = Pattern(800, 3);
  const std::string wire = Flatten(EncodeFrame(
      DataMeta(DType::kFloat64, 100, Phase::kAllGather, ReduceOp::kAvg),
      payload));
  absl::StatusOr<InFrame> f;
  {
    // Slices above gRPC's inline size are separately allocated and
    // refcounted: the decoded pieces must keep them alive.
    grpc::ByteBuffer buf = Reslice(wire, {29, 31, 37});
    f = DecodeFrame(buf);
  }
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Concat(*f), AsString(payload));
}

// ---- hostile inputs --------------------------------------------------------

TEST(FrameCodecHostileTest, EmptyAndUninitialisedBuffers) {
  grpc::ByteBuffer uninitialised;
  ExpectDataLoss(uninitialised, "uninitialised buffer");
  ExpectDataLoss(std::string(), "empty buffer");
}

TEST(FrameCodecHostileTest, ShorterThanFourBytes) {
  ExpectDataLoss(std::string("\x01", 1), "1 byte");
  ExpectDataLoss(std::string("\x01\x00", 2), "2 bytes");
  ExpectDataLoss(std::string("\x00\x00\x00", 3), "3 bytes");
}

TEST(FrameCodecHostileTest, ZeroLengthHeader) {
  ExpectDataLoss(std::string("\x00\x00\x00\x00", 4), "zero header, no kind");
}

TEST(FrameCodecHostileTest, HeaderLengthLargerThanBuffer) {
  const std::string good = Wire(DataHeader(DType::kFloat32, 0), "");
  // Claim one byte more header than there is.
  std::string bad = good;
  const uint32_t claimed = static_cast<uint32_t>(good.size() - 4 + 1);
  std::memcpy(bad.data(), &claimed, 4);
  ExpectDataLoss(bad, "header one byte longer than buffer");
  for (uint32_t len : {100u, 65536u, 0x7fffffffu, 0xffffffffu}) {
    std::string b = good;
    std::memcpy(b.data(), &len, 4);
    ExpectDataLoss(b, absl::StrCat("header length ", len));
  }
}

TEST(FrameCodecHostileTest, HeaderLengthAbove64KiB) {
  // An otherwise valid abort frame whose header is exactly at, then one past,
  // the limit.
  auto header_of_size = [](size_t target) {
    v1::FrameHeader h;
    h.set_kind(v1::ABORT);
    h.set_abort_code(13);
    for (size_t n = target - 8; n > 0; --n) {
      h.set_message(std::string(n, 'x'));
      if (h.ByteSizeLong() == target) return h;
    }
    ADD_FAILURE() << "could not build a header of " << target << " bytes";
    return h;
  };
  const v1::FrameHeader at_limit = header_of_size(kMaxFrameHeaderBytes);
  ASSERT_EQ(at_limit.ByteSizeLong(), kMaxFrameHeaderBytes);
  absl::StatusOr<InFrame> f = DecodeFrame(OneSlice(Wire(at_limit, "")));
  EXPECT_TRUE(f.ok()) << f.status();

  const v1::FrameHeader over = header_of_size(kMaxFrameHeaderBytes + 1);
  ASSERT_EQ(over.ByteSizeLong(), kMaxFrameHeaderBytes + 1);
  ExpectDataLoss(Wire(over, ""), "header of 64 KiB + 1");
  // Through the encoder too.
  FrameMeta meta = AbortMeta(absl::StatusCode::kInternal, std::string(70000, 'y'));
  ExpectDataLoss(EncodeFrame(meta, {}), "encoded 70 kB abort header");
}

TEST(FrameCodecHostileTest, GarbageHeaderBytes) {
  ExpectDataLoss(Wire(std::string(16, '\xff'), ""), "0xff header");
  ExpectDataLoss(Wire(std::string("\x0a\x7f", 2), ""), "truncated length field");
  ExpectDataLoss(Wire(std::string("\x08", 1), ""), "truncated varint");
  ExpectDataLoss(Wire(std::string(20, '\x00'), ""), "zero header bytes");
  ExpectDataLoss(Wire(std::string("\x07\x01\x02", 3), ""), "bad wire type");
  ExpectDataLoss(Wire("this is not a protobuf header", "payload"), "text");
}

TEST(FrameCodecHostileTest, UnknownKind) {
  for (int kind : {0, 4, 5, 100, -1}) {
    v1::FrameHeader h = DataHeader(DType::kFloat32, 0);
    h.set_kind(static_cast<v1::FrameKind>(kind));
    ExpectDataLoss(Wire(h, ""), absl::StrCat("kind ", kind));
  }
}

TEST(FrameCodecHostileTest, UnknownPhaseOnDataFrame) {
  for (int phase : {0, 1, kMaxPhase + 1, 100, -1, -100}) {
    v1::FrameHeader h = DataHeader(DType::kFloat32, 0);
    h.set_phase(static_cast<v1::Phase>(phase));
    ExpectDataLoss(Wire(h, ""), absl::StrCat("data phase ", phase));
  }
}

TEST(FrameCodecHostileTest, UnknownPhaseOnFingerprintAndAbortFrames) {
  for (int phase : {kMaxPhase + 1, 100, -1, -100}) {
    v1::FrameHeader fp = FingerprintHeader(0);
    fp.set_phase(static_cast<v1::Phase>(phase));
    ExpectDataLoss(Wire(fp, ""), absl::StrCat("fingerprint phase ", phase));
    v1::FrameHeader ab;
    ab.set_kind(v1::ABORT);
    ab.set_phase(static_cast<v1::Phase>(phase));
    ExpectDataLoss(Wire(ab, ""), absl::StrCat("abort phase ", phase));
  }
}

TEST(FrameCodecHostileTest, UnknownDTypeOrOpOnDataFrame) {
  for (int dtype : {0, 11, 1000, -1}) {
    v1::FrameHeader h = DataHeader(DType::kFloat32, 0);
    h.set_dtype(static_cast<v1::DType>(dtype));
    ExpectDataLoss(Wire(h, ""), absl::StrCat("dtype ", dtype));
  }
  for (int op : {0, 6, -1}) {
    v1::FrameHeader h = DataHeader(DType::kFloat32, 0);
    h.set_op(static_cast<v1::ReduceOp>(op));
    ExpectDataLoss(Wire(h, ""), absl::StrCat("op ", op));
  }
}

TEST(FrameCodecHostileTest, InvalidFingerprintEnums) {
  auto with = [](auto mutate) {
    v1::FrameHeader h = FingerprintHeader(0);
    mutate(h.mutable_fingerprint());
    return Wire(h, "");
  };
  ExpectDataLoss(with([](v1::OpFingerprint* f) {
                   f->set_kind(static_cast<v1::OpKind>(0));
                 }),
                 "fingerprint kind 0");
  // SEND and RECV are not collectives: no fingerprint of theirs exists.
  ExpectDataLoss(with([](v1::OpFingerprint* f) {
                   f->set_kind(static_cast<v1::OpKind>(6));
                 }),
                 "fingerprint kind 6");
  ExpectDataLoss(with([](v1::OpFingerprint* f) {
                   f->set_kind(static_cast<v1::OpKind>(7));
                 }),
                 "fingerprint kind 7");
  ExpectDataLoss(with([](v1::OpFingerprint* f) {
                   f->set_kind(static_cast<v1::OpKind>(v1::OpKind_MAX + 1));
                 }),
                 "fingerprint kind past the last");
  ExpectDataLoss(with([](v1::OpFingerprint* f) {
                   f->set_dtype(static_cast<v1::DType>(11));
                 }),
                 "fingerprint dtype 11");
  ExpectDataLoss(with([](v1::OpFingerprint* f) {
                   f->set_op(static_cast<v1::ReduceOp>(0));
                 }),
                 "fingerprint op 0");
  ExpectDataLoss(with([](v1::OpFingerprint* f) {
                   f->set_algorithm(
                       static_cast<v1::Algorithm>(kMaxAlgorithmValue + 1));
                 }),
                 "fingerprint algorithm past the last kept");
  ExpectDataLoss(with([](v1::OpFingerprint* f) {
                   f->set_resolved_algorithm(
                       static_cast<v1::Algorithm>(kMaxAlgorithmValue + 1));
                 }),
                 "fingerprint resolved algorithm past the last kept");
  ExpectDataLoss(with([](v1::OpFingerprint* f) {
                   f->set_algorithm(static_cast<v1::Algorithm>(-1));
                 }),
                 "fingerprint algorithm -1");
  // A fingerprint frame without a fingerprint at all has kind 0.
  v1::FrameHeader h = FingerprintHeader(0);
  h.clear_fingerprint();
  ExpectDataLoss(Wire(h, ""), "fingerprint frame without fingerprint");
}

TEST(FrameCodecHostileTest, PayloadLengthMismatch) {
  for (DType dtype : kAllDTypes) {
    const uint64_t count = 10;
    const size_t bytes = count * DTypeSize(dtype);
    const v1::FrameHeader h = DataHeader(dtype, count);
    const std::string exact = AsString(Pattern(bytes, 1));
    ASSERT_TRUE(DecodeFrame(OneSlice(Wire(h, exact))).ok()) << DTypeName(dtype);
    ExpectDataLoss(Wire(h, exact.substr(0, bytes - 1)),
                   absl::StrCat(DTypeName(dtype), " short by one"));
    ExpectDataLoss(Wire(h, exact + "z"),
                   absl::StrCat(DTypeName(dtype), " long by one"));
    ExpectDataLoss(Wire(h, ""), absl::StrCat(DTypeName(dtype), " no payload"));
    // A whole element short or long.
    ExpectDataLoss(Wire(h, exact.substr(0, bytes - DTypeSize(dtype))),
                   absl::StrCat(DTypeName(dtype), " one element short"));
    // Fingerprint frames are held to the same rule.
    const v1::FrameHeader fp = [&] {
      v1::FrameHeader f = FingerprintHeader(count);
      f.set_dtype(static_cast<v1::DType>(dtype));
      return f;
    }();
    ASSERT_TRUE(DecodeFrame(OneSlice(Wire(fp, exact))).ok());
    ExpectDataLoss(Wire(fp, exact.substr(1)),
                   absl::StrCat("fingerprint ", DTypeName(dtype), " short"));
    ExpectDataLoss(Wire(fp, exact + "z"),
                   absl::StrCat("fingerprint ", DTypeName(dtype), " long"));
  }
  // Data frame with count 0 but a payload; abort frame with a payload.
  ExpectDataLoss(Wire(DataHeader(DType::kFloat32, 0), "abcd"),
                 "count 0 with payload");
  v1::FrameHeader ab;
  ab.set_kind(v1::ABORT);
  ab.set_message("x");
  ExpectDataLoss(Wire(ab, "p"), "abort with payload");
}

TEST(FrameCodecHostileTest, HugeCountOverflowAttempts) {
  // count * size wraps to 0 (2^62 * 4, 2^61 * 8, 2^63 * 2): no payload.
  struct Case {
    DType dtype;
    uint64_t count;
    std::string payload;
  };
  const Case cases[] = {
      {DType::kFloat32, uint64_t{1} << 62, ""},
      {DType::kInt32, uint64_t{1} << 62, ""},
      {DType::kFloat64, uint64_t{1} << 61, ""},
      {DType::kInt64, uint64_t{1} << 61, ""},
      {DType::kFloat16, uint64_t{1} << 63, ""},
      {DType::kBFloat16, uint64_t{1} << 63, ""},
      // Wraps to 4 and 8 bytes.
      {DType::kFloat32, (uint64_t{1} << 62) + 1, "abcd"},
      {DType::kFloat64, (uint64_t{1} << 61) + 1, "abcdefgh"},
      {DType::kFloat32, ~uint64_t{0}, ""},
      {DType::kFloat32, kMaxFramePayloadBytes + 1, ""},
  };
  for (const Case& c : cases) {
    ExpectDataLoss(Wire(DataHeader(c.dtype, c.count), c.payload),
                   absl::StrCat(DTypeName(c.dtype), " count ", c.count));
    v1::FrameHeader fp = FingerprintHeader(c.count);
    fp.set_dtype(static_cast<v1::DType>(c.dtype));
    ExpectDataLoss(Wire(fp, c.payload),
                   absl::StrCat("fingerprint ", DTypeName(c.dtype), " count ",
                                c.count));
  }
}

TEST(FrameCodecHostileTest, ErrorMessagesSayWhatIsWrong) {
  absl::StatusOr<InFrame> f =
      DecodeFrame(OneSlice(Wire(DataHeader(DType::kFloat32, 10), "abc")));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("payload"));
  f = DecodeFrame(OneSlice(std::string("\x01", 1)));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("4 bytes"));
}

// Flips, truncates and extends valid frames; decode must return OK or
// DATA_LOSS and, when OK, a self-consistent frame.
TEST(FrameCodecHostileTest, RandomMutationsNeverCrash) {
  std::vector<std::string> seeds;
  const std::vector<uint8_t> p4 = Pattern(64 * 4, 1);
  const std::vector<uint8_t> p8 = Pattern(9 * 8, 2);
  const std::vector<uint8_t> p2 = Pattern(33 * 2, 3);
  seeds.push_back(Flatten(EncodeFrame(
      DataMeta(DType::kFloat32, 64, Phase::kReduceScatter, ReduceOp::kSum), p4)));
  seeds.push_back(Flatten(EncodeFrame(
      DataMeta(DType::kInt64, 9, Phase::kNaive, ReduceOp::kMax), p8)));
  seeds.push_back(Flatten(EncodeFrame(
      DataMeta(DType::kBFloat16, 33, Phase::kBroadcast, ReduceOp::kAvg), p2)));
  seeds.push_back(Flatten(EncodeFrame(FingerprintMeta(0, DType::kFloat32), {})));
  seeds.push_back(
      Flatten(EncodeFrame(FingerprintMeta(9, DType::kFloat64), p8)));
  seeds.push_back(Flatten(EncodeFrame(
      AbortMeta(absl::StatusCode::kAborted, "the peer went away"), {})));

  // Mutated abort messages are often invalid UTF-8; protobuf logs each.
  google::protobuf::LogSilencer quiet;
  std::mt19937 rng(20240611);
  int ok = 0, lost = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes = seeds[rng() % seeds.size()];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      // Bias towards the length prefix and the header, where parsing happens.
      const size_t limit = (rng() % 2 == 0) ? std::min<size_t>(bytes.size(), 40)
                                            : bytes.size();
      const size_t at = rng() % limit;
      bytes[at] = static_cast<char>(bytes[at] ^ (1 + rng() % 255));
    }
    switch (rng() % 6) {
      case 0:
        bytes.resize(rng() % (bytes.size() + 1));
        break;
      case 1:
        bytes.append(1 + rng() % 8, static_cast<char>(rng()));
        break;
      default:
        break;
    }
    std::vector<size_t> pattern = {1 + rng() % 13, 1 + rng() % 5,
                                   1 + rng() % 64};
    const bool one_slice = rng() % 2 == 0;
    Resliced r = ResliceExactly(bytes, pattern);
    absl::StatusOr<InFrame> f =
        DecodeFrame(one_slice ? OneSlice(bytes) : r.buffer);
    if (f.ok()) {
      ++ok;
      const FrameMeta& m = f->meta;
      const int kind = static_cast<int>(m.kind);
      const int phase = static_cast<int>(m.phase);
      ASSERT_TRUE(kind >= 1 && kind <= 3) << "iteration " << iter;
      ASSERT_TRUE(phase >= 1 && phase <= kMaxPhase) << "iteration " << iter;
      ASSERT_TRUE(IsValidDType(static_cast<int>(m.dtype))) << iter;
      ASSERT_TRUE(IsValidReduceOp(static_cast<int>(m.op))) << iter;
      const uint64_t expected =
          m.kind == FrameKind::kAbort ? 0 : m.count * DTypeSize(m.dtype);
      ASSERT_EQ(f->PayloadBytes(), expected) << "iteration " << iter;
      ASSERT_LE(m.message.size(), 4096u);
      // Touch every payload byte.
      EXPECT_EQ(Concat(*f).size(), expected);
    } else {
      ++lost;
      ASSERT_EQ(f.status().code(), absl::StatusCode::kDataLoss)
          << "iteration " << iter << ": " << f.status();
    }
  }
  // Both outcomes actually happen, so the loop exercised something.
  EXPECT_GT(ok, 0);
  EXPECT_GT(lost, 0);
}

}  // namespace
}  // namespace halka
