// Element types and reduction operators of halka, and their names.
//
// The numeric values match the enums in proto/halka/v1/common.proto so that
// converting between the wire and the engine is a cast after validation.
#ifndef HALKA_WORKER_CORE_DTYPE_H_
#define HALKA_WORKER_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace halka {

enum class DType : uint8_t {
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt32 = 5,
  kInt64 = 6,
};
inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64,
                                       DType::kFloat16, DType::kBFloat16,
                                       DType::kInt32,   DType::kInt64};

enum class ReduceOp : uint8_t {
  kSum = 1,
  kAvg = 2,
  kMin = 3,
  kMax = 4,
  kProd = 5,
};
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg,
                                             ReduceOp::kMin, ReduceOp::kMax,
                                             ReduceOp::kProd};

// Size of one element in bytes; 0 for a value outside the enum.
size_t DTypeSize(DType dtype);
bool IsValidDType(int value);
bool IsValidReduceOp(int value);
bool IsFloatingPoint(DType dtype);

// "float32", "float64", "float16", "bfloat16", "int32", "int64".
absl::string_view DTypeName(DType dtype);
// "sum", "avg", "min", "max", "prod".
absl::string_view ReduceOpName(ReduceOp op);

// Parse the names above (case-insensitive; also "fp32", "f32", "half",
// "bf16", "double", "float", "int", "long"). INVALID_ARGUMENT otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);
absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name);

}  // namespace halka

#endif  // HALKA_WORKER_CORE_DTYPE_H_
