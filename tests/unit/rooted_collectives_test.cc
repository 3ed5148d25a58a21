// Reduce, gather, scatter and all-to-all over the in-process transport:
// every rank on a thread, every root, rank order and a scrambled ring path,
// chunks of a few elements, checked against the float64 reference and bit
// for bit; what each rank sends; refusals that fail every rank at once.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/communicator.h"
#include "core/testing/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/inproc_ring.h"
#include "tests/testing/refused_reduction.h"
#include "tests/testing/run_ranks.h"

namespace halka {
namespace {

using halka::testing::InProcRing;
using halka::testing::RunRanks;
using Results = std::vector<absl::StatusOr<OpResult>>;

// A ring of g ranks in rank order, or on a scrambled path (1, 3, 0, ...).
InProcRing MakeRing(int g, bool scrambled, size_t eager_bytes = 64 << 10,
                    int all_to_all_max_world = 16) {
  return InProcRing(g, 24, [&](CommConfig& c) {
    c.eager_bytes = eager_bytes;
    c.all_to_all_max_world = all_to_all_max_world;
    if (scrambled) {
      for (int i = 0; i < g; ++i) c.ring_order.push_back((2 * i + 1) % g);
      std::vector<int> sorted = c.ring_order;
      std::sort(sorted.begin(), sorted.end());
      if (std::unique(sorted.begin(), sorted.end()) != sorted.end()) {
        c.ring_order.clear();  // not a permutation for even g: reversed
        for (int i = g - 1; i >= 0; --i) c.ring_order.push_back(i);
      }
    }
  });
}

size_t Diff(const uint8_t* a, const uint8_t* b, size_t count, size_t es) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(a + i * es, b + i * es, es) != 0) ++wrong;
  }
  return wrong;
}

// --- Reduce: every root, both algorithms (direct below the eager size,
// the ring reduce-scatter above it, and each forced).
using ReduceParam = std::tuple<int, DType, ReduceOp>;
class ReduceTest : public ::testing::TestWithParam<ReduceParam> {};

TEST_P(ReduceTest, TheRootHoldsTheReduction) {
  const auto [g, dtype, op] = GetParam();
  const size_t es = DTypeSize(dtype);
  for (bool scrambled : {false, true}) {
    InProcRing ring = MakeRing(g, scrambled, /*eager_bytes=*/256);
    for (Algorithm algorithm :
         {Algorithm::kAuto, Algorithm::kRing, Algorithm::kNaive}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{301}}) {
        const int root = static_cast<int>(count % static_cast<size_t>(g));
        std::vector<std::vector<uint8_t>> inputs =
            MakeRanksData(dtype, op, count, g, 17);
        std::vector<std::vector<uint8_t>> bufs = inputs;
        Results results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
          HostOpBuffer b(bufs[r].data());
          return ring.comms[r]->Reduce(b, count, dtype, op, root,
                                       absl::ZeroDuration(), algorithm);
        });
        if (RefusedEverywhere(dtype, op, results)) continue;
        const std::string what =
            absl::StrCat(scrambled ? "scrambled " : "", AlgorithmName(algorithm),
                         " count ", count, " root ", root);
        for (int r = 0; r < g; ++r) {
          ASSERT_TRUE(results[r].ok()) << what << ": " << results[r].status();
        }
        if (g > 1 && count > 0) {
          const bool ring_ran =
              algorithm == Algorithm::kRing ||
              (algorithm == Algorithm::kAuto && count * es > 256);
          EXPECT_EQ(results[0]->algorithm, ring_ran ? "ring" : "naive") << what;
          if (!ring_ran) {
            // Direct: the root sends nothing, every other rank its buffer,
            // and their buffers are left as they were.
            for (int r = 0; r < g; ++r) {
              EXPECT_EQ(results[r]->bytes_sent, r == root ? 0 : count * es)
                  << what << " rank " << r;
              if (r != root) EXPECT_EQ(bufs[r], inputs[r]) << what;
            }
          }
        }
        const CheckResult check =
            CheckAllReduce(dtype, op, inputs, bufs[root].data(), count);
        EXPECT_EQ(check.wrong, 0u) << what << ": " << check.first;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, ReduceTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 5),
                       ::testing::ValuesIn(kAllDTypes),
                       ::testing::ValuesIn(kAllReduceOps)),
    [](const ::testing::TestParamInfo<ReduceParam>& info) {
      return absl::StrCat("g", std::get<0>(info.param), "_",
                          DTypeName(std::get<1>(info.param)), "_",
                          ReduceOpName(std::get<2>(info.param)));
    });

// Above all_to_all_max_world ranks, auto reduces on the ring even a small
// buffer (the root would otherwise take a link from every rank at once).
TEST(ReduceAuto, LargeWorldsTakeTheRing) {
  const int g = 4;
  InProcRing ring = MakeRing(g, false, 64 << 10, /*all_to_all_max_world=*/3);
  std::vector<std::vector<uint8_t>> inputs =
      MakeRanksData(DType::kInt32, ReduceOp::kSum, 10, g, 3);
  std::vector<std::vector<uint8_t>> bufs = inputs;
  Results results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    HostOpBuffer b(bufs[r].data());
    return ring.comms[r]->Reduce(b, 10, DType::kInt32, ReduceOp::kSum, 1,
                                 absl::ZeroDuration());
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(results[r]->algorithm, "ring");
  }
  EXPECT_EQ(CheckAllReduce(DType::kInt32, ReduceOp::kSum, inputs,
                           bufs[1].data(), 10)
                .wrong,
            0u);
}

// --- Gather, scatter, all-to-all: data movement, any dtype, bit for bit.
using MoveParam = std::tuple<int, DType, bool>;
class MoveTest : public ::testing::TestWithParam<MoveParam> {};

TEST_P(MoveTest, GatherPutsRankRsContributionInTheRootsSliceR) {
  const auto [g, dtype, scrambled] = GetParam();
  const size_t es = DTypeSize(dtype);
  InProcRing ring = MakeRing(g, scrambled);
  for (size_t slice : {size_t{0}, size_t{1}, size_t{5}, size_t{301}}) {
    for (bool in_place : {true, false}) {
      const int root = static_cast<int>((slice + 1) % static_cast<size_t>(g));
      std::vector<std::vector<uint8_t>> inputs;
      std::vector<std::vector<uint8_t>> bufs(
          g, std::vector<uint8_t>(g * slice * es, 0xEE));
      for (int r = 0; r < g; ++r) {
        inputs.push_back(MakeRankData(dtype, ReduceOp::kSum, slice, r, 5));
        const size_t at = in_place ? r * slice * es : 0;
        std::copy(inputs[r].begin(), inputs[r].end(), bufs[r].begin() + at);
      }
      const std::vector<std::vector<uint8_t>> before = bufs;
      Results results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
        HostOpBuffer b(bufs[r].data());
        return ring.comms[r]->Gather(b, slice, g * slice, in_place ? r : 0,
                                     dtype, root, absl::ZeroDuration());
      });
      const std::string what = absl::StrCat("slice ", slice, " root ", root,
                                            in_place ? " in place" : "");
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(results[r].ok()) << what << ": " << results[r].status();
        if (r != root) {
          EXPECT_EQ(bufs[r], before[r]) << what << ": rank " << r
                                        << "'s buffer was written";
          EXPECT_EQ(results[r]->bytes_sent, slice * es) << what;
        } else {
          EXPECT_EQ(results[r]->bytes_sent, 0u) << what;
        }
      }
      const CheckResult check =
          CheckAllGather(dtype, inputs, bufs[root].data(), slice);
      EXPECT_EQ(check.wrong, 0u) << what << ": " << check.first;
    }
  }
}

TEST_P(MoveTest, ScatterGivesRankRTheRootsSliceR) {
  const auto [g, dtype, scrambled] = GetParam();
  const size_t es = DTypeSize(dtype);
  InProcRing ring = MakeRing(g, scrambled);
  for (size_t slice : {size_t{0}, size_t{1}, size_t{5}, size_t{301}}) {
    const int root = static_cast<int>((slice + 2) % static_cast<size_t>(g));
    std::vector<std::vector<uint8_t>> bufs =
        MakeRanksData(dtype, ReduceOp::kSum, g * slice, g, 9);
    const std::vector<std::vector<uint8_t>> before = bufs;
    Results results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      HostOpBuffer b(bufs[r].data());
      return ring.comms[r]->Scatter(b, g * slice, slice, dtype, root,
                                    absl::ZeroDuration());
    });
    const std::string what = absl::StrCat("slice ", slice, " root ", root);
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << what << ": " << results[r].status();
      EXPECT_EQ(Diff(bufs[r].data() + r * slice * es,
                     before[root].data() + r * slice * es, slice, es),
                0u)
          << what << " rank " << r;
      // Only slice r changes; the root's buffer not at all.
      for (int k = 0; k < g; ++k) {
        if (k == r) continue;
        EXPECT_EQ(Diff(bufs[r].data() + k * slice * es,
                       before[r].data() + k * slice * es, slice, es),
                  0u)
            << what << " rank " << r << " slice " << k;
      }
      EXPECT_EQ(results[r]->bytes_sent, r == root ? (g - 1) * slice * es : 0)
          << what << " rank " << r;
    }
  }
}

TEST_P(MoveTest, AllToAllSwapsSlices) {
  const auto [g, dtype, scrambled] = GetParam();
  const size_t es = DTypeSize(dtype);
  // Fingerprints around the ring too (all_to_all_max_world 1): the data
  // still goes straight to each peer.
  for (int fp_world : {16, 1}) {
    InProcRing ring = MakeRing(g, scrambled, 64 << 10, fp_world);
    for (size_t slice : {size_t{0}, size_t{1}, size_t{5}, size_t{301}}) {
      std::vector<std::vector<uint8_t>> inputs =
          MakeRanksData(dtype, ReduceOp::kSum, g * slice, g, 13);
      std::vector<std::vector<uint8_t>> bufs = inputs;
      Results results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
        HostOpBuffer b(bufs[r].data());
        return ring.comms[r]->AllToAll(b, g * slice, dtype,
                                       absl::ZeroDuration());
      });
      const std::string what =
          absl::StrCat("slice ", slice, " fingerprints to ", fp_world);
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(results[r].ok()) << what << ": " << results[r].status();
        for (int k = 0; k < g; ++k) {
          EXPECT_EQ(Diff(bufs[r].data() + k * slice * es,
                         inputs[k].data() + r * slice * es, slice, es),
                    0u)
              << what << " rank " << r << " slice " << k;
        }
        EXPECT_EQ(results[r]->bytes_sent, (g - 1) * slice * es) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, MoveTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 7),
                       ::testing::Values(DType::kFloat32, DType::kFloat64,
                                         DType::kInt8, DType::kBool,
                                         DType::kFloat16),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<MoveParam>& info) {
      return absl::StrCat("g", std::get<0>(info.param), "_",
                          DTypeName(std::get<1>(info.param)),
                          std::get<2>(info.param) ? "_scrambled" : "");
    });

// --- Refusals: a bad call on one rank fails every rank at once (the
// refused rank skips its number), naming what was wrong; the next call
// runs.
TEST(RootedRefusals, BadCallsFailEveryRankAndTheNextCallRuns) {
  const int g = 3;
  InProcRing ring = MakeRing(g, false);
  struct Case {
    const char* name;
    std::function<absl::StatusOr<OpResult>(Communicator&, OpBuffer&, int)> call;
    absl::StatusCode code;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"reduce root out of the world",
       [](Communicator& c, OpBuffer& b, int r) {
         return c.Reduce(b, 4, DType::kFloat32, ReduceOp::kSum, r == 1 ? 3 : 0,
                         absl::Seconds(5));
       },
       absl::StatusCode::kInvalidArgument, "root 3 is outside [0, 3)"},
      {"gather counts that do not fit the world",
       [](Communicator& c, OpBuffer& b, int r) {
         return c.Gather(b, 2, r == 2 ? 4 : 6, 0, DType::kFloat32, 0,
                         absl::Seconds(5));
       },
       absl::StatusCode::kInvalidArgument,
       "recv_count 4 must be the ring's world (3) x send_count 2"},
      {"scatter on the ring",
       [](Communicator& c, OpBuffer& b, int r) {
         return c.Scatter(b, 6, 2, DType::kFloat32, 0, absl::Seconds(5),
                          r == 0 ? Algorithm::kRing : Algorithm::kAuto);
       },
       absl::StatusCode::kUnimplemented, "scatter: the ring algorithm"},
      {"all-to-all of a count that does not split",
       [](Communicator& c, OpBuffer& b, int r) {
         return c.AllToAll(b, r == 1 ? 7 : 6, DType::kFloat32,
                           absl::Seconds(5));
       },
       absl::StatusCode::kInvalidArgument, "must be a multiple of the ring's"},
  };
  for (const Case& c : cases) {
    std::vector<std::vector<float>> bufs(g, std::vector<float>(8, 1.0f));
    const absl::Time t0 = absl::Now();
    Results results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      HostOpBuffer b(bufs[r].data());
      return c.call(*ring.comms[r], b, r);
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_FALSE(results[r].ok()) << c.name << ": rank " << r << " ran";
      EXPECT_TRUE(absl::StrContains(results[r].status().message(), c.says) ||
                  results[r].status().code() ==
                      absl::StatusCode::kFailedPrecondition)
          << c.name << ": rank " << r << ": " << results[r].status();
    }
    // At least the refused rank says exactly why; none waited for its
    // deadline of 5 s.
    bool named = false;
    for (int r = 0; r < g; ++r) {
      if (results[r].status().code() == c.code &&
          absl::StrContains(results[r].status().message(), c.says)) {
        named = true;
      }
    }
    EXPECT_TRUE(named) << c.name;
    EXPECT_LT(absl::Now() - t0, absl::Seconds(4)) << c.name;
    // The next call pairs up on every rank.
    std::vector<std::vector<float>> next(g, std::vector<float>(6, 2.0f));
    Results ok = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      HostOpBuffer b(next[r].data());
      return ring.comms[r]->AllToAll(b, 6, DType::kFloat32, absl::Seconds(5));
    });
    for (int r = 0; r < g; ++r) {
      EXPECT_TRUE(ok[r].ok()) << c.name << ": the next call on rank " << r
                              << ": " << ok[r].status();
    }
  }
}

// Ranks that call different rooted collectives (or roots) fail alike, the
// fingerprints naming both calls, before any data moves.
TEST(RootedRefusals, DisagreeingRootsFailBeforeAnyDataMoves) {
  const int g = 3;
  InProcRing ring = MakeRing(g, false);
  std::vector<std::vector<float>> bufs(g, std::vector<float>(6, 1.0f));
  const std::vector<std::vector<float>> before = bufs;
  Results results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    HostOpBuffer b(bufs[r].data());
    return ring.comms[r]->Gather(b, 2, 6, r, DType::kFloat32, r == 2 ? 1 : 0,
                                 absl::Seconds(5));
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_FALSE(results[r].ok());
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    EXPECT_TRUE(absl::StrContains(results[r].status().message(), "root 1"))
        << results[r].status();
    EXPECT_EQ(bufs[r], before[r]);
  }
}

}  // namespace
}  // namespace halka
