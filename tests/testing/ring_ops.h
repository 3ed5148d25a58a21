// Operations run on every rank's client at once, for tests that need the
// ring to have done some work (telemetry, health, timelines).
#ifndef HALKA_TESTS_TESTING_RING_OPS_H_
#define HALKA_TESTS_TESTING_RING_OPS_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "tests/testing/run_ranks.h"

namespace halka::testing {

// `n` ring all-reduces (sum) of `count` float32 ones, one after the other,
// each on every client at once; a fatal failure names the first rank whose
// call failed.
inline void RunRingAllReduces(
    const std::vector<std::unique_ptr<Client>>& clients, int n,
    size_t count) {
  const int g = static_cast<int>(clients.size());
  std::vector<std::vector<float>> bufs(g, std::vector<float>(count, 1.0f));
  for (int i = 0; i < n; ++i) {
    auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
      OpOptions oo;
      oo.algorithm = Algorithm::kRing;
      return clients[r]->AllReduce(absl::MakeSpan(bufs[r]), ReduceOp::kSum,
                                   oo);
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    }
  }
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_RING_OPS_H_
