// Bounded waits on a condition, for tests: never sleep a fixed time to let
// something happen; wait until it did, and fail saying what was awaited.
//
//   ASSERT_TRUE(WaitFor([&] { return node->open_peer_streams() == 0; },
//                       absl::Seconds(10)))
//       << "peer streams of worker 1 to close";
#ifndef HALKA_TESTS_TESTING_WAIT_FOR_H_
#define HALKA_TESTS_TESTING_WAIT_FOR_H_

#include <algorithm>
#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace halka::testing {

// Evaluates `cond` until it returns true or `timeout` has passed, sleeping
// `poll` between tries; returns whether it held. `cond` runs on the calling
// thread, at least once, the last time at the deadline.
inline bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout,
                    absl::Duration poll = absl::Milliseconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (cond()) return true;
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    absl::SleepFor(std::min(poll, deadline - now));
  }
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_WAIT_FOR_H_
