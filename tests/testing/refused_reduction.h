// The one reduction halka refuses by definition (avg on bool, see
// CheckReduction in core/dtype.h), for the tests that sweep every dtype and
// op: where the pair is refused, every rank's result must be
// INVALID_ARGUMENT saying so, and the sweep moves on.
#ifndef HALKA_TESTS_TESTING_REFUSED_REDUCTION_H_
#define HALKA_TESTS_TESTING_REFUSED_REDUCTION_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "core/dtype.h"
#include "gtest/gtest.h"

namespace halka {

// True (after checking `results`) when `op` on `dtype` is refused; false
// when it is defined and the caller checks the results as usual.
template <typename Results>
bool RefusedEverywhere(DType dtype, ReduceOp op, const Results& results) {
  if (CheckReduction(dtype, op).ok()) return false;
  for (const auto& r : results) {
    EXPECT_FALSE(r.ok()) << DTypeName(dtype) << " " << ReduceOpName(op)
                         << " ran; it must be refused";
    if (r.ok()) continue;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(),
                                  "avg is not defined for bool"))
        << r.status();
  }
  return true;
}

}  // namespace halka

#endif  // HALKA_TESTS_TESTING_REFUSED_REDUCTION_H_
