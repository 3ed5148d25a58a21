#include "core/dtype.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace halka {
namespace {

// One accepted spelling and the value it names. Lists are scanned linearly:
// they are tiny and parsing happens once per request, not per element.
template <typename T>
struct NameEntry {
  absl::string_view name;
  T value;
};

// Canonical names first; ParseDType's error message lists them separately
// from the aliases so that users see the preferred spelling.
constexpr NameEntry<DType> kDTypeNames[] = {
    {"float32", DType::kFloat32}, {"float64", DType::kFloat64},
    {"float16", DType::kFloat16}, {"bfloat16", DType::kBFloat16},
    {"int32", DType::kInt32},     {"int64", DType::kInt64},
    {"int8", DType::kInt8},       {"uint8", DType::kUInt8},
    {"bool", DType::kBool},       {"int16", DType::kInt16},
};
constexpr NameEntry<DType> kDTypeAliases[] = {
    {"fp32", DType::kFloat32},  {"f32", DType::kFloat32},
    {"float", DType::kFloat32}, {"double", DType::kFloat64},
    {"half", DType::kFloat16},  {"bf16", DType::kBFloat16},
    {"int", DType::kInt32},     {"long", DType::kInt64},
    {"char", DType::kInt8},     {"byte", DType::kUInt8},
    {"short", DType::kInt16},
};
constexpr NameEntry<ReduceOp> kReduceOpNames[] = {
    {"sum", ReduceOp::kSum}, {"avg", ReduceOp::kAvg},   {"min", ReduceOp::kMin},
    {"max", ReduceOp::kMax}, {"prod", ReduceOp::kProd},
};

template <typename T, size_t N>
bool Lookup(const NameEntry<T> (&table)[N], absl::string_view name, T* value) {
  for (const NameEntry<T>& entry : table) {
    if (absl::EqualsIgnoreCase(entry.name, name)) {
      *value = entry.value;
      return true;
    }
  }
  return false;
}

template <typename T, size_t N>
std::string JoinNames(const NameEntry<T> (&table)[N]) {
  std::string out;
  for (const NameEntry<T>& entry : table) {
    if (!out.empty()) out += ", ";
    absl::StrAppend(&out, entry.name);
  }
  return out;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return 1;
    case DType::kInt16:
      return 2;
  }
  // Reached for values cast from the wire that are outside the enum.
  return 0;
}

bool IsValidDType(int value) {
  return value >= static_cast<int>(DType::kFloat32) &&
         value <= static_cast<int>(DType::kInt16);
}

bool IsValidReduceOp(int value) {
  return value >= static_cast<int>(ReduceOp::kSum) &&
         value <= static_cast<int>(ReduceOp::kProd);
}

bool IsFloatingPoint(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16:
      return true;
    case DType::kInt32:
    case DType::kInt64:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
    case DType::kInt16:
      return false;
  }
  return false;
}

absl::Status CheckReduction(DType dtype, ReduceOp op) {
  if (dtype == DType::kBool && op == ReduceOp::kAvg) {
    return absl::InvalidArgumentError(
        "avg is not defined for bool (sum and max are a logical or, prod and "
        "min a logical and)");
  }
  return absl::OkStatus();
}

absl::string_view DTypeName(DType dtype) {
  for (const NameEntry<DType>& entry : kDTypeNames) {
    if (entry.value == dtype) return entry.name;
  }
  return "unknown";
}

absl::string_view ReduceOpName(ReduceOp op) {
  for (const NameEntry<ReduceOp>& entry : kReduceOpNames) {
    if (entry.value == op) return entry.name;
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  DType dtype;
  if (Lookup(kDTypeNames, name, &dtype) ||
      Lookup(kDTypeAliases, name, &dtype)) {
    return dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype \"", absl::CEscape(name), "\"; expected one of ",
      JoinNames(kDTypeNames), " (aliases: ", JoinNames(kDTypeAliases), ")"));
}

absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name) {
  ReduceOp op;
  if (Lookup(kReduceOpNames, name, &op)) return op;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reduce op \"", absl::CEscape(name),
                   "\"; expected one of ", JoinNames(kReduceOpNames)));
}

}  // namespace halka
