// G Communicators over one InProcNetwork, for tests of the algorithms
// (every rank in this process), and the collectives run on all of them at
// once, one thread per rank (RunRanks).
#ifndef HALKA_TESTS_TESTING_INPROC_RING_H_
#define HALKA_TESTS_TESTING_INPROC_RING_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/communicator.h"
#include "core/testing/inproc_transport.h"
#include "core/testing/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/run_ranks.h"

namespace halka::testing {

struct InProcRing {
  using Results = std::vector<absl::StatusOr<OpResult>>;

  // Rank r runs with rank r of g, chunks of `chunk_bytes`, a 20 s default
  // timeout and members w0..w{g-1} (addresses inproc:0..); `tune`, when
  // given, sets the rest of each rank's configuration.
  InProcRing(int g, size_t chunk_bytes,
             const std::function<void(CommConfig&)>& tune = nullptr)
      : g(g), net(g) {
    for (int r = 0; r < g; ++r) {
      CommConfig c;
      c.rank = r;
      c.world_size = g;
      c.chunk_bytes = chunk_bytes;
      c.default_timeout = absl::Seconds(20);
      if (tune) tune(c);
      for (int i = 0; i < g; ++i) {
        c.members.push_back(PeerInfo{i, absl::StrCat("w", i),
                                     absl::StrCat("inproc:", i)});
      }
      comms.push_back(std::make_unique<Communicator>(c, net.transport(r),
                                                     net.inbox(r)));
    }
  }

  // Every rank's all-reduce of its bufs[r] in place (the default timeout),
  // by rank.
  template <typename T>
  Results AllReduce(std::vector<std::vector<T>>& bufs, size_t count,
                    DType dtype, ReduceOp op,
                    Algorithm algorithm = Algorithm::kAuto) {
    return RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      return comms[r]->AllReduce(bufs[r].data(), count, dtype, op,
                                 absl::ZeroDuration(), algorithm);
    });
  }

  // Every rank's broadcast from `root` into its bufs[r], by rank.
  template <typename T>
  Results Broadcast(std::vector<std::vector<T>>& bufs, size_t count,
                    DType dtype, int root) {
    return RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      return comms[r]->Broadcast(bufs[r].data(), count, dtype, root,
                                 absl::ZeroDuration());
    });
  }

  // Broadcasts 333 int64 elements from each rank in turn: every rank must
  // end with the root's data (a fatal failure at the first that does not).
  void ExpectBroadcastFromEveryRoot() {
    for (int root = 0; root < g; ++root) {
      const size_t count = 333;
      std::vector<std::vector<uint8_t>> bufs =
          MakeRanksData(DType::kInt64, ReduceOp::kSum, count, g, 3);
      const std::vector<uint8_t> expected = bufs[root];
      Results results = Broadcast(bufs, count, DType::kInt64, root);
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(results[r].ok()) << results[r].status();
        EXPECT_EQ(bufs[r], expected) << "g=" << g << " root=" << root
                                     << " rank=" << r;
      }
    }
  }

  const int g;
  InProcNetwork net;
  std::vector<std::unique_ptr<Communicator>> comms;
};

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_INPROC_RING_H_
