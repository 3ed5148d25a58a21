// The test data and the reference check: a rank's data made a block at a
// time is the data made at once, and AllReduceReference (made block-wise,
// what halkactl checks its all-reduces against) finds what the
// whole-buffer check finds.
#include "core/testing/reference.h"

#include <algorithm>
#include <cstdint>
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
      EXPECT_NE(MakeRankData(dt, op, n, 3, 8), whole) << DTypeName(dt);
    }
  }
}

// The data itself does not change (results recorded in docs and notes were
// checked against it): the first elements as the generator made them
// before it was cut into blocks.
TEST(ReferenceTest, TheDataIsWhatItWas) {
  const std::vector<uint8_t> f =
      MakeRankData(DType::kFloat32, ReduceOp::kSum, 4, 1, 99);
  const float want_f[] = {1.44388294f, 1.40491462f, 0.998732388f, 1.41908133f};
  for (int i = 0; i < 4; ++i) {
    float x;
    std::memcpy(&x, f.data() + 4 * i, 4);
    EXPECT_EQ(x, want_f[i]) << i;
  }
  const std::vector<uint8_t> p =
      MakeRankData(DType::kInt32, ReduceOp::kProd, 4, 2, 99);
  const int32_t want_p[] = {-1, 0, -2, 1};
  for (int i = 0; i < 4; ++i) {
    int32_t x;
    std::memcpy(&x, p.data() + 4 * i, 4);
    EXPECT_EQ(x, want_p[i]) << i;
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
  const AllReduceReference reference(DType::kFloat32, ReduceOp::kSum, g, 11,
                                     n);
  CheckResult blocks = reference.Check(result.data());
  EXPECT_EQ(whole.wrong, 0u) << whole.first;
  EXPECT_EQ(blocks.wrong, 0u) << blocks.first;
  // Two wrong elements, one in the second block: both checks count them
  // and name the first by its place in the whole buffer.
  result[66000] += 1.0f;
  result[66001] = -result[66001];
  whole =
      CheckAllReduce(DType::kFloat32, ReduceOp::kSum, inputs, result.data(), n);
  blocks = reference.Check(result.data());
  EXPECT_EQ(whole.wrong, 2u);
  EXPECT_EQ(blocks.wrong, 2u);
  EXPECT_EQ(blocks.first, whole.first);
  EXPECT_NE(blocks.first.find("element 66000:"), std::string::npos)
      << blocks.first;
  // Checked against the wrong inputs (another seed), nearly every element
  // is wrong.
  EXPECT_GT(AllReduceReference(DType::kFloat32, ReduceOp::kSum, g, 12, n)
                .Check(result.data())
                .wrong,
            n / 2);
}

// Integers and other operations: the reference makes each rank's data for
// the dtype and operation it is given.
TEST(ReferenceTest, TheBlockwiseCheckOfIntegersAndOtherOps) {
  const int g = 3;
  const size_t n = (size_t{1} << 16) + 77;
  for (ReduceOp op : {ReduceOp::kProd, ReduceOp::kMax}) {
    const std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(DType::kInt32, op, n, g, 5);
    std::vector<int32_t> result(n);
    for (size_t i = 0; i < n; ++i) {
      int64_t acc = op == ReduceOp::kProd ? 1 : INT64_MIN;
      for (int r = 0; r < g; ++r) {
        const auto v = static_cast<int64_t>(ElementAsDouble(
            DType::kInt32, inputs[static_cast<size_t>(r)].data(), i));
        acc = op == ReduceOp::kProd ? acc * v : std::max(acc, v);
      }
      result[i] = static_cast<int32_t>(acc);
    }
    const AllReduceReference reference(DType::kInt32, op, g, 5, n);
    EXPECT_EQ(reference.Check(result.data()).wrong, 0u) << ReduceOpName(op);
    result[n - 1] += 1;
    EXPECT_EQ(reference.Check(result.data()).wrong, 1u) << ReduceOpName(op);
  }
  // The 8-bit types wrap, and a bool's SUM is an or: kept in the dtype
  // (one byte an element), judged as the whole-buffer check judges.
  for (DType dt : {DType::kInt8, DType::kBool}) {
    const std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(dt, ReduceOp::kSum, n, g, 6);
    std::vector<uint8_t> result(n);
    for (size_t i = 0; i < n; ++i) {
      int sum = 0;
      for (int r = 0; r < g; ++r) {
        sum += dt == DType::kBool
                   ? inputs[static_cast<size_t>(r)][i] != 0
                   : static_cast<int8_t>(inputs[static_cast<size_t>(r)][i]);
      }
      result[i] = dt == DType::kBool ? (sum != 0 ? 1 : 0)
                                     : static_cast<uint8_t>(sum & 0xff);
    }
    const AllReduceReference reference(dt, ReduceOp::kSum, g, 6, n);
    EXPECT_EQ(reference.Check(result.data()).wrong, 0u) << DTypeName(dt);
    EXPECT_EQ(CheckAllReduce(dt, ReduceOp::kSum, inputs, result.data(), n).wrong,
              0u)
        << DTypeName(dt);
    result[7] = static_cast<uint8_t>(result[7] ^ 1);
    EXPECT_EQ(reference.Check(result.data()).wrong, 1u) << DTypeName(dt);
    EXPECT_EQ(CheckAllReduce(dt, ReduceOp::kSum, inputs, result.data(), n).wrong,
              1u)
        << DTypeName(dt);
  }
}

}  // namespace
}  // namespace halka
