// Element types and reduction operators of halka: sizes, names, parsing.
//
// The enums themselves (DType, ReduceOp, kAllDTypes, kAllReduceOps) are the
// public vocabulary in halka/types.h; their values match the enums in
// proto/halka/v1/common.proto.
#ifndef HALKA_CORE_DTYPE_H_
#define HALKA_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "halka/types.h"

namespace halka {

// Size of one element in bytes; 0 for a value outside the enum.
size_t DTypeSize(DType dtype);
bool IsValidDType(int value);
bool IsValidReduceOp(int value);
bool IsFloatingPoint(DType dtype);
// INVALID_ARGUMENT where `op` is not defined on `dtype` (avg on bool).
absl::Status CheckReduction(DType dtype, ReduceOp op);

// "float32", "float64", "float16", "bfloat16", "int32", "int64", "int8",
// "uint8", "bool", "int16".
absl::string_view DTypeName(DType dtype);
// "sum", "avg", "min", "max", "prod".
absl::string_view ReduceOpName(ReduceOp op);

// Parse the names above (case-insensitive; also "fp32", "f32", "half",
// "bf16", "double", "float", "int", "long", "char", "byte", "short"). INVALID_ARGUMENT otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);
absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name);

}  // namespace halka

#endif  // HALKA_CORE_DTYPE_H_
