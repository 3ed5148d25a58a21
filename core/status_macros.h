// The few status helpers halka needs (Abseil 20220623 ships none).
#ifndef HALKA_CORE_STATUS_MACROS_H_
#define HALKA_CORE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HALKA_CONCAT_INNER_(a, b) a##b
#define HALKA_CONCAT_(a, b) HALKA_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define HALKA_RETURN_IF_ERROR(expr)                    \
  do {                                                 \
    ::absl::Status halka_status_ = (expr);             \
    if (!halka_status_.ok()) return halka_status_;     \
  } while (0)

// `lhs = value of expr` or returns its error. expr is an absl::StatusOr<T>.
#define HALKA_ASSIGN_OR_RETURN(lhs, expr) \
  HALKA_ASSIGN_OR_RETURN_IMPL_(HALKA_CONCAT_(halka_sor_, __LINE__), lhs, expr)
#define HALKA_ASSIGN_OR_RETURN_IMPL_(sor, lhs, expr) \
  auto sor = (expr);                                 \
  if (!sor.ok()) return std::move(sor).status();     \
  lhs = std::move(sor).value()

#endif  // HALKA_CORE_STATUS_MACROS_H_
