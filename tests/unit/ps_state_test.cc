// PsState without gRPC: frames in, frames to send out.
#include "server/ps_state.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/frame.h"

namespace halka {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr uint64_t kGeneration = 7;

Fingerprint MakeFp(uint64_t op_seq, uint64_t count,
                   DType dtype = DType::kFloat32,
                   ReduceOp op = ReduceOp::kSum) {
  Fingerprint fp;
  fp.op_seq = op_seq;
  fp.kind = OpKind::kAllReduce;
  fp.dtype = dtype;
  fp.count = count;
  fp.op = op;
  fp.algorithm = Algorithm::kParameterServer;
  return fp;
}

InFrame FpFrame(int rank, const Fingerprint& fp) {
  InFrame f;
  f.meta.kind = FrameKind::kFingerprint;
  f.meta.generation = kGeneration;
  f.meta.op_seq = fp.op_seq;
  f.meta.fingerprint = fp;
  f.meta.origin_rank = rank;
  f.meta.sender_rank = rank;
  return f;
}

// A PS_PUSH frame of float32 values whose payload lives in the frame.
InFrame DataFrame(int rank, uint64_t op_seq, uint64_t offset,
                  std::vector<float> values, int segment = 0) {
  InFrame f;
  f.meta.kind = FrameKind::kData;
  f.meta.generation = kGeneration;
  f.meta.op_seq = op_seq;
  f.meta.phase = Phase::kPsPush;
  f.meta.segment = segment;
  f.meta.offset = offset;
  f.meta.count = values.size();
  f.meta.dtype = DType::kFloat32;
  f.meta.sender_rank = rank;
  auto owned = std::make_shared<std::vector<float>>(std::move(values));
  if (!owned->empty()) {
    f.pieces.push_back(absl::MakeConstSpan(
        reinterpret_cast<const uint8_t*>(owned->data()),
        owned->size() * sizeof(float)));
  }
  f.keepalive = owned;
  return f;
}

std::vector<float> Floats(const PsSend& send) {
  std::vector<float> out(send.payload->size() / sizeof(float));
  std::memcpy(out.data(), send.payload->data(), send.payload->size());
  return out;
}

// A state with `world` connected ranks.
PsState Connected(int world, int shard = 0, int shards = 1) {
  PsState state(shard, shards);
  for (int r = 0; r < world; ++r) state.StreamOpened(r);
  return state;
}

void SendFingerprints(PsState& state, int world, const Fingerprint& fp) {
  for (int r = 0; r < world; ++r) {
    ASSERT_THAT(state.OnFrame(r, world, FpFrame(r, fp)), SizeIs(0));
  }
}

TEST(PsStateTest, ReducesInRankOrderWhateverTheArrivalOrder) {
  // In float32, (1e8 + 1) - 1e8 == 0 but (1e8 - 1e8) + 1 == 1: only rank
  // order 0, 1, 2 gives 0.
  PsState state = Connected(3);
  SendFingerprints(state, 3, MakeFp(1, 2));
  EXPECT_THAT(state.OnFrame(2, 3, DataFrame(2, 1, 0, {-1e8f, 3})), SizeIs(0));
  EXPECT_THAT(state.OnFrame(1, 3, DataFrame(1, 1, 0, {1, 2})), SizeIs(0));
  std::vector<PsSend> out = state.OnFrame(0, 3, DataFrame(0, 1, 0, {1e8f, 1}));
  ASSERT_THAT(out, SizeIs(1));
  EXPECT_THAT(out[0].to, ElementsAre(0, 1, 2));
  const FrameMeta& m = out[0].meta;
  EXPECT_EQ(m.kind, FrameKind::kData);
  EXPECT_EQ(m.phase, Phase::kPsPull);
  EXPECT_EQ(m.generation, kGeneration);
  EXPECT_EQ(m.op_seq, 1u);
  EXPECT_EQ(m.offset, 0u);
  EXPECT_EQ(m.count, 2u);
  EXPECT_EQ(m.sender_rank, -1);
  EXPECT_THAT(Floats(out[0]), ElementsAre(0.0f, 6.0f));
  EXPECT_EQ(state.stats().bytes_in, 3 * 2 * sizeof(float));
  EXPECT_EQ(state.stats().bytes_out, 3 * 2 * sizeof(float));
}

TEST(PsStateTest, AverageDividesByTheWorldSize) {
  PsState state = Connected(4);
  SendFingerprints(state, 4, MakeFp(1, 1, DType::kFloat32, ReduceOp::kAvg));
  std::vector<PsSend> out;
  for (int r = 0; r < 4; ++r) {
    out = state.OnFrame(r, 4, DataFrame(r, 1, 0, {static_cast<float>(r + 1)}));
  }
  ASSERT_THAT(out, SizeIs(1));
  EXPECT_THAT(Floats(out[0]), ElementsAre(2.5f));
}

TEST(PsStateTest, EachChunkLeavesOnceEveryRankSentIt) {
  // Every rank sends its chunks in offset order (one stream each).
  PsState state = Connected(2);
  SendFingerprints(state, 2, MakeFp(1, 4));
  EXPECT_THAT(state.OnFrame(0, 2, DataFrame(0, 1, 0, {3, 3})), SizeIs(0));
  EXPECT_THAT(state.OnFrame(0, 2, DataFrame(0, 1, 2, {1, 1})), SizeIs(0));
  std::vector<PsSend> out = state.OnFrame(1, 2, DataFrame(1, 1, 0, {4, 4}));
  ASSERT_THAT(out, SizeIs(1));
  EXPECT_EQ(out[0].meta.offset, 0u);
  EXPECT_THAT(Floats(out[0]), ElementsAre(7.0f, 7.0f));
  EXPECT_EQ(state.ops_in_flight(), 1u);
  out = state.OnFrame(1, 2, DataFrame(1, 1, 2, {2, 2}));
  ASSERT_THAT(out, SizeIs(1));
  EXPECT_EQ(out[0].meta.offset, 2u);
  EXPECT_THAT(Floats(out[0]), ElementsAre(3.0f, 3.0f));
  EXPECT_EQ(state.ops_in_flight(), 0u);
}

TEST(PsStateTest, ACompletedOpIsFreedAndTheNextOneRuns) {
  PsState state = Connected(2);
  for (uint64_t seq : {1, 2}) {
    SendFingerprints(state, 2, MakeFp(seq, 1));
    EXPECT_EQ(state.ops_in_flight(), 1u);
    EXPECT_THAT(state.OnFrame(0, 2, DataFrame(0, seq, 0, {1})), SizeIs(0));
    std::vector<PsSend> out = state.OnFrame(1, 2, DataFrame(1, seq, 0, {2}));
    ASSERT_THAT(out, SizeIs(1));
    EXPECT_EQ(out[0].meta.op_seq, seq);
    EXPECT_THAT(Floats(out[0]), ElementsAre(3.0f));
    EXPECT_EQ(state.ops_in_flight(), 0u);
    EXPECT_EQ(state.stats().ops_completed, seq);
  }
  EXPECT_EQ(state.stats().ops_failed, 0u);
}

TEST(PsStateTest, AnEmptyShardCompletesOnFingerprintsAlone) {
  // 1 element over 2 shards: shard 1 owns nothing.
  PsState state = Connected(2, /*shard=*/1, /*shards=*/2);
  SendFingerprints(state, 2, MakeFp(1, 1));
  EXPECT_EQ(state.ops_in_flight(), 0u);
  EXPECT_EQ(state.stats().ops_completed, 1u);
}

TEST(PsStateTest, AShardTakesOnlyItsSegment) {
  // 5 elements over 2 shards: shard 1 owns offsets 3 and 4.
  PsState state = Connected(2, /*shard=*/1, /*shards=*/2);
  SendFingerprints(state, 2, MakeFp(1, 5));
  EXPECT_THAT(state.OnFrame(0, 2, DataFrame(0, 1, 3, {1, 2}, 1)), SizeIs(0));
  std::vector<PsSend> out = state.OnFrame(1, 2, DataFrame(1, 1, 3, {1, 2}, 1));
  ASSERT_THAT(out, SizeIs(1));
  EXPECT_EQ(out[0].meta.segment, 1);
  EXPECT_THAT(Floats(out[0]), ElementsAre(2.0f, 4.0f));

  SendFingerprints(state, 2, MakeFp(2, 5));
  out = state.OnFrame(0, 2, DataFrame(0, 2, 2, {1, 2}, 1));
  ASSERT_THAT(out, SizeIs(1));
  EXPECT_EQ(out[0].meta.abort_code, absl::StatusCode::kDataLoss);
  EXPECT_THAT(out[0].meta.message, HasSubstr("does not fit"));
}

// The ABORT a mismatch produces, as the adapter sends it.
void ExpectAbort(const std::vector<PsSend>& out, std::vector<int> to,
                 absl::StatusCode code, const std::string& message) {
  ASSERT_THAT(out, SizeIs(1));
  EXPECT_EQ(out[0].to, to);
  EXPECT_EQ(out[0].payload, nullptr);
  EXPECT_EQ(out[0].meta.kind, FrameKind::kAbort);
  EXPECT_EQ(out[0].meta.generation, kGeneration);
  EXPECT_EQ(out[0].meta.sender_rank, -1);
  EXPECT_EQ(out[0].meta.origin_rank, -1);
  EXPECT_EQ(out[0].meta.abort_code, code);
  EXPECT_EQ(out[0].meta.message, message);
}

TEST(PsStateTest, RanksThatDisagreeGetFailedPreconditionNamingBoth) {
  const Fingerprint base = MakeFp(4, 8);
  std::vector<Fingerprint> others(3, base);
  others[0].count = 9;
  others[1].dtype = DType::kInt32;
  others[2].op = ReduceOp::kMax;
  for (const Fingerprint& other : others) {
    PsState state = Connected(3);
    ASSERT_THAT(state.OnFrame(0, 3, FpFrame(0, base)), SizeIs(0));
    std::vector<PsSend> out = state.OnFrame(1, 3, FpFrame(1, other));
    ExpectAbort(out, {0, 1, 2}, absl::StatusCode::kFailedPrecondition,
                absl::StrCat("parameter server shard 0: ranks disagree on the "
                             "operation: rank 0 calls ",
                             base.ToString(), " but rank 1 calls ",
                             other.ToString()));
    EXPECT_EQ(state.ops_in_flight(), 0u);
    EXPECT_EQ(state.stats().ops_failed, 1u);
  }
}

TEST(PsStateTest, ADuplicateChunkIsRefused) {
  PsState state = Connected(2);
  SendFingerprints(state, 2, MakeFp(1, 4));
  ASSERT_THAT(state.OnFrame(0, 2, DataFrame(0, 1, 0, {1, 2})), SizeIs(0));
  ExpectAbort(state.OnFrame(0, 2, DataFrame(0, 1, 0, {1, 2})), {0, 1},
              absl::StatusCode::kDataLoss,
              "parameter server shard 0: duplicate or inconsistent chunk at "
              "offset 0 from rank 0");
  EXPECT_EQ(state.ops_in_flight(), 0u);
}

TEST(PsStateTest, AnInconsistentChunkIsRefused) {
  PsState state = Connected(2);
  SendFingerprints(state, 2, MakeFp(1, 4));
  ASSERT_THAT(state.OnFrame(0, 2, DataFrame(0, 1, 0, {1, 2})), SizeIs(0));
  ExpectAbort(state.OnFrame(1, 2, DataFrame(1, 1, 0, {1, 2, 3})), {0, 1},
              absl::StatusCode::kDataLoss,
              "parameter server shard 0: duplicate or inconsistent chunk at "
              "offset 0 from rank 1");
}

TEST(PsStateTest, AChunkOutsideTheSegmentIsRefused) {
  const Fingerprint fp = MakeFp(1, 4);
  PsState state = Connected(2);
  SendFingerprints(state, 2, fp);
  ExpectAbort(state.OnFrame(1, 2, DataFrame(1, 1, 3, {1, 2})), {0, 1},
              absl::StatusCode::kDataLoss,
              absl::StrCat("parameter server shard 0: a frame from rank 1 "
                           "does not fit ",
                           fp.ToString(), " (offset 3, count 2)"));
}

TEST(PsStateTest, DataBeforeTheFingerprintIsRefused) {
  PsState state = Connected(2);
  std::vector<PsSend> out = state.OnFrame(0, 2, DataFrame(0, 1, 0, {1}));
  ASSERT_THAT(out, SizeIs(1));
  EXPECT_EQ(out[0].meta.abort_code, absl::StatusCode::kDataLoss);
  EXPECT_EQ(state.ops_in_flight(), 0u);
}

TEST(PsStateTest, ASecondFingerprintIsRefused) {
  PsState state = Connected(2);
  const Fingerprint fp = MakeFp(1, 4);
  ASSERT_THAT(state.OnFrame(0, 2, FpFrame(0, fp)), SizeIs(0));
  ExpectAbort(state.OnFrame(0, 2, FpFrame(0, fp)), {0, 1},
              absl::StatusCode::kDataLoss,
              "parameter server shard 0: a second fingerprint from rank 0");
}

TEST(PsStateTest, ARankOutsideTheOperationsWorldIsRefused) {
  PsState state = Connected(3);
  ASSERT_THAT(state.OnFrame(0, 2, FpFrame(0, MakeFp(1, 4))), SizeIs(0));
  ExpectAbort(state.OnFrame(2, 3, FpFrame(2, MakeFp(1, 4))), {0, 1},
              absl::StatusCode::kDataLoss,
              "parameter server shard 0: rank 2 joined an operation of world "
              "size 2");
}

TEST(PsStateTest, AnAbortFromARankGoesToTheOthers) {
  PsState state = Connected(3);
  SendFingerprints(state, 3, MakeFp(1, 4));
  InFrame abort;
  abort.meta.kind = FrameKind::kAbort;
  abort.meta.op_seq = 1;
  abort.meta.abort_code = absl::StatusCode::kOk;
  abort.meta.message = "rank 1 gave up";
  ExpectAbort(state.OnFrame(1, 3, std::move(abort)), {0, 2},
              absl::StatusCode::kAborted, "rank 1 gave up");
  EXPECT_EQ(state.ops_in_flight(), 0u);
}

TEST(PsStateTest, AClosedStreamFailsEveryOpOnTheOtherRanks) {
  PsState state = Connected(3);
  SendFingerprints(state, 3, MakeFp(1, 4));
  ASSERT_THAT(state.OnFrame(0, 3, FpFrame(0, MakeFp(2, 4))), SizeIs(0));
  std::vector<PsSend> out = state.StreamClosed(1);
  ASSERT_THAT(out, SizeIs(2));
  for (const PsSend& send : out) {
    EXPECT_THAT(send.to, ElementsAre(0, 2));
    EXPECT_EQ(send.meta.abort_code, absl::StatusCode::kUnavailable);
    EXPECT_EQ(send.meta.message,
              "parameter server shard 0: the stream of rank 1 closed in the "
              "middle of the operation");
  }
  EXPECT_EQ(state.ops_in_flight(), 0u);
  EXPECT_EQ(state.stats().ops_failed, 2u);
  // Results skip a rank that is not connected.
  SendFingerprints(state, 3, MakeFp(3, 1));
  std::vector<PsSend> result;
  for (int r = 0; r < 3; ++r) result = state.OnFrame(r, 3, DataFrame(r, 3, 0, {1}));
  ASSERT_THAT(result, SizeIs(1));
  EXPECT_THAT(result[0].to, ElementsAre(0, 2));
  EXPECT_EQ(state.stats().bytes_out, 2 * sizeof(float));
}

}  // namespace
}  // namespace halka
