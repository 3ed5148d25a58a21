// All-gather, reduce-scatter, reduce, gather, scatter and all-to-all
// through the SDK and real gRPC on loopback:
// every dtype (and reduce op) against the reference, G = 1..4, in place and
// out of place, over each transfer (zero-copy shared memory, staged shared
// memory, inline); bad sizes, ranks that disagree, refused algorithms and a
// killed rank give clear errors, never a hang or a wrong result.
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "tests/testing/refused_reduction.h"
#include "tests/testing/cluster_harness.h"
#include "tests/testing/run_ranks.h"
#include "tests/testing/wait_for.h"
#include "core/communicator.h"
#include "core/testing/reference.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::ClusterHarness;
using halka::testing::RunRanks;

// How the tensors reach the worker.
enum class Via { kZeroCopy, kStaged, kInline };
const char* ViaName(Via v) {
  switch (v) {
    case Via::kZeroCopy: return "zerocopy";
    case Via::kStaged: return "staged";
    case Via::kInline: return "inline";
  }
  return "?";
}

// One rank's memory: a HostBuffer shared with the worker (kZeroCopy) or a
// plain vector.
class RankMemory {
 public:
  RankMemory(Client& client, Via via, size_t bytes) {
    if (via == Via::kZeroCopy) {
      absl::StatusOr<HostBuffer> b = client.AllocateHostBuffer(std::max<size_t>(bytes, 1));
      if (b.ok()) {
        shared_ = std::move(*b);
        data_ = static_cast<uint8_t*>(shared_.data());
      }
    } else {
      plain_.resize(std::max<size_t>(bytes, 1));
      data_ = plain_.data();
    }
  }
  uint8_t* data() const { return data_; }

 private:
  HostBuffer shared_;
  std::vector<uint8_t> plain_;
  uint8_t* data_ = nullptr;
};

using Param = std::tuple<int, Via>;
class SliceCollectives : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const auto [g, via] = GetParam();
    halka::testing::ClusterOptions o;
    o.workers = g;
    o.chunk_bytes = 64;  // slices span several chunks
    o.transfer = via == Via::kInline ? Client::Transfer::kInline
                                     : Client::Transfer::kSharedMemory;
    h_ = std::make_unique<ClusterHarness>(o);
  }
  std::unique_ptr<ClusterHarness> h_;
};

TEST_P(SliceCollectives, AllGatherEveryDtypeInAndOutOfPlace) {
  ASSERT_TRUE(h_->ok()) << h_->status();
  const auto [g, via] = GetParam();
  for (DType dtype : kAllDTypes) {
    const size_t es = DTypeSize(dtype);
    for (size_t sc : {size_t{1}, size_t{37}}) {
      for (bool in_place : {false, true}) {
        std::vector<std::vector<uint8_t>> inputs;
        std::vector<std::unique_ptr<RankMemory>> recv;
        for (int r = 0; r < g; ++r) {
          inputs.push_back(MakeRankData(dtype, ReduceOp::kSum, sc, r, 9));
          recv.push_back(std::make_unique<RankMemory>(h_->client(r), via, g * sc * es));
          ASSERT_NE(recv[r]->data(), nullptr);
          std::memset(recv[r]->data(), 0xAB, g * sc * es);
          if (in_place) std::memcpy(recv[r]->data() + r * sc * es, inputs[r].data(), sc * es);
        }
        auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
          const void* send = in_place ? recv[r]->data() + r * sc * es : inputs[r].data();
          return h_->client(r).AllGather(send, sc, recv[r]->data(), g * sc, dtype);
        });
        const std::string what = absl::StrCat(DTypeName(dtype), " send_count ", sc,
                                              in_place ? " in place" : " out of place");
        for (int r = 0; r < g; ++r) {
          ASSERT_TRUE(results[r].ok()) << what << " rank " << r << ": " << results[r].status();
          const CheckResult check = CheckAllGather(dtype, inputs, recv[r]->data(), sc);
          EXPECT_EQ(check.wrong, 0u) << what << " rank " << r << ": " << check.first;
          EXPECT_EQ(results[r]->bytes_sent, (g - 1) * sc * es) << what;
          EXPECT_EQ(results[r]->transfer, via == Via::kZeroCopy ? "shm"
                                          : via == Via::kStaged ? "shm-staged"
                                                                : "inline");
        }
      }
    }
  }
}

TEST_P(SliceCollectives, ReduceScatterEveryDtypeAndOpInAndOutOfPlace) {
  ASSERT_TRUE(h_->ok()) << h_->status();
  const auto [g, via] = GetParam();
  for (DType dtype : kAllDTypes) {
    const size_t es = DTypeSize(dtype);
    for (ReduceOp op : kAllReduceOps) {
      for (bool in_place : {false, true}) {
        const size_t rc = 29;  // not a multiple of the chunk
        std::vector<std::vector<uint8_t>> inputs;
        std::vector<std::unique_ptr<RankMemory>> send, recv;
        for (int r = 0; r < g; ++r) {
          inputs.push_back(MakeRankData(dtype, op, g * rc, r, 4));
          send.push_back(std::make_unique<RankMemory>(h_->client(r), via, g * rc * es));
          recv.push_back(std::make_unique<RankMemory>(h_->client(r), via, rc * es));
          ASSERT_NE(send[r]->data(), nullptr);
          ASSERT_NE(recv[r]->data(), nullptr);
          std::memcpy(send[r]->data(), inputs[r].data(), g * rc * es);
        }
        auto out = [&](int r) {
          return in_place ? send[r]->data() + r * rc * es : recv[r]->data();
        };
        auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
          return h_->client(r).ReduceScatter(send[r]->data(), g * rc, out(r), rc,
                                             dtype, op);
        });
        const std::string what = absl::StrCat(DTypeName(dtype), " ", ReduceOpName(op),
                                              in_place ? " in place" : " out of place");
        if (RefusedEverywhere(dtype, op, results)) continue;
        for (int r = 0; r < g; ++r) {
          ASSERT_TRUE(results[r].ok()) << what << " rank " << r << ": " << results[r].status();
          const CheckResult check = CheckReduceScatter(dtype, op, inputs, out(r), r, rc);
          EXPECT_EQ(check.wrong, 0u) << what << " rank " << r << ": " << check.first;
          EXPECT_EQ(results[r]->bytes_sent, (g - 1) * rc * es) << what;
          EXPECT_FALSE(results[r]->zero_copy) << what;
          // The input is left as it was (in place: but for slice r).
          for (int k = 0; k < g; ++k) {
            if (in_place && k == r) continue;
            EXPECT_EQ(std::memcmp(send[r]->data() + k * rc * es,
                                  inputs[r].data() + k * rc * es, rc * es),
                      0)
                << what << ": rank " << r << " slice " << k << " of send changed";
          }
        }
      }
    }
  }
}

// Reduce, gather, scatter and all-to-all through the SDK: every dtype
// (reduce: every op), every root, over each transfer; a non-root's recv is
// never written (a reduce's or gather's) and may be null; a non-root's
// scatter send may be null.
TEST_P(SliceCollectives, ReduceToEveryRootEveryDtypeAndOp) {
  ASSERT_TRUE(h_->ok()) << h_->status();
  const auto [g, via] = GetParam();
  const size_t count = 45;
  for (DType dtype : kAllDTypes) {
    const size_t es = DTypeSize(dtype);
    for (ReduceOp op : kAllReduceOps) {
      const int root = static_cast<int>((static_cast<int>(op) + 1) % g);
      std::vector<std::vector<uint8_t>> inputs =
          MakeRanksData(dtype, op, count, g, 21);
      std::vector<std::unique_ptr<RankMemory>> recv;
      for (int r = 0; r < g; ++r) {
        recv.push_back(std::make_unique<RankMemory>(h_->client(r), via, count * es));
        std::memset(recv[r]->data(), 0xAB, count * es);
      }
      auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
        // Odd non-root ranks pass no recv at all.
        void* out = r != root && r % 2 == 1 ? nullptr : recv[r]->data();
        return h_->client(r).Reduce(inputs[r].data(), out, count, dtype, op, root);
      });
      if (RefusedEverywhere(dtype, op, results)) continue;
      const std::string what = absl::StrCat(DTypeName(dtype), " ", ReduceOpName(op),
                                            " root ", root);
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(results[r].ok()) << what << " rank " << r << ": " << results[r].status();
        if (r == root) continue;
        for (size_t i = 0; i < count * es; ++i) {
          ASSERT_EQ(recv[r]->data()[i], 0xAB) << what << ": rank " << r << "'s recv written";
        }
      }
      const CheckResult check = CheckAllReduce(dtype, op, inputs, recv[root]->data(), count);
      EXPECT_EQ(check.wrong, 0u) << what << ": " << check.first;
    }
  }
}

TEST_P(SliceCollectives, GatherScatterAllToAllEveryDtype) {
  ASSERT_TRUE(h_->ok()) << h_->status();
  const auto [g, via] = GetParam();
  const size_t sc = 23;  // not a multiple of the chunk
  for (DType dtype : kAllDTypes) {
    const size_t es = DTypeSize(dtype);
    const int root = static_cast<int>(static_cast<int>(dtype) % g);
    const std::string what = absl::StrCat(DTypeName(dtype), " root ", root);
    std::vector<std::vector<uint8_t>> mine =
        MakeRanksData(dtype, ReduceOp::kSum, sc, g, 31);
    std::vector<std::vector<uint8_t>> whole =
        MakeRanksData(dtype, ReduceOp::kSum, g * sc, g, 32);
    // Gather: in place on even ranks (send is the rank's slice of recv).
    std::vector<std::unique_ptr<RankMemory>> recv;
    for (int r = 0; r < g; ++r) {
      recv.push_back(std::make_unique<RankMemory>(h_->client(r), via, g * sc * es));
      std::memset(recv[r]->data(), 0xAB, g * sc * es);
      if (r % 2 == 0) std::memcpy(recv[r]->data() + r * sc * es, mine[r].data(), sc * es);
    }
    auto gathered = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
      const void* send = r % 2 == 0 ? recv[r]->data() + r * sc * es : mine[r].data();
      return h_->client(r).Gather(send, sc, recv[r]->data(), g * sc, dtype, root);
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(gathered[r].ok()) << what << " gather rank " << r << ": " << gathered[r].status();
    }
    const CheckResult check = CheckAllGather(dtype, mine, recv[root]->data(), sc);
    EXPECT_EQ(check.wrong, 0u) << what << " gather: " << check.first;
    // Scatter: the non-roots pass no send.
    std::vector<std::vector<uint8_t>> part(g, std::vector<uint8_t>(sc * es, 0xCD));
    auto scattered = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
      return h_->client(r).Scatter(r == root ? whole[r].data() : nullptr, g * sc,
                                   part[r].data(), sc, dtype, root);
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(scattered[r].ok()) << what << " scatter rank " << r << ": "
                                     << scattered[r].status();
      EXPECT_EQ(0, std::memcmp(part[r].data(), whole[root].data() + r * sc * es, sc * es))
          << what << " scatter: rank " << r << " did not get the root's slice";
    }
    // All-to-all: out of place into plain memory, and in place in the
    // rank's memory (zero copy where it is a HostBuffer).
    for (bool in_place : {false, true}) {
      std::vector<std::vector<uint8_t>> out(g, std::vector<uint8_t>(g * sc * es, 0));
      for (int r = 0; r < g; ++r) std::memcpy(recv[r]->data(), whole[r].data(), g * sc * es);
      auto swapped = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
        return in_place ? h_->client(r).AllToAll(recv[r]->data(), recv[r]->data(), g * sc, dtype)
                        : h_->client(r).AllToAll(whole[r].data(), out[r].data(), g * sc, dtype);
      });
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(swapped[r].ok()) << what << " all_to_all rank " << r << ": "
                                     << swapped[r].status();
        const uint8_t* got = in_place ? recv[r]->data() : out[r].data();
        for (int k = 0; k < g; ++k) {
          EXPECT_EQ(0, std::memcmp(got + k * sc * es, whole[k].data() + r * sc * es, sc * es))
              << what << " all_to_all" << (in_place ? " in place" : "") << ": rank " << r
              << " slice " << k;
        }
        EXPECT_EQ(swapped[r]->bytes_sent, (g - 1) * sc * es) << what;
        if (in_place && via == Via::kZeroCopy) EXPECT_TRUE(swapped[r]->zero_copy) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, SliceCollectives,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(Via::kZeroCopy, Via::kStaged, Via::kInline)),
    [](const ::testing::TestParamInfo<Param>& info) {
      return absl::StrCat("g", std::get<0>(info.param), "_", ViaName(std::get<1>(info.param)));
    });

TEST(SliceAsync, FuturesOfSpansGatherAndScatter) {
  const int g = 2;
  ClusterHarness h({g});
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<std::vector<double>> mine(g), all(g, std::vector<double>(2 * g));
  std::vector<std::vector<double>> grads(g, std::vector<double>(2 * g));
  std::vector<std::vector<double>> part(g, std::vector<double>(2));
  std::vector<std::future<absl::StatusOr<OpInfo>>> gathers, scatters;
  for (int r = 0; r < g; ++r) {
    mine[r] = {r + 0.5, r + 0.25};
    for (int k = 0; k < 2 * g; ++k) grads[r][k] = 10.0 * r + k;
    gathers.push_back(h.client(r).AllGatherAsync(absl::MakeConstSpan(mine[r]),
                                                 absl::MakeSpan(all[r])));
  }
  for (auto& f : gathers) ASSERT_TRUE(f.get().ok());
  for (int r = 0; r < g; ++r) {
    scatters.push_back(h.client(r).ReduceScatterAsync(
        absl::MakeConstSpan(grads[r]), absl::MakeSpan(part[r]), ReduceOp::kMax));
  }
  for (auto& f : scatters) ASSERT_TRUE(f.get().ok());
  for (int r = 0; r < g; ++r) {
    EXPECT_EQ(all[r], (std::vector<double>{0.5, 0.25, 1.5, 1.25})) << "rank " << r;
    // Max over ranks of slice r: rank 1's (10 + k) for k = 2r, 2r+1.
    EXPECT_EQ(part[r], (std::vector<double>{10.0 + 2 * r, 11.0 + 2 * r})) << "rank " << r;
  }
}

TEST(SliceErrors, BadSizesAreInvalidArgumentNamingTheWorldAndTheRingGoesOn) {
  const int g = 3;
  ClusterHarness h({g});
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<std::vector<float>> send(g, std::vector<float>(16, 1.0f));
  std::vector<std::vector<float>> recv(g, std::vector<float>(16, 0.0f));
  // All-gather of 3 per rank into 12: the world is 3, not 4.
  auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    return h.client(r).AllGather(send[r].data(), 3, recv[r].data(), 12,
                                 DType::kFloat32);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kInvalidArgument)
        << results[r].status();
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("recv_count 12 must be the ring's world (3) x send_count 3"));
  }
  // Reduce-scatter of 14 into 5 on rank 0 only: refused there, and the
  // others' copies fail at once naming rank 0 (the call is numbered alike).
  results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    return h.client(r).ReduceScatter(send[r].data(), r == 0 ? 14 : 12,
                                     recv[r].data(), r == 0 ? 5 : 4,
                                     DType::kFloat32, ReduceOp::kSum);
  });
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kInvalidArgument)
      << results[0].status();
  EXPECT_THAT(std::string(results[0].status().message()),
              HasSubstr("send_count 14 must be the ring's world (3) x recv_count 5 = 15"));
  for (int r : {1, 2}) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("rank 0 (worker-0"));
  }
  // Refused by the SDK before any call: null buffers, an invalid dtype.
  EXPECT_EQ(h.client(0).AllGather(nullptr, 3, recv[0].data(), 9, DType::kFloat32)
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.client(0).ReduceScatter(send[0].data(), 9, recv[0].data(), 3,
                                      static_cast<DType>(99), ReduceOp::kSum)
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  // Naive and the parameter server do not implement them: UNIMPLEMENTED.
  results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    OpOptions oo;
    oo.algorithm = Algorithm::kNaive;
    return h.client(r).AllGather(send[r].data(), 3, recv[r].data(), 9,
                                 DType::kFloat32, oo);
  });
  for (int r = 0; r < g; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kUnimplemented)
        << results[r].status();
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("the naive algorithm does not implement it"));
  }
  // The ring goes on: the next round is right on every rank.
  results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    std::fill(send[r].begin(), send[r].end(), static_cast<float>(r + 1));
    return h.client(r).ReduceScatter(send[r].data(), 12, recv[r].data(), 4,
                                     DType::kFloat32, ReduceOp::kSum);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(recv[r][0], 6.0f);
  }
}

TEST(SliceErrors, RootedCallsWithBadArgumentsFailEveryRankNamingTheProblem) {
  const int g = 3;
  ClusterHarness h({g});
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<std::vector<float>> a(g, std::vector<float>(6, 1.0f)),
      b(g, std::vector<float>(6, 0.0f));
  // A root outside the world on one rank.
  auto res = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    OpOptions o;
    o.timeout = absl::Seconds(10);
    return h.client(r).Reduce(a[r].data(), b[r].data(), 6, DType::kFloat32,
                              ReduceOp::kSum, r == 1 ? 5 : 0, o);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_FALSE(res[r].ok()) << "rank " << r;
  }
  EXPECT_EQ(res[1].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(res[1].status().message(), HasSubstr("root 5 is outside [0, 3)"));
  // A negative root is refused by the SDK itself.
  absl::StatusOr<OpInfo> neg = h.client(0).Gather(a[0].data(), 2, b[0].data(), 6,
                                                   DType::kFloat32, -1);
  EXPECT_EQ(neg.status().code(), absl::StatusCode::kInvalidArgument);
  // A scatter whose send_count is not world x recv_count names the world.
  auto bad = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    OpOptions o;
    o.timeout = absl::Seconds(10);
    return h.client(r).Scatter(a[r].data(), 5, b[r].data(), 2, DType::kFloat32, 0, o);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_FALSE(bad[r].ok());
    EXPECT_EQ(bad[r].status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad[r].status().message(), HasSubstr("world (3)"));
  }
  // The root passing a null recv to a reduce learns it, and the ring goes on.
  auto null_root = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    return h.client(r).Reduce(a[r].data(), r == 0 ? nullptr : b[r].data(), 6,
                              DType::kFloat32, ReduceOp::kSum, 0);
  });
  ASSERT_FALSE(null_root[0].ok());
  EXPECT_THAT(null_root[0].status().message(), HasSubstr("is the root"));
  auto next = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    return h.client(r).AllToAll(a[r].data(), b[r].data(), 6, DType::kFloat32);
  });
  for (int r = 0; r < g; ++r) EXPECT_TRUE(next[r].ok()) << next[r].status();
}

TEST(SliceErrors, RanksThatDisagreeFailNamingBoth) {
  const int g = 3;
  ClusterHarness h({g});
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<std::vector<int32_t>> send(g, std::vector<int32_t>(12, 1));
  std::vector<std::vector<int32_t>> recv(g, std::vector<int32_t>(12, 0));
  // Count: rank 2 gathers 3 per rank, the others 4.
  auto results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    const size_t n = r == 2 ? 3 : 4;
    return h.client(r).AllGather(send[r].data(), n, recv[r].data(), g * n,
                                 DType::kInt32);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    EXPECT_THAT(std::string(results[r].status().message()), HasSubstr("int32x12"));
    EXPECT_THAT(std::string(results[r].status().message()), HasSubstr("int32x9"));
  }
  // Kind: rank 1 all-reduces what the others reduce-scatter.
  results = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
    if (r == 1) {
      return h.client(r).AllReduce(send[r].data(), 12, DType::kInt32, ReduceOp::kSum);
    }
    return h.client(r).ReduceScatter(send[r].data(), 12, recv[r].data(), 4,
                                     DType::kInt32, ReduceOp::kSum);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("reduce_scatter #2 int32x12 sum"));
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("all_reduce #2 int32x12 sum"));
  }
}

// Whether every rank of `ranks` runs an operation within 10 s.
bool AllBusy(ClusterHarness& h, const std::vector<int>& ranks) {
  return halka::testing::WaitFor(
      [&] {
        for (int r : ranks) {
          Communicator* comm = h.cluster().worker(r)->communicator();
          if (comm == nullptr || !comm->GetProgress().busy) return false;
        }
        return true;
      },
      absl::Seconds(10));
}

// The same for reduce, gather, scatter and all-to-all: rank 2 dies while
// ranks 0, 1 and 3 wait in the call; each survivor fails naming it, before
// the deadline, whether it is the root or not.
TEST(SliceErrors, KilledWorkerIsNamedInEveryRootedCollective) {
  const int g = 4;
  for (const char* coll : {"reduce", "gather", "scatter", "all_to_all"}) {
    ClusterHarness h({g, /*ps_shards=*/0, /*chunk_bytes=*/1 << 20});
    ASSERT_TRUE(h.ok()) << h.status();
    const size_t n = 1 << 20;  // elements per slice
    std::vector<std::vector<float>> a(g, std::vector<float>(g * n, 1.0f)),
        b(g, std::vector<float>(g * n, 0.0f));
    const std::string dead =
        absl::StrCat("rank 2 (worker-2, ", h.cluster().worker_address(2), ")");
    const std::vector<int> survivors = {0, 1, 3};
    OpOptions oo;
    oo.timeout = absl::Seconds(20);
    const std::string which = coll;
    auto running = halka::testing::StartRanks<absl::StatusOr<OpInfo>>(
        survivors, [&](int r) -> absl::StatusOr<OpInfo> {
          Client& c = h.client(r);
          if (which == "reduce") {
            return c.Reduce(a[r].data(), b[r].data(), g * n, DType::kFloat32,
                            ReduceOp::kSum, 0, oo);
          }
          if (which == "gather") {
            return c.Gather(a[r].data(), n, b[r].data(), g * n,
                            DType::kFloat32, 0, oo);
          }
          if (which == "scatter") {
            return c.Scatter(a[r].data(), g * n, b[r].data(), n,
                             DType::kFloat32, 0, oo);
          }
          return c.AllToAll(a[r].data(), b[r].data(), g * n, DType::kFloat32,
                            oo);
        });
    ASSERT_TRUE(AllBusy(h, survivors))
        << which << ": ranks 0, 1 and 3 never all started";
    const std::vector<absl::StatusOr<OpInfo>> results =
        ClusterHarness::KillAndJoin(
            running, [&] { h.cluster().KillWorker(2); }, oo.timeout);
    for (size_t i = 0; i < survivors.size(); ++i) {
      ASSERT_FALSE(results[i].ok()) << which << " rank " << survivors[i];
      EXPECT_THAT(std::string(results[i].status().message()), HasSubstr(dead))
          << which << " rank " << survivors[i] << ": " << results[i].status();
    }
  }
}

TEST(SliceErrors, KilledWorkerIsNamedByEverySurvivorBeforeTheDeadline) {
  const int g = 4;
  ClusterHarness h({g, /*ps_shards=*/0, /*chunk_bytes=*/1 << 20});
  ASSERT_TRUE(h.ok()) << h.status();
  const size_t per_rank = 4 << 20;  // 16 MiB per rank, 64 MiB gathered
  std::vector<std::vector<float>> send(g, std::vector<float>(per_rank, 1.0f));
  std::vector<std::vector<float>> recv(g, std::vector<float>(g * per_rank));
  const std::string dead =
      absl::StrCat("rank 2 (worker-2, ", h.cluster().worker_address(2), ")");
  const std::vector<int> survivors = {0, 1, 3};
  OpOptions oo;
  oo.timeout = absl::Seconds(20);
  auto running = halka::testing::StartRanks<absl::StatusOr<OpInfo>>(
      survivors, [&](int r) {
        return h.client(r).AllGather(absl::MakeConstSpan(send[r]),
                                     absl::MakeSpan(recv[r]), oo);
      });
  ASSERT_TRUE(AllBusy(h, survivors))
      << "ranks 0, 1 and 3 never all started the all-gather";
  const std::vector<absl::StatusOr<OpInfo>> results = ClusterHarness::KillAndJoin(
      running, [&] { h.cluster().KillWorker(2); }, oo.timeout);
  for (size_t i = 0; i < survivors.size(); ++i) {
    ASSERT_FALSE(results[i].ok()) << "rank " << survivors[i];
    EXPECT_THAT(std::string(results[i].status().message()), HasSubstr(dead))
        << "rank " << survivors[i] << ": " << results[i].status();
  }
}

}  // namespace
}  // namespace halka
