#include "core/dtype.h"

#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace halka {
namespace {

TEST(DTypeTest, Sizes) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kInt32), 4u);
  EXPECT_EQ(DTypeSize(DType::kInt64), 8u);
  EXPECT_EQ(DTypeSize(DType::kInt8), 1u);
  EXPECT_EQ(DTypeSize(DType::kUInt8), 1u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeSize(DType::kInt16), 2u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(0)), 0u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(11)), 0u);
}

TEST(DTypeTest, Validity) {
  EXPECT_FALSE(IsValidDType(0));
  for (int v = 1; v <= 10; ++v) EXPECT_TRUE(IsValidDType(v)) << v;
  EXPECT_FALSE(IsValidDType(11));
  EXPECT_FALSE(IsValidDType(-1));
  EXPECT_FALSE(IsValidDType(256 + 1));  // must not be truncated to uint8

  EXPECT_FALSE(IsValidReduceOp(0));
  for (int v = 1; v <= 5; ++v) EXPECT_TRUE(IsValidReduceOp(v)) << v;
  EXPECT_FALSE(IsValidReduceOp(6));
  EXPECT_FALSE(IsValidReduceOp(-3));
  EXPECT_FALSE(IsValidReduceOp(256 + 1));

  // The all-lists cover exactly the valid values.
  for (DType d : kAllDTypes) EXPECT_TRUE(IsValidDType(static_cast<int>(d)));
  for (ReduceOp op : kAllReduceOps) {
    EXPECT_TRUE(IsValidReduceOp(static_cast<int>(op)));
  }
  EXPECT_EQ(std::size(kAllDTypes), 10u);
  EXPECT_EQ(std::size(kAllReduceOps), 5u);
}

TEST(DTypeTest, FloatingPoint) {
  EXPECT_TRUE(IsFloatingPoint(DType::kFloat32));
  EXPECT_TRUE(IsFloatingPoint(DType::kFloat64));
  EXPECT_TRUE(IsFloatingPoint(DType::kFloat16));
  EXPECT_TRUE(IsFloatingPoint(DType::kBFloat16));
  EXPECT_FALSE(IsFloatingPoint(DType::kInt32));
  EXPECT_FALSE(IsFloatingPoint(DType::kInt64));
  EXPECT_FALSE(IsFloatingPoint(DType::kInt8));
  EXPECT_FALSE(IsFloatingPoint(DType::kBool));
  EXPECT_FALSE(IsFloatingPoint(static_cast<DType>(0)));
}

TEST(DTypeTest, AvgIsRefusedForBoolOnly) {
  for (DType d : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      const absl::Status s = CheckReduction(d, op);
      if (d == DType::kBool && op == ReduceOp::kAvg) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_TRUE(absl::StrContains(s.message(), "avg is not defined for bool"))
            << s;
      } else {
        EXPECT_TRUE(s.ok()) << DTypeName(d) << " " << ReduceOpName(op) << s;
      }
    }
  }
}

TEST(DTypeTest, Names) {
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_EQ(DTypeName(DType::kFloat64), "float64");
  EXPECT_EQ(DTypeName(DType::kFloat16), "float16");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeName(DType::kInt32), "int32");
  EXPECT_EQ(DTypeName(DType::kInt64), "int64");
  EXPECT_EQ(DTypeName(static_cast<DType>(42)), "unknown");

  EXPECT_EQ(ReduceOpName(ReduceOp::kSum), "sum");
  EXPECT_EQ(ReduceOpName(ReduceOp::kAvg), "avg");
  EXPECT_EQ(ReduceOpName(ReduceOp::kMin), "min");
  EXPECT_EQ(ReduceOpName(ReduceOp::kMax), "max");
  EXPECT_EQ(ReduceOpName(ReduceOp::kProd), "prod");
  EXPECT_EQ(ReduceOpName(static_cast<ReduceOp>(0)), "unknown");
}

TEST(DTypeTest, ParseCanonicalNamesRoundTrip) {
  for (DType d : kAllDTypes) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, d);
  }
  for (ReduceOp op : kAllReduceOps) {
    absl::StatusOr<ReduceOp> parsed = ParseReduceOp(ReduceOpName(op));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, op);
  }
}

TEST(DTypeTest, ParseAliasesAndCase) {
  const struct {
    const char* name;
    DType want;
  } kCases[] = {
      {"fp32", DType::kFloat32},      {"f32", DType::kFloat32},
      {"float", DType::kFloat32},     {"FLOAT32", DType::kFloat32},
      {"Float", DType::kFloat32},     {"double", DType::kFloat64},
      {"Float64", DType::kFloat64},   {"half", DType::kFloat16},
      {"HALF", DType::kFloat16},      {"float16", DType::kFloat16},
      {"bf16", DType::kBFloat16},     {"BF16", DType::kBFloat16},
      {"BFloat16", DType::kBFloat16}, {"int", DType::kInt32},
      {"Int32", DType::kInt32},       {"long", DType::kInt64},
      {"INT64", DType::kInt64},
  };
  for (const auto& c : kCases) {
    absl::StatusOr<DType> parsed = ParseDType(c.name);
    ASSERT_TRUE(parsed.ok()) << c.name << ": " << parsed.status();
    EXPECT_EQ(*parsed, c.want) << c.name;
  }
  const struct {
    const char* name;
    ReduceOp want;
  } kOps[] = {
      {"SUM", ReduceOp::kSum},   {"Avg", ReduceOp::kAvg},
      {"mIn", ReduceOp::kMin},   {"MAX", ReduceOp::kMax},
      {"Prod", ReduceOp::kProd},
  };
  for (const auto& c : kOps) {
    absl::StatusOr<ReduceOp> parsed = ParseReduceOp(c.name);
    ASSERT_TRUE(parsed.ok()) << c.name << ": " << parsed.status();
    EXPECT_EQ(*parsed, c.want) << c.name;
  }
}

TEST(DTypeTest, ParseDTypeRejectsUnknownNames) {
  for (const char* bad : {"", "float128", "int128", "uint32", " float32",
                          "float32 ", "fp", "bfloat", "sum"}) {
    absl::StatusOr<DType> parsed = ParseDType(bad);
    ASSERT_FALSE(parsed.ok()) << '"' << bad << '"';
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(parsed.status().message());
    // The message names what was wrong and what would have been accepted.
    EXPECT_TRUE(absl::StrContains(message, std::string("\"") + bad + "\""))
        << message;
    for (DType d : kAllDTypes) {
      EXPECT_TRUE(absl::StrContains(message, DTypeName(d))) << message;
    }
    EXPECT_TRUE(absl::StrContains(message, "bf16")) << message;
  }
}

TEST(DTypeTest, ParseReduceOpRejectsUnknownNames) {
  for (const char* bad :
       {"", "mean", "average", "sum ", "product", "float32", "minimum"}) {
    absl::StatusOr<ReduceOp> parsed = ParseReduceOp(bad);
    ASSERT_FALSE(parsed.ok()) << '"' << bad << '"';
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(parsed.status().message());
    EXPECT_TRUE(absl::StrContains(message, std::string("\"") + bad + "\""))
        << message;
    for (ReduceOp op : kAllReduceOps) {
      EXPECT_TRUE(absl::StrContains(message, ReduceOpName(op))) << message;
    }
  }
}

TEST(DTypeTest, ParseErrorEscapesUnprintableInput) {
  absl::StatusOr<DType> parsed = ParseDType(absl::string_view("x\n\0y", 4));
  ASSERT_FALSE(parsed.ok());
  const std::string message(parsed.status().message());
  EXPECT_FALSE(absl::StrContains(message, "\n")) << message;
  EXPECT_TRUE(absl::StrContains(message, "x\\n\\000y")) << message;
}

}  // namespace
}  // namespace halka
