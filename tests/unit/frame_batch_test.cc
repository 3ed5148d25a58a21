// Messages of several frames (DecodeFrames): what a gRPC stream whose peer
// agreed to batches carries.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "codec/frame_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "tests/testing/data_meta.h"
#include "tests/testing/frame_samples.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::AbortMeta;
using halka::testing::DataChunkMeta;
using halka::testing::FingerprintMeta;
using halka::testing::Flatten;

// `bytes` copied into slices of `piece` bytes (the last shorter).
grpc::ByteBuffer Pieces(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t pos = 0; pos < bytes.size(); pos += piece) {
    slices.emplace_back(bytes.data() + pos, std::min(piece, bytes.size() - pos));
  }
  if (slices.empty()) slices.emplace_back();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Payload(size_t n, uint8_t seed) {
  std::string p(n, '\0');
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(seed + i * 7);
  return p;
}

std::string Bytes(const InFrame& f) {
  std::string out;
  for (const auto& p : f.pieces) out.append(p.begin(), p.end());
  return out;
}

FrameMeta Data(uint64_t count, DType dtype, int step) {
  FrameMeta m = DataChunkMeta(4, 17, Phase::kReduceScatter, step, count);
  m.dtype = dtype;
  return m;
}

// A fingerprint, two data frames (float32, bf16) and an ABORT, back to back.
struct Batch {
  std::string wire;
  std::vector<FrameMeta> metas;
  std::vector<std::string> payloads;
};
Batch FourFrames() {
  Batch b;
  b.metas = {FingerprintMeta(0, DType::kFloat32),
             Data(1000, DType::kFloat32, 0), Data(33, DType::kBFloat16, 1),
             AbortMeta(absl::StatusCode::kDeadlineExceeded, "rank 2 is late")};
  b.payloads = {"", Payload(4000, 3), Payload(66, 9), ""};
  for (size_t i = 0; i < b.metas.size(); ++i) {
    b.wire += Flatten(EncodeFrame(
        b.metas[i],
        absl::MakeConstSpan(
            reinterpret_cast<const uint8_t*>(b.payloads[i].data()),
            b.payloads[i].size())));
  }
  return b;
}

TEST(FrameBatchTest, EveryFrameComesOutInOrderWhateverTheSlices) {
  const Batch b = FourFrames();
  for (size_t piece : {size_t{1}, size_t{3}, size_t{17}, size_t{4096},
                       b.wire.size()}) {
    SCOPED_TRACE(absl::StrCat("slices of ", piece, " bytes"));
    absl::StatusOr<std::vector<InFrame>> frames =
        DecodeFrames(Pieces(b.wire, piece));
    ASSERT_TRUE(frames.ok()) << frames.status();
    ASSERT_EQ(frames->size(), b.metas.size());
    for (size_t i = 0; i < b.metas.size(); ++i) {
      const InFrame& f = (*frames)[i];
      EXPECT_EQ(f.meta.kind, b.metas[i].kind) << i;
      EXPECT_EQ(f.meta.step, b.metas[i].step) << i;
      EXPECT_EQ(f.meta.count, b.metas[i].count) << i;
      EXPECT_EQ(f.meta.dtype, b.metas[i].dtype) << i;
      EXPECT_TRUE(f.meta.fingerprint == b.metas[i].fingerprint) << i;
      EXPECT_EQ(f.meta.message, b.metas[i].message) << i;
      EXPECT_EQ(Bytes(f), b.payloads[i]) << i;
      EXPECT_NE(f.keepalive, nullptr) << i;
    }
  }
}

TEST(FrameBatchTest, OneFrameIsABatchOfOne) {
  const std::string p = Payload(400, 1);
  const std::string wire = Flatten(EncodeFrame(
      Data(100, DType::kFloat32, 2),
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(p.data()),
                          p.size())));
  absl::StatusOr<std::vector<InFrame>> frames = DecodeFrames(Pieces(wire, 64));
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_EQ(frames->size(), 1u);
  EXPECT_EQ(Bytes((*frames)[0]), p);
}

TEST(FrameBatchTest, ASingleFrameLinkRefusesABatch) {
  // A peer that did not agree to batches reads one frame per message: the
  // second frame is bytes beyond the first one's payload.
  absl::StatusOr<InFrame> f = DecodeFrame(Pieces(FourFrames().wire, 512));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(f.status().message(), HasSubstr("does not match count"));
}

TEST(FrameBatchTest, ACutOrPaddedBatchNamesTheFrame) {
  const Batch b = FourFrames();
  // Cut inside the third frame's payload.
  const size_t third_end = b.wire.size() - Flatten(EncodeFrame(b.metas.back(), {})).size();
  for (size_t cut : {third_end - 1, third_end - 40}) {
    absl::StatusOr<std::vector<InFrame>> frames =
        DecodeFrames(Pieces(b.wire.substr(0, cut), 100));
    ASSERT_FALSE(frames.ok()) << cut;
    EXPECT_EQ(frames.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(frames.status().message(), HasSubstr("frame 3 of a message"));
  }
  // Bytes after the last frame that are not a frame.
  for (const std::string& tail : {std::string("z"), std::string("\x01\0\0", 3),
                                  std::string("\x05\0\0\0zzzzz", 9)}) {
    absl::StatusOr<std::vector<InFrame>> frames =
        DecodeFrames(Pieces(b.wire + tail, 100));
    ASSERT_FALSE(frames.ok()) << tail.size();
    EXPECT_EQ(frames.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(frames.status().message(), HasSubstr("frame 5 of a message"));
  }
  // Nothing at all.
  absl::StatusOr<std::vector<InFrame>> none = DecodeFrames(Pieces("", 1));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDataLoss);
}

TEST(FrameBatchTest, AtMostTheLimitOfFramesPerMessage) {
  const std::string one = Flatten(EncodeFrame(FingerprintMeta(0, DType::kInt32), {}));
  std::string at_limit;
  for (size_t i = 0; i < kMaxFramesPerMessage; ++i) at_limit += one;
  absl::StatusOr<std::vector<InFrame>> frames =
      DecodeFrames(Pieces(at_limit, 1 << 20));
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ(frames->size(), kMaxFramesPerMessage);
  absl::StatusOr<std::vector<InFrame>> over =
      DecodeFrames(Pieces(at_limit + one, 1 << 20));
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(over.status().message(),
              HasSubstr(absl::StrCat("more than ", kMaxFramesPerMessage)));
}

}  // namespace
}  // namespace halka
