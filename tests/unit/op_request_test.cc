// The SDK request rules of all-gather and reduce-scatter (worker/op_request):
// which buffer a call works on, what an inline call uploads and gets back.
#include "worker/op_request.h"

#include "gtest/gtest.h"

namespace halka {
namespace {

v1::OpSpec Spec(v1::OpKind kind, uint64_t count, uint64_t recv_count) {
  v1::OpSpec spec;
  spec.set_kind(kind);
  spec.set_dtype(v1::FLOAT64);
  spec.set_op(v1::SUM);
  spec.set_count(count);
  spec.set_recv_count(recv_count);
  return spec;
}

TEST(SliceRequests, TheBufferHoldsTheLargerCount) {
  // All-gather: 5 per rank into 20; reduce-scatter: 20 into 5 per rank.
  const v1::OpSpec gather = Spec(v1::ALL_GATHER, 5, 20);
  const v1::OpSpec scatter = Spec(v1::REDUCE_SCATTER, 20, 5);
  EXPECT_EQ(BufferCount(gather), 20u);
  EXPECT_EQ(BufferCount(scatter), 20u);
  EXPECT_EQ(ValidateOpSpec(gather, 1 << 20).value(), 160u);
  EXPECT_EQ(ValidateOpSpec(scatter, 1 << 20).value(), 160u);
  // Counts that fit no world still get a buffer large enough for both:
  // the communicator names the world when the call runs.
  EXPECT_EQ(BufferCount(Spec(v1::ALL_GATHER, 7, 3)), 7u);
  // recv_count means nothing to an all-reduce.
  EXPECT_EQ(BufferCount(Spec(v1::ALL_REDUCE, 7, 1000)), 7u);
}

TEST(SliceRequests, InlineUploadsTheInputAndRepliesTheResult) {
  const v1::OpSpec gather = Spec(v1::ALL_GATHER, 5, 20);
  EXPECT_EQ(InlineUploadBytes(gather, 160), 40u);
  const ByteRange all = InlineReplyRange(gather, 2, 160);
  EXPECT_EQ(all.offset, 0u);
  EXPECT_EQ(all.size, 160u);
  const v1::OpSpec scatter = Spec(v1::REDUCE_SCATTER, 20, 5);
  EXPECT_EQ(InlineUploadBytes(scatter, 160), 160u);
  const ByteRange mine = InlineReplyRange(scatter, 3, 160);
  EXPECT_EQ(mine.offset, 120u);
  EXPECT_EQ(mine.size, 40u);
  // A rank whose slice lies outside the buffer gets nothing, not memory
  // past its end.
  EXPECT_EQ(InlineReplyRange(scatter, 4, 160).size, 0u);
  EXPECT_EQ(InlineReplyRange(scatter, -1, 160).size, 0u);
}

TEST(SliceRequests, BadFieldsAreRefused) {
  v1::OpSpec no_op = Spec(v1::REDUCE_SCATTER, 20, 5);
  no_op.clear_op();
  EXPECT_EQ(ValidateOpSpec(no_op, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::OpSpec algo = Spec(v1::ALL_GATHER, 5, 20);
  algo.set_algorithm(static_cast<v1::Algorithm>(9));
  EXPECT_EQ(ValidateOpSpec(algo, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The larger count is what the limit bounds.
  EXPECT_EQ(ValidateOpSpec(Spec(v1::ALL_GATHER, 1, uint64_t{1} << 40), 1 << 20)
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(RootedRequests, BuffersUploadsAndRepliesFollowTheRoot) {
  v1::OpSpec reduce = Spec(v1::REDUCE, 6, 0);
  reduce.set_root(2);
  EXPECT_EQ(ValidateOpSpec(reduce, 1 << 20).value(), 48u);
  EXPECT_EQ(InlineUploadBytes(reduce, 48), 48u);
  // The root gets the result back; every other rank nothing.
  EXPECT_EQ(InlineReplyRange(reduce, 2, 48).size, 48u);
  EXPECT_EQ(InlineReplyRange(reduce, 0, 48).size, 0u);
  v1::OpSpec gather = Spec(v1::GATHER, 5, 20);
  gather.set_root(1);
  EXPECT_EQ(ValidateOpSpec(gather, 1 << 20).value(), 160u);
  EXPECT_EQ(InlineUploadBytes(gather, 160), 40u);  // the contribution
  EXPECT_EQ(InlineReplyRange(gather, 1, 160).size, 160u);
  EXPECT_EQ(InlineReplyRange(gather, 3, 160).size, 0u);
  EXPECT_FALSE(InlineUploadMayBeEmpty(gather));
  v1::OpSpec scatter = Spec(v1::SCATTER, 20, 5);
  EXPECT_EQ(ValidateOpSpec(scatter, 1 << 20).value(), 160u);
  EXPECT_EQ(InlineUploadBytes(scatter, 160), 160u);
  EXPECT_TRUE(InlineUploadMayBeEmpty(scatter));  // a non-root sends none
  const ByteRange mine = InlineReplyRange(scatter, 3, 160);
  EXPECT_EQ(mine.offset, 120u);
  EXPECT_EQ(mine.size, 40u);
  EXPECT_EQ(InlineReplyRange(scatter, 4, 160).size, 0u);
  const v1::OpSpec a2a = Spec(v1::ALL_TO_ALL, 20, 20);
  EXPECT_EQ(ValidateOpSpec(a2a, 1 << 20).value(), 160u);
  EXPECT_EQ(InlineReplyRange(a2a, 1, 160).size, 160u);
}

TEST(RootedRequests, BadFieldsAreRefused) {
  v1::OpSpec neg = Spec(v1::SCATTER, 20, 5);
  neg.set_root(-1);
  EXPECT_EQ(ValidateOpSpec(neg, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::OpSpec no_op = Spec(v1::REDUCE, 20, 0);
  no_op.clear_op();
  EXPECT_EQ(ValidateOpSpec(no_op, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::OpSpec bool_avg = Spec(v1::REDUCE, 20, 0);
  bool_avg.set_dtype(v1::BOOL);
  bool_avg.set_op(v1::AVG);
  EXPECT_EQ(ValidateOpSpec(bool_avg, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  const v1::OpSpec a2a = Spec(v1::ALL_TO_ALL, 20, 10);
  EXPECT_EQ(ValidateOpSpec(a2a, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::OpSpec unknown = Spec(v1::ALL_TO_ALL, 20, 20);
  unknown.set_kind(static_cast<v1::OpKind>(v1::OpKind_MAX + 1));
  EXPECT_EQ(ValidateOpSpec(unknown, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace halka
