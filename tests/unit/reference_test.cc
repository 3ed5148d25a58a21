// The test data and the reference check: a rank's data made a block at a
// time is the data made at once, and the block-wise check of an all-reduce
// finds what the whole-buffer check finds (halkactl checks large buffers
// block-wise).
#include "core/testing/reference.h"

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"

namespace halka {
namespace {

TEST(ReferenceTest, ARanksDataMadeInBlocksIsItsDataMadeAtOnce) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kInt32,
                   DType::kInt8, DType::kBool}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd}) {
      const size_t n = 1000;
      const std::vector<uint8_t> whole = MakeRankData(dt, op, n, 3, 7);
      std::vector<uint8_t> parts(whole.size());
      RankDataStream s(dt, op, 3, 7);
      const size_t es = DTypeSize(dt);
      size_t at = 0;
      for (size_t block : {1, 7, 256, 736}) {
        s.Fill(parts.data() + at * es, block);
        at += block;
      }
      ASSERT_EQ(at, n);
      EXPECT_EQ(parts, whole) << DTypeName(dt) << " " << ReduceOpName(op);
      // Another rank or seed makes other data.
      EXPECT_NE(MakeRankData(dt, op, n, 4, 7), whole) << DTypeName(dt);
    }
  }
}

TEST(ReferenceTest, TheBlockwiseCheckFindsWhatTheWholeCheckFinds) {
  const int g = 5;
  // Past one block (64 Ki elements) and not a multiple of it.
  const size_t n = (size_t{1} << 16) + 1234;
  const std::vector<std::vector<uint8_t>> inputs =
      MakeRanksData(DType::kFloat32, ReduceOp::kSum, n, g, 11);
  // The float64 sum rounded to float32: the right answer.
  std::vector<float> result(n);
  for (size_t i = 0; i < n; ++i) {
    double acc = 0;
    for (int r = 0; r < g; ++r) {
      acc += ElementAsDouble(DType::kFloat32,
                             inputs[static_cast<size_t>(r)].data(), i);
    }
    result[i] = static_cast<float>(acc);
  }
  CheckResult whole =
      CheckAllReduce(DType::kFloat32, ReduceOp::kSum, inputs, result.data(), n);
  CheckResult blocks = CheckAllReduceOfRankData(
      DType::kFloat32, ReduceOp::kSum, g, 11, result.data(), n);
  EXPECT_EQ(whole.wrong, 0u) << whole.first;
  EXPECT_EQ(blocks.wrong, 0u) << blocks.first;
  // Two wrong elements, one in the second block: both checks count them
  // and name the first by its place in the whole buffer.
  result[66000] += 1.0f;
  result[66001] = -result[66001];
  whole =
      CheckAllReduce(DType::kFloat32, ReduceOp::kSum, inputs, result.data(), n);
  blocks = CheckAllReduceOfRankData(DType::kFloat32, ReduceOp::kSum, g, 11,
                                    result.data(), n);
  EXPECT_EQ(whole.wrong, 2u);
  EXPECT_EQ(blocks.wrong, 2u);
  EXPECT_EQ(blocks.first, whole.first);
  EXPECT_NE(blocks.first.find("element 66000:"), std::string::npos)
      << blocks.first;
  // Checked against the wrong inputs (another seed), nearly every element
  // is wrong.
  EXPECT_GT(CheckAllReduceOfRankData(DType::kFloat32, ReduceOp::kSum, g, 12,
                                     result.data(), n)
                .wrong,
            n / 2);
}

}  // namespace
}  // namespace halka
