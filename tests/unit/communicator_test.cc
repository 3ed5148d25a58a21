// The algorithms over the in-process transport: every rank on a thread.
#include "core/communicator.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/refused_reduction.h"
#include "tests/testing/run_ranks.h"
#include "core/testing/inproc_transport.h"
#include "tests/testing/inproc_ring.h"
#include "core/testing/reference.h"
#include "core/telemetry.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::InProcRing;
using halka::testing::RunRanks;

// A ring in rank order.
struct Ring : InProcRing {
  Ring(int g, size_t chunk_bytes, size_t eager_bytes = 64 << 10,
       int all_to_all_max_world = 16)
      : InProcRing(g, chunk_bytes, [&](CommConfig& c) {
          c.eager_bytes = eager_bytes;
          c.all_to_all_max_world = all_to_all_max_world;
        }) {}
};

// How an operation is carried: the algorithm and the control pattern.
enum class Mode { kRing, kRingWithRingFingerprints, kNaiveEager, kNaiveChunked, kAuto };
const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kRing: return "ring";
    case Mode::kRingWithRingFingerprints: return "ringfp";
    case Mode::kNaiveEager: return "naive_eager";
    case Mode::kNaiveChunked: return "naive_chunked";
    case Mode::kAuto: return "auto";
  }
  return "?";
}

using Param = std::tuple<int, DType, ReduceOp, Mode>;
class AllReduceTest : public ::testing::TestWithParam<Param> {};

TEST_P(AllReduceTest, MatchesReferenceAndAgreesBitwise) {
  const auto [g, dtype, op, mode] = GetParam();
  // A small chunk size so that every segment spans several chunks.
  Ring ring(g, 24, mode == Mode::kNaiveChunked ? 0 : 64 << 10,
            mode == Mode::kRingWithRingFingerprints ? 1 : 16);
  const Algorithm algorithm =
      mode == Mode::kAuto ? Algorithm::kAuto
      : (mode == Mode::kNaiveEager || mode == Mode::kNaiveChunked)
          ? Algorithm::kNaive
          : Algorithm::kRing;
  for (size_t count : {size_t{0}, size_t{1}, static_cast<size_t>(g > 1 ? g - 1 : 0),
                       static_cast<size_t>(g + 1), size_t{1001}}) {
    std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(dtype, op, count, g, 42);
    std::vector<std::vector<uint8_t>> bufs = inputs;
    auto results = ring.AllReduce(bufs, count, dtype, op, algorithm);
    if (RefusedEverywhere(dtype, op, results)) continue;
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(bufs[r], bufs[0]) << "rank " << r << " differs from rank 0";
      if (algorithm != Algorithm::kAuto && g > 1) {
        EXPECT_EQ(results[r]->algorithm, AlgorithmName(algorithm));
      }
    }
    const CheckResult check =
        CheckAllReduce(dtype, op, inputs, bufs[0].data(), count);
    EXPECT_EQ(check.wrong, 0u) << "count " << count << ": " << check.first;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, AllReduceTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 5, 8),
                       ::testing::ValuesIn(kAllDTypes),
                       ::testing::ValuesIn(kAllReduceOps),
                       ::testing::Values(Mode::kRing,
                                         Mode::kRingWithRingFingerprints,
                                         Mode::kNaiveEager,
                                         Mode::kNaiveChunked, Mode::kAuto)),
    [](const ::testing::TestParamInfo<Param>& info) {
      return absl::StrCat("g", std::get<0>(info.param), "_",
                          DTypeName(std::get<1>(info.param)), "_",
                          ReduceOpName(std::get<2>(info.param)), "_",
                          ModeName(std::get<3>(info.param)));
    });

TEST(AllReduceLarge, MillionElementsAcrossManyChunks) {
  const int g = 4;
  Ring ring(g, 64 * 1024);
  const size_t count = 1000003;
  std::vector<std::vector<uint8_t>> inputs =
      MakeRanksData(DType::kFloat32, ReduceOp::kSum, count, g, 7);
  std::vector<std::vector<uint8_t>> bufs = inputs;
  auto results = ring.AllReduce(bufs, count, DType::kFloat32, ReduceOp::kSum);
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(bufs[r], bufs[0]);
    // Ring traffic: each rank sends 2(G-1) segments of ~count/G elements.
    EXPECT_NEAR(static_cast<double>(results[r]->bytes_sent),
                2.0 * (g - 1) * count / g * 4, 2.0 * (g - 1) * 4);
  }
  EXPECT_EQ(CheckAllReduce(DType::kFloat32, ReduceOp::kSum, inputs,
                           bufs[0].data(), count)
                .wrong,
            0u);
}

// Reduce-scatter and all-gather: the ring's two halves over world slices.
using SliceParam = std::tuple<int, DType, ReduceOp>;
class ReduceScatterTest : public ::testing::TestWithParam<SliceParam> {};

TEST_P(ReduceScatterTest, RankRHoldsTheReductionOfSliceR) {
  const auto [g, dtype, op] = GetParam();
  Ring ring(g, 24);  // chunks of a few elements: slices span several
  const size_t es = DTypeSize(dtype);
  for (size_t recv_count : {size_t{0}, size_t{1}, size_t{7}, size_t{333}}) {
    std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(dtype, op, g * recv_count, g, 11);
    std::vector<std::vector<uint8_t>> bufs = inputs;
    auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      HostOpBuffer b(bufs[r].data());
      return ring.comms[r]->ReduceScatter(b, g * recv_count, recv_count,
                                          dtype, op, absl::ZeroDuration());
    });
    if (RefusedEverywhere(dtype, op, results)) continue;
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(results[r]->algorithm, "ring");
      const CheckResult check = CheckReduceScatter(
          dtype, op, inputs, bufs[r].data() + r * recv_count * es, r,
          recv_count);
      EXPECT_EQ(check.wrong, 0u)
          << "rank " << r << " recv_count " << recv_count << ": " << check.first;
      // Each rank sends (G-1)/G of the buffer.
      EXPECT_EQ(results[r]->bytes_sent, (g - 1) * recv_count * es);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, ReduceScatterTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::ValuesIn(kAllDTypes),
                       ::testing::ValuesIn(kAllReduceOps)),
    [](const ::testing::TestParamInfo<SliceParam>& info) {
      return absl::StrCat("g", std::get<0>(info.param), "_",
                          DTypeName(std::get<1>(info.param)), "_",
                          ReduceOpName(std::get<2>(info.param)));
    });

using GatherParam = std::tuple<int, DType>;
class AllGatherTest : public ::testing::TestWithParam<GatherParam> {};

TEST_P(AllGatherTest, EverySliceFromItsRankBitForBit) {
  const auto [g, dtype] = GetParam();
  Ring ring(g, 24);
  const size_t es = DTypeSize(dtype);
  for (size_t send_count : {size_t{0}, size_t{1}, size_t{5}, size_t{301}}) {
    // In place (the contribution already in slice r) and from slice 0.
    for (bool in_place : {true, false}) {
      std::vector<std::vector<uint8_t>> inputs;
      std::vector<std::vector<uint8_t>> bufs(
          g, std::vector<uint8_t>(g * send_count * es, 0xEE));
      for (int r = 0; r < g; ++r) {
        inputs.push_back(MakeRankData(dtype, ReduceOp::kSum, send_count, r, 5));
        const size_t at = in_place ? r * send_count * es : 0;
        std::copy(inputs[r].begin(), inputs[r].end(), bufs[r].begin() + at);
      }
      auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
        HostOpBuffer b(bufs[r].data());
        return ring.comms[r]->AllGather(b, send_count, g * send_count,
                                        in_place ? r : 0, dtype,
                                        absl::ZeroDuration(), Algorithm::kRing);
      });
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(results[r].ok()) << results[r].status();
        const CheckResult check =
            CheckAllGather(dtype, inputs, bufs[r].data(), send_count);
        EXPECT_EQ(check.wrong, 0u) << "rank " << r << " send_count "
                                   << send_count << " in_place " << in_place
                                   << ": " << check.first;
        EXPECT_EQ(results[r]->bytes_sent, (g - 1) * send_count * es);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, AllGatherTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::ValuesIn(kAllDTypes)),
    [](const ::testing::TestParamInfo<GatherParam>& info) {
      return absl::StrCat("g", std::get<0>(info.param), "_",
                          DTypeName(std::get<1>(info.param)));
    });

TEST(SliceCollectives, CountsThatDoNotFitTheWorldFailEveryRankAtOnce) {
  const int g = 3;
  Ring ring(g, 64);
  std::vector<std::vector<float>> bufs(g, std::vector<float>(12, 1.0f));
  // Every rank calls with recv_count 12 = 4 x 3, but the world is 3.
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    HostOpBuffer b(bufs[r].data());
    return ring.comms[r]->AllGather(b, 3, 12, 0, DType::kFloat32,
                                    absl::Seconds(20));
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kInvalidArgument)
        << results[r].status();
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("recv_count 12 must be the ring's world (3) x "
                          "send_count 3 = 9"));
  }
  // Only rank 1 is wrong: it is refused, and its peers' copies of the call
  // fail at once naming it (not at their deadline).
  results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    HostOpBuffer b(bufs[r].data());
    return ring.comms[r]->ReduceScatter(b, r == 1 ? 10 : 9, 3,
                                        DType::kFloat32, ReduceOp::kSum,
                                        absl::Seconds(20));
  });
  EXPECT_EQ(results[1].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(results[1].status().message()),
              HasSubstr("send_count 10 must be the ring's world (3) x "
                        "recv_count 3 = 9"));
  for (int r : {0, 2}) {
    EXPECT_EQ(results[r].status().code(),
              absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("rank 1 (w1, inproc:1) ended its call"));
  }
  // Naive and PS do not implement them.
  results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    HostOpBuffer b(bufs[r].data());
    return ring.comms[r]->ReduceScatter(b, 9, 3, DType::kFloat32,
                                        ReduceOp::kSum, absl::Seconds(20),
                                        r == 0 ? Algorithm::kParameterServer
                                               : Algorithm::kNaive);
  });
  for (int r = 0; r < g; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kUnimplemented)
        << results[r].status();
  }
  // The numbering held: the next round succeeds on every rank.
  results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    HostOpBuffer b(bufs[r].data());
    return ring.comms[r]->ReduceScatter(b, 9, 3, DType::kFloat32,
                                        ReduceOp::kSum, absl::Seconds(20));
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(bufs[r][3 * r], 3.0f);
  }
}

TEST(SliceCollectives, RanksThatDisagreeFailNamingBoth) {
  const int g = 3;
  Ring ring(g, 64);
  std::vector<std::vector<int32_t>> bufs(g, std::vector<int32_t>(12, 1));
  // Kind: rank 2 reduce-scatters what the others all-gather.
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    HostOpBuffer b(bufs[r].data());
    if (r == 2) {
      return ring.comms[r]->ReduceScatter(b, 12, 4, DType::kInt32,
                                          ReduceOp::kSum, absl::Seconds(20));
    }
    return ring.comms[r]->AllGather(b, 4, 12, r, DType::kInt32,
                                    absl::Seconds(20));
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("calls all_gather #1 int32x12"));
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("calls reduce_scatter #1 int32x12 sum"));
  }
  // Count and dtype: rank 0 gathers 3 per rank, rank 1 int64.
  results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    HostOpBuffer b(bufs[r].data());
    const size_t per_rank = r == 0 ? 3 : 2;
    return ring.comms[r]->AllGather(
        b, per_rank, g * per_rank, r,
        r == 1 ? DType::kInt64 : DType::kInt32, absl::Seconds(20));
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("all_gather #2 int32x9"));
  }
}

TEST(SliceCollectives, KilledRankIsNamedBeforeTheDeadline) {
  const int g = 4;
  Ring ring(g, 16);
  std::vector<std::vector<double>> bufs(g, std::vector<double>(4000, 1.0));
  std::vector<absl::StatusOr<OpResult>> results(g);
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    if (r == 3) continue;  // rank 3 dies before taking part
    threads.emplace_back([&, r] {
      HostOpBuffer b(bufs[r].data());
      results[r] = ring.comms[r]->AllGather(b, 1000, 4000, r,
                                            DType::kFloat64,
                                            absl::Seconds(10));
    });
  }
  absl::SleepFor(absl::Milliseconds(50));
  ring.net.Kill(3);
  for (auto& t : threads) t.join();
  for (int r : {0, 1, 2}) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("rank 3 (w3, inproc:3)"))
        << results[r].status();
  }
}

TEST(Inbox, CapsFramesQueuedPerSenderAndReportsTheNewest) {
  Inbox inbox(4);
  InFrame f;
  f.meta.kind = FrameKind::kData;
  for (size_t i = 0; i < Inbox::kMaxQueuedFrames; ++i) {
    f.meta.op_seq = 7;
    ASSERT_TRUE(inbox.Deliver(1, f).ok()) << i;
  }
  absl::Status s = inbox.Deliver(1, f);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(inbox.Deliver(2, f).ok());  // other senders are unaffected
  EXPECT_EQ(inbox.Deliver(9, f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(inbox.MaxOpSeqSeen(), 7u);
  // A newcomer adopts the newest operation nobody aborted.
  f.meta.op_seq = 9;
  ASSERT_TRUE(inbox.Deliver(2, f).ok());
  absl::StatusOr<uint64_t> seq =
      inbox.WaitFirstOpSeq(absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(*seq, 9u);
  InFrame abort;
  abort.meta.kind = FrameKind::kAbort;
  abort.meta.op_seq = 9;
  ASSERT_TRUE(inbox.Deliver(3, abort).ok());
  seq = inbox.WaitFirstOpSeq(absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(seq.status().code(), absl::StatusCode::kDeadlineExceeded);
}

// A watched peer whose link ended fails a wait for another peer only if
// it delivered nothing of the waiting operation: a rank that took part and
// then left (its frames all read) must not fail a slower peer's wait for a
// third rank's frame. A wait for the ended peer itself still reports it
// once its queue is empty, and a peer that never delivered still fails
// every wait at once.
TEST(Inbox, APeerThatTookPartAndLeftFailsOnlyWaitsForItself) {
  Inbox inbox(4);
  const std::vector<int> watch = {1, 2, 3};
  InFrame f;
  f.meta.kind = FrameKind::kData;
  f.meta.op_seq = 5;
  ASSERT_TRUE(inbox.Deliver(1, f).ok());
  auto ev = inbox.Next(1, 5, watch, absl::Now() + absl::Seconds(1));
  ASSERT_EQ(ev.type, Inbox::Event::kFrame);  // rank 1's frame, read
  inbox.LinkFailed(1, absl::UnavailableError("the link from rank 1 ended"));
  // Waiting for rank 2: rank 1's end does not fail it.
  ev = inbox.Next(2, 5, watch, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(ev.type, Inbox::Event::kTimeout);
  ASSERT_TRUE(inbox.Deliver(2, f).ok());
  ev = inbox.Next(2, 5, watch, absl::Now() + absl::Seconds(1));
  EXPECT_EQ(ev.type, Inbox::Event::kFrame);
  // Waiting for rank 1 itself: its end is reported.
  ev = inbox.Next(1, 5, watch, absl::Now() + absl::Seconds(1));
  EXPECT_EQ(ev.type, Inbox::Event::kLinkFailed);
  EXPECT_EQ(ev.peer, 1);
  // Rank 3 never delivered a frame of operation 5: its end fails a wait
  // for rank 2 at once.
  inbox.LinkFailed(3, absl::UnavailableError("the link from rank 3 ended"));
  ev = inbox.Next(2, 5, watch, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(ev.type, Inbox::Event::kLinkFailed);
  EXPECT_EQ(ev.peer, 3);
}

// A rank new in a running ring (no number yet) whose first call finds no
// operation to adopt, because the one its peers ran was aborted (a peer's
// call was refused): its next call pairs with theirs, not with the aborted
// one. (Found by the chaos scenario of system_faults: a restarted worker's
// call met a peer's refused call; the numbering stayed split a round.)
// Its call ends as the peers' copies did, naming the refusal.
TEST(Numbering, ANewRankWhoseAdoptionMetARefusedCallPairsWithTheNextCall) {
  const int g = 3;
  InProcRing ring(g, 1024, [](CommConfig& c) {
    if (c.rank == 2) c.first_op_seq = 0;  // just (re)joined
  });
  // Rank 0's call #1 is refused before it reaches the ring (its ABORT is
  // at every peer before they call); rank 1's copy fails at once; rank 2,
  // adopting, finds no live operation and fails at its deadline.
  ASSERT_TRUE(ring.comms[0]
                  ->SkipOp(1, absl::InvalidArgumentError("invalid dtype 99"),
                           absl::Now() + absl::Seconds(5))
                  .ok());
  absl::SleepFor(absl::Milliseconds(50));
  auto first = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) -> absl::StatusOr<OpResult> {
    if (r == 0) return absl::InvalidArgumentError("refused");
    std::vector<float> b(8, 1.0f);
    return ring.comms[r]->AllReduce(b.data(), b.size(), DType::kFloat32,
                                    ReduceOp::kSum,
                                    r == 2 ? absl::Milliseconds(300)
                                           : absl::Seconds(5));
  });
  // It ends as the peers' copies did, naming the refusal.
  EXPECT_EQ(first[2].status().code(), absl::StatusCode::kFailedPrecondition)
      << first[2].status();
  EXPECT_THAT(std::string(first[2].status().message()),
              HasSubstr("invalid dtype 99"));
  for (int r = 0; r < g; ++r) EXPECT_FALSE(first[r].ok()) << "rank " << r;
  // The next call runs on every rank, as one operation.
  std::vector<std::vector<float>> bufs(g, std::vector<float>(8, 1.0f));
  auto next = ring.AllReduce(bufs, 8, DType::kFloat32, ReduceOp::kSum);
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(next[r].ok()) << "rank " << r << ": " << next[r].status();
    EXPECT_EQ(next[r]->op_seq, 2u) << "rank " << r;
    EXPECT_EQ(bufs[r][0], 3.0f);
  }
}

// A ring of 3 whose rank 2 just (re)joined (it adopts its peers' number),
// with rank 0's ABORT of operation #7 (`code`) already in rank 2's inbox.
struct NewcomerAfterAnAbort {
  explicit NewcomerAfterAnAbort(absl::StatusCode code,
                                std::string message = "rank 0's call #7 ended")
      : ring(3, 1024, [](CommConfig& c) {
          if (c.rank == 2) c.first_op_seq = 0;
        }) {
    InFrame abort;
    abort.meta.kind = FrameKind::kAbort;
    abort.meta.op_seq = 7;
    abort.meta.origin_rank = 0;
    abort.meta.sender_rank = 0;
    abort.meta.abort_code = code;
    abort.meta.message = std::move(message);
    delivered = ring.net.inbox(2)->Deliver(0, abort);
  }
  absl::StatusOr<OpResult> NewcomersCall(absl::Duration timeout) {
    std::vector<float> b(8, 1.0f);
    return ring.comms[2]->AllReduce(b.data(), b.size(), DType::kFloat32,
                                    ReduceOp::kSum, timeout);
  }
  InProcRing ring;
  absl::Status delivered;
};

// A rank new in the ring whose call found only a peer's ABORT for the
// newest operation: a refusal (FAILED_PRECONDITION) moves the peers on, so
// its next call takes the number after it (the test above); an abort of a
// membership change (ABORTED) does not (the peers' untouched calls run
// again under that number on the new ring), so it stays ready to adopt.
TEST(Numbering, ANewRankTakesTheNextNumberOnlyAfterARefusal) {
  for (absl::StatusCode code : {absl::StatusCode::kFailedPrecondition,
                                absl::StatusCode::kAborted,
                                absl::StatusCode::kUnavailable}) {
    SCOPED_TRACE(absl::StatusCodeToString(code));
    NewcomerAfterAnAbort t(code);
    ASSERT_TRUE(t.delivered.ok()) << t.delivered;
    absl::StatusOr<OpResult> r = t.NewcomersCall(absl::Milliseconds(200));
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(t.ring.comms[2]->next_op_seq(),
              code == absl::StatusCode::kFailedPrecondition ? 8u : 0u);
  }
}

// The same rank's call, its wait to adopt a number ended not by its
// deadline but by a membership change. After a refusal of the peers'
// operation it ends as their copies did (FAILED_PRECONDITION, naming that
// number and the refusal, not marked untouched): the worker does not run
// it again on the new ring, where it would take the peers' next number
// and pair with their next call, leaving this rank one call ahead for
// good (system_faults' chaos: a restarted worker's call met a peer's
// refused upload, then a kill elsewhere). After an abort of a membership
// change it stays an untouched call that adopts again.
TEST(Numbering, ANewRanksCallInterruptedAfterARefusalEndsAsItsPeersCopies) {
  for (absl::StatusCode code : {absl::StatusCode::kFailedPrecondition,
                                absl::StatusCode::kAborted}) {
    SCOPED_TRACE(absl::StatusCodeToString(code));
    const std::string refusal =
        "rank 0 ended its call #7 before it reached the ring";
    NewcomerAfterAnAbort t(code, refusal);
    ASSERT_TRUE(t.delivered.ok()) << t.delivered;
    std::thread interrupter([&] {
      absl::SleepFor(absl::Milliseconds(100));
      t.ring.net.inbox(2)->Interrupt(
          absl::AbortedError("generation 1->2: rank 1 lost"));
    });
    absl::StatusOr<OpResult> r = t.NewcomersCall(absl::Seconds(5));
    interrupter.join();
    ASSERT_FALSE(r.ok());
    const auto untouched = r.status().GetPayload(kUntouchedPayload);
    if (code == absl::StatusCode::kFailedPrecondition) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
          << r.status();
      EXPECT_THAT(std::string(r.status().message()),
                  ::testing::AllOf(HasSubstr("all_reduce #7 "),
                                   HasSubstr("generation 1->2"),
                                   HasSubstr(refusal)));
      EXPECT_FALSE(untouched.has_value()) << r.status();
      EXPECT_EQ(t.ring.comms[2]->next_op_seq(), 8u);
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
      ASSERT_TRUE(untouched.has_value()) << r.status();
      EXPECT_EQ(std::string(*untouched), "0");
      EXPECT_EQ(t.ring.comms[2]->next_op_seq(), 0u);
    }
  }
}

// The same rank's own call refused before it reached the ring (SkipOp),
// when no live operation comes before its deadline and the peers' newest
// one was refused (a bad argument on every rank, say): it takes that
// number, already aborted everywhere (it sends no ABORT of its own), and
// the next call takes the one after. (Before, the refusal took no number,
// and the next call adopted the peers' next operation as the one after
// the refused one.) After an abort of a membership change it learns
// nothing and stays ready to adopt.
TEST(Numbering, ANewRanksRefusalAfterItsPeersRefusedTakesThatNumber) {
  for (absl::StatusCode code : {absl::StatusCode::kFailedPrecondition,
                                absl::StatusCode::kAborted}) {
    SCOPED_TRACE(absl::StatusCodeToString(code));
    NewcomerAfterAnAbort t(code);
    ASSERT_TRUE(t.delivered.ok()) << t.delivered;
    absl::StatusOr<uint64_t> skipped = t.ring.comms[2]->SkipOp(
        0, absl::InvalidArgumentError("invalid dtype 99"),
        absl::Now() + absl::Milliseconds(200));
    if (code == absl::StatusCode::kFailedPrecondition) {
      ASSERT_TRUE(skipped.ok()) << skipped.status();
      EXPECT_EQ(*skipped, 7u);
      EXPECT_EQ(t.ring.comms[2]->next_op_seq(), 8u);
      for (int peer : {0, 1}) {
        EXPECT_FALSE(t.ring.net.inbox(peer)->AbortSeen(7).has_value())
            << "rank " << peer;
      }
    } else {
      EXPECT_EQ(skipped.status().code(), absl::StatusCode::kDeadlineExceeded)
          << skipped.status();
      EXPECT_EQ(t.ring.comms[2]->next_op_seq(), 0u);
    }
  }
}

// A rank new in the ring (no number yet) whose call takes the number of
// the operation its peers were running, after their deadline had ended it
// without this rank, but before their ABORT saying so arrived (held on its
// way here). Its call fails (ABORTED: call again) and gives the peers'
// next number up: their next call fails at once naming it, not at their
// deadline, and the call after runs on every rank as one operation. Before,
// the rank stayed one number behind for good (system_faults'
// sigstop_hosts on a loaded machine). With fingerprints all-to-all and
// around the ring (each names the late rank its own way), and two
// newcomers at once (all-to-all names every fingerprint missing).
TEST(Numbering, ANewRankThatTookAnEndedOperationsNumberGivesTheNextUp) {
  struct Case {
    int g;
    int all_to_all_max;
    std::vector<int> newcomers;
  };
  for (const Case& k : {Case{3, 16, {2}}, Case{3, 1, {2}},
                        Case{4, 16, {2, 3}}}) {
    SCOPED_TRACE(absl::StrCat("g=", k.g, k.all_to_all_max == 1
                                             ? " fingerprints around the ring"
                                             : " fingerprints all-to-all",
                              ", newcomers ", k.newcomers.size()));
    const int g = k.g;
    const int peers = g - static_cast<int>(k.newcomers.size());
    auto is_new = [&](int r) { return r >= peers; };
    InProcRing ring(g, 1024, [&](CommConfig& c) {
      c.all_to_all_max_world = k.all_to_all_max;
      if (is_new(c.rank)) c.first_op_seq = 0;  // just (re)joined
    });
    // The peers' ABORTs to the newcomers stay on their way; each newcomer
    // says when it has sent its fingerprint of #1 (it took that number).
    std::vector<std::unique_ptr<absl::Notification>> took(g);
    for (auto& n : took) n = std::make_unique<absl::Notification>();
    ring.net.SetHold([&](int from, int to, const FrameMeta& m) {
      if (is_new(from) && m.kind == FrameKind::kFingerprint && m.op_seq == 1 &&
          !took[from]->HasBeenNotified()) {
        took[from]->Notify();
      }
      return is_new(to) && m.kind == FrameKind::kAbort;
    });
    auto call = [&](int r, absl::Duration timeout) {
      std::vector<float> b(8, 1.0f);
      absl::StatusOr<OpResult> res = ring.comms[r]->AllReduce(
          b.data(), b.size(), DType::kFloat32, ReduceOp::kSum, timeout,
          Algorithm::kRing);
      if (res.ok()) EXPECT_EQ(b[0], static_cast<float>(g)) << "rank " << r;
      return res;
    };
    // The peers run #1 without the newcomers and end it at their deadline.
    auto first = RunRanks<absl::StatusOr<OpResult>>(peers, [&](int r) {
      return call(r, absl::Milliseconds(300));
    });
    for (int r = 0; r < peers; ++r) {
      ASSERT_FALSE(first[r].ok()) << "rank " << r;
      // Naming the newcomer it waited for first.
      EXPECT_THAT(std::string(first[r].status().message()),
                  HasSubstr(absl::StrCat("w", g - 1)));
    }
    // Each newcomer's call takes #1 (the peers' fingerprints are here,
    // their ABORT is not) and learns it came late when the ABORT arrives.
    std::vector<absl::StatusOr<OpResult>> late(g, absl::UnknownError("-"));
    std::vector<std::thread> threads;
    for (int r = peers; r < g; ++r) {
      threads.emplace_back([&, r] { late[r] = call(r, absl::Seconds(10)); });
    }
    bool all_took = true;
    for (int r = peers; r < g; ++r) {
      all_took &= took[r]->WaitForNotificationWithTimeout(absl::Seconds(10));
    }
    ring.net.SetHold(nullptr);
    ring.net.ReleaseHeld();
    for (auto& t : threads) t.join();
    ASSERT_TRUE(all_took) << "a newcomer never sent its fingerprint of #1";
    for (int r = peers; r < g; ++r) {
      ASSERT_FALSE(late[r].ok()) << "rank " << r;
      EXPECT_EQ(late[r].status().code(), absl::StatusCode::kAborted)
          << late[r].status();
      EXPECT_THAT(std::string(late[r].status().message()),
                  HasSubstr("had ended it without this rank"));
      EXPECT_EQ(ring.comms[r]->next_op_seq(), 3u) << "rank " << r;
    }
    // The peers' next call (#2) is the one the newcomers' calls paired
    // with: it fails at once, naming a newcomer (at their 10 s deadline it
    // would be DEADLINE_EXCEEDED).
    auto second = RunRanks<absl::StatusOr<OpResult>>(peers, [&](int r) {
      return call(r, absl::Seconds(10));
    });
    for (int r = 0; r < peers; ++r) {
      ASSERT_FALSE(second[r].ok()) << "rank " << r;
      EXPECT_EQ(second[r].status().code(),
                absl::StatusCode::kFailedPrecondition)
          << second[r].status();
      EXPECT_THAT(std::string(second[r].status().message()),
                  HasSubstr("ended its call #2 before it reached the ring"));
    }
    // Then every rank pairs again.
    auto third = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      return call(r, absl::Seconds(10));
    });
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(third[r].ok()) << "rank " << r << ": " << third[r].status();
      EXPECT_EQ(third[r]->op_seq, 3u) << "rank " << r;
    }
  }
}

// Pieces of point-to-point messages wait apart from the collectives'
// frames: a collective waiting on the same sender neither sees them (no
// "already started a later operation") nor drops them, DropBefore leaves
// them, any-source takes the earliest arrival, and they count against the
// same byte budget.
TEST(Inbox, PeerPiecesWaitApartFromTheCollectives) {
  Inbox inbox(4);
  inbox.SetByteBudget(Inbox::ByteBudget{1000, 0});
  auto piece = [](uint64_t seq, size_t bytes) {
    InFrame f;
    f.meta.kind = FrameKind::kPeer;
    f.meta.op_seq = seq;
    f.meta.count = bytes;
    f.meta.message_bytes = bytes;
    auto data = std::make_shared<std::vector<uint8_t>>(bytes, 1);
    f.pieces.emplace_back(data->data(), data->size());
    f.keepalive = data;
    return f;
  };
  ASSERT_TRUE(inbox.Deliver(2, piece(40, 300)).ok());
  ASSERT_TRUE(inbox.Deliver(1, piece(1, 300)).ok());
  EXPECT_EQ(inbox.MaxOpSeqSeen(), 0u);  // not an operation's number
  const std::vector<int> watch = {1, 2};
  Inbox::Event ev =
      inbox.Next(2, 3, watch, absl::Now() + absl::Milliseconds(30));
  EXPECT_EQ(ev.type, Inbox::Event::kTimeout);  // no abort from rank 2
  inbox.DropBefore(100);
  // Over rank 2's budget (300 queued + 800 > 1000): refused, naming it.
  absl::Status over = inbox.Deliver(2, piece(41, 800));
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  ev = inbox.NextPeer(-1, absl::Now() + absl::Seconds(1));
  ASSERT_EQ(ev.type, Inbox::Event::kFrame);
  EXPECT_EQ(ev.peer, 2);  // arrived first
  EXPECT_EQ(ev.frame.meta.op_seq, 40u);
  ev = inbox.NextPeer(1, absl::Now() + absl::Seconds(1));
  ASSERT_EQ(ev.type, Inbox::Event::kFrame);
  EXPECT_EQ(ev.peer, 1);
  EXPECT_EQ(inbox.queued_bytes(), 0u);
  EXPECT_TRUE(inbox.Deliver(2, piece(41, 800)).ok());  // budget given back
  ev = inbox.NextPeer(3, absl::Now() + absl::Milliseconds(30));
  EXPECT_EQ(ev.type, Inbox::Event::kTimeout);
  inbox.LinkFailed(3, absl::UnavailableError("cut"));
  ev = inbox.NextPeer(3, absl::Now() + absl::Seconds(1));
  EXPECT_EQ(ev.type, Inbox::Event::kLinkFailed);
  EXPECT_EQ(ev.peer, 3);
  EXPECT_EQ(inbox.LinkFailure(3).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(inbox.LinkFailure(2).ok());
}

// A sender that finished and left (torch's monitored_barrier: rank 0
// answers everyone, then exits): what its send handed over is still
// received after the membership change interrupts the receiver; the next
// recv from it fails, naming the change, within the grace; a shutdown
// fails a recv at once.
TEST(PointToPoint, WhatWasSentBeforeAMembershipChangeIsStillTaken) {
  Ring ring(3, 16);  // a 100-byte message is 7 pieces
  std::vector<uint8_t> sent(100), got(100, 0);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<uint8_t>(i * 7 + 3);
  HostOpBuffer out(sent.data());
  absl::StatusOr<OpResult> s =
      ring.comms[1]->Send(out, sent.size(), 0, 5, absl::Seconds(5));
  ASSERT_TRUE(s.ok()) << s.status();
  ring.comms[0]->Abort(absl::AbortedError(
      "job j generation 1->2: rank 1 (w1, inproc:1) left"));
  HostOpBuffer in(got.data());
  absl::StatusOr<OpResult> r =
      ring.comms[0]->Recv(in, got.size(), 1, 5, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(got, sent);
  EXPECT_EQ(r->peer, 1);
  absl::Time start = absl::Now();
  r = ring.comms[0]->Recv(in, got.size(), 1, 5, absl::Seconds(20));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("rank 1 (w1, inproc:1) left"));
  ring.comms[0]->Abort(absl::UnavailableError("worker is shutting down"));
  start = absl::Now();
  r = ring.comms[0]->Recv(in, got.size(), 2, 5, absl::Seconds(20));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("shutting down"));
}

// A recv from any source matches by tag, as gloo's and MPI's: a message of
// another tag stays queued for the recv that asks for it (torch's
// monitored_barrier messages beside a user's any-source recv).
TEST(PointToPoint, AnySourceTakesOnlyItsTag) {
  Ring ring(3, 16);
  std::vector<uint8_t> a(40, 1), b(40, 2), got(40, 0);
  HostOpBuffer from1(a.data()), from2(b.data()), in(got.data());
  ASSERT_TRUE(ring.comms[1]->Send(from1, a.size(), 0, 7, absl::Seconds(5)).ok());
  ASSERT_TRUE(ring.comms[2]->Send(from2, b.size(), 0, 5, absl::Seconds(5)).ok());
  absl::StatusOr<OpResult> r =
      ring.comms[0]->Recv(in, got.size(), -1, 5, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->peer, 2);
  EXPECT_EQ(got, b);
  r = ring.comms[0]->Recv(in, got.size(), -1, 5, absl::Milliseconds(200));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  r = ring.comms[0]->Recv(in, got.size(), -1, 7, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->peer, 1);
  EXPECT_EQ(got, a);
}

// Receives run one at a time, in call order, and each within its own
// deadline: a recv queued behind one that waits fails at its deadline,
// saying why; the one that waited, and the next after it, still get their
// messages in the order called.
TEST(PointToPoint, AQueuedRecvEndsAtItsOwnDeadline) {
  Ring ring(3, 16);
  std::vector<uint8_t> first(30, 0), second(30, 0), third(30, 0);
  absl::StatusOr<OpResult> waited;
  std::thread early([&] {
    HostOpBuffer in(first.data());
    waited = ring.comms[0]->Recv(in, first.size(), 1, 1, absl::Seconds(10));
  });
  absl::SleepFor(absl::Milliseconds(100));  // the first recv holds the turn
  HostOpBuffer in2(second.data());
  const absl::Time start = absl::Now();
  absl::StatusOr<OpResult> queued =
      ring.comms[0]->Recv(in2, second.size(), 2, 1, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_EQ(queued.status().code(), absl::StatusCode::kDeadlineExceeded)
      << queued.status();
  EXPECT_THAT(std::string(queued.status().message()),
              HasSubstr("an earlier recv on this rank still waited"));
  std::vector<uint8_t> a(30, 4), b(30, 5);
  HostOpBuffer out1(a.data()), out2(b.data());
  ASSERT_TRUE(ring.comms[2]->Send(out2, b.size(), 0, 1, absl::Seconds(5)).ok());
  ASSERT_TRUE(ring.comms[1]->Send(out1, a.size(), 0, 1, absl::Seconds(5)).ok());
  early.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(first, a);
  HostOpBuffer in3(third.data());
  absl::StatusOr<OpResult> next =
      ring.comms[0]->Recv(in3, third.size(), 2, 1, absl::Seconds(5));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(third, b);
}

TEST(Broadcast, FromEveryRoot) {
  for (int g : {1, 2, 3, 6}) {
    Ring ring(g, 40);
    ring.ExpectBroadcastFromEveryRoot();
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(Broadcast, RootOutOfRangeIsInvalidArgument) {
  Ring ring(2, 64);
  int64_t x = 0;
  auto s = ring.comms[0]->Broadcast(&x, 1, DType::kInt64, 2,
                                    absl::ZeroDuration());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Barrier, AllRanksPass) {
  Ring ring(5, 64);
  auto results = RunRanks<absl::StatusOr<OpResult>>(
      5, [&](int r) { return ring.comms[r]->Barrier(absl::ZeroDuration()); });
  for (auto& r : results) EXPECT_TRUE(r.ok()) << r.status();
}

TEST(Mismatch, DifferentCountFailsEveryRankNamingBoth) {
  const int g = 4;
  Ring ring(g, 64);
  std::vector<std::vector<float>> bufs(g, std::vector<float>(100, 1.0f));
  const absl::Time start = absl::Now();
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    const size_t count = r == 2 ? 99 : 100;
    return ring.comms[r]->AllReduce(bufs[r].data(), count, DType::kFloat32,
                                    ReduceOp::kSum, absl::ZeroDuration());
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // auto runs recursive doubling here: the pair that meets the mismatch
  // names both calls, and every other rank fails with its ABORT, which
  // carries that text and code.
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    const std::string m(results[r].status().message());
    EXPECT_THAT(m, HasSubstr("ranks disagree on the operation"));
    EXPECT_THAT(m, HasSubstr("all_reduce #1 float32x100 sum"));
    EXPECT_THAT(m, HasSubstr("all_reduce #1 float32x99 sum"));
    EXPECT_THAT(m, HasSubstr("rank 2 (w2, inproc:2)"));
    // Nothing moved: the buffers are untouched.
    EXPECT_EQ(bufs[r][0], 1.0f);
  }
  // The ring is usable afterwards.
  auto again = ring.AllReduce(bufs, 100, DType::kFloat32, ReduceOp::kSum);
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(again[r].ok()) << again[r].status();
    EXPECT_EQ(bufs[r][5], 4.0f);
  }
}

TEST(Mismatch, DifferentDtypeAndOpAndKind) {
  const int g = 3;
  Ring ring(g, 64);
  std::vector<std::vector<int64_t>> bufs(g, std::vector<int64_t>(10, 1));
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    if (r == 1) {
      return ring.comms[r]->AllReduce(bufs[r].data(), 10, DType::kInt64,
                                      ReduceOp::kMax, absl::ZeroDuration());
    }
    return ring.comms[r]->AllReduce(bufs[r].data(), 10, DType::kInt64,
                                    ReduceOp::kSum, absl::ZeroDuration());
  });
  for (int r = 0; r < g; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(results[r].status().message()), HasSubstr("max"));
  }
  results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    if (r == 2) return ring.comms[r]->Barrier(absl::ZeroDuration());
    return ring.comms[r]->AllReduce(bufs[r].data(), 10, DType::kInt64,
                                    ReduceOp::kSum, absl::ZeroDuration());
  });
  for (int r = 0; r < g; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(results[r].status().message()), HasSubstr("barrier #2"));
  }
}

// The ring's first step leaves while the fingerprints are still in flight
// (all-to-all fingerprints). A disagreement found afterwards must still
// leave every buffer as it was, fail every rank naming both sides, and leave
// the ring usable: the early frames are never reduced, and are dropped.
TEST(Mismatch, RingFirstStepSentEarlyTouchesNoBuffer) {
  const int g = 4;
  const size_t n = 1000;
  Ring ring(g, /*chunk_bytes=*/256);
  auto fill = [&](std::vector<std::vector<float>>& bufs) {
    for (int r = 0; r < g; ++r) {
      for (size_t i = 0; i < n; ++i) {
        bufs[r][i] = static_cast<float>((i % 13) + 100 * (r + 1));
      }
    }
  };
  std::vector<std::vector<float>> bufs(g, std::vector<float>(n));
  fill(bufs);
  const std::vector<std::vector<float>> before = bufs;
  // Rank 2 disagrees on the count, rank 1 on the reduce op: frames of every
  // plan reach their successors before anyone knows.
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    return ring.comms[r]->AllReduce(bufs[r].data(), r == 2 ? n - 1 : n,
                                    DType::kFloat32,
                                    r == 1 ? ReduceOp::kMax : ReduceOp::kSum,
                                    absl::ZeroDuration(), Algorithm::kRing);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("ranks disagree on the operation"));
    EXPECT_EQ(bufs[r], before[r]) << "rank " << r << "'s buffer was touched";
  }
  // Every rank's first step did leave early: a data send (bytes > 0) booked
  // inside the fingerprint phase.
  for (int r = 0; r < g; ++r) {
    EXPECT_TRUE(ring.SentDataBeforeAgreeing(r))
        << "rank " << r << " sent no data before agreeing";
    // ... together with the fingerprints (HeldWrites): every frame of its
    // fingerprint phase, its 3 fingerprints and its segment's 4 chunks of
    // 256 bytes, left at one release.
    EXPECT_EQ(ring.net.WritesHeld(r), size_t{(g - 1) + 4}) << "rank " << r;
    EXPECT_EQ(ring.SendsBeforeAgreeing(r), size_t{(g - 1) + 4}) << "rank " << r;
  }
  // The next call, issued alike, is exact on every rank.
  auto again =
      ring.AllReduce(bufs, n, DType::kFloat32, ReduceOp::kSum,
                     Algorithm::kRing);
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(again[r].ok()) << again[r].status();
    for (size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(g * (i % 13) + 100 * (1 + 2 + 3 + 4));
      ASSERT_EQ(bufs[r][i], want) << "rank " << r << " element " << i;
    }
  }
}

// With fingerprints forwarded around the ring (G above the all-to-all
// limit) nothing leaves early: a fingerprint must not queue behind data on
// the link that forwards it.
TEST(Mismatch, RingFingerprintsAroundTheRingSendNoDataEarly) {
  const int g = 3;
  Ring ring(g, 256, 64 << 10, /*all_to_all_max_world=*/2);
  std::vector<std::vector<float>> bufs(g, std::vector<float>(300, 1.0f));
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    return ring.comms[r]->AllReduce(bufs[r].data(), r == 0 ? 299 : 300,
                                    DType::kFloat32, ReduceOp::kSum,
                                    absl::ZeroDuration(), Algorithm::kRing);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << results[r].status();
    EXPECT_EQ(bufs[r], std::vector<float>(300, 1.0f));
    // GetTrace returns a copy: keep it alive while its spans are read.
    const std::vector<TraceOp> trace = ring.comms[r]->GetTrace();
    ASSERT_FALSE(trace.empty());
    for (const TraceSpan& s : trace.back().spans) {
      EXPECT_FALSE(s.kind == TraceSpan::Kind::kSend && s.bytes > 0)
          << "rank " << r << " sent data in a failed op";
    }
  }
}

TEST(Deadline, MissingRankIsNamed) {
  const int g = 3;
  Ring ring(g, 64);
  std::vector<std::vector<float>> bufs(g, std::vector<float>(10, 1.0f));
  // Rank 1 never calls.
  std::vector<absl::StatusOr<OpResult>> results(g);
  const absl::Time start = absl::Now();
  std::thread t0([&] {
    results[0] = ring.comms[0]->AllReduce(bufs[0].data(), 10, DType::kFloat32,
                                          ReduceOp::kSum, absl::Milliseconds(300));
  });
  std::thread t2([&] {
    results[2] = ring.comms[2]->AllReduce(bufs[2].data(), 10, DType::kFloat32,
                                          ReduceOp::kSum, absl::Milliseconds(300));
  });
  t0.join();
  t2.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  // Rank 2 waits on its predecessor, rank 1, and says so.
  EXPECT_EQ(results[2].status().code(), absl::StatusCode::kDeadlineExceeded)
      << results[2].status();
  EXPECT_THAT(std::string(results[2].status().message()),
              HasSubstr("waiting for rank 1 (w1, inproc:1) in fingerprint step 0"));
  // Rank 0 either times out waiting for rank 2 or hears rank 2's abort.
  EXPECT_FALSE(results[0].ok());
  EXPECT_THAT(std::string(results[0].status().message()), HasSubstr("rank 1"));
}

TEST(Failure, KilledRankIsNamedByEverySurvivor) {
  const int g = 4;
  Ring ring(g, 16);
  std::vector<std::vector<double>> bufs(g, std::vector<double>(5000, 1.0));
  std::vector<absl::StatusOr<OpResult>> results(g);
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    if (r == 2) continue;  // rank 2 dies before taking part
    threads.emplace_back([&, r] {
      results[r] = ring.comms[r]->AllReduce(bufs[r].data(), 5000,
                                            DType::kFloat64, ReduceOp::kSum,
                                            absl::Seconds(10));
    });
  }
  absl::SleepFor(absl::Milliseconds(50));
  ring.net.Kill(2);
  const absl::Time killed = absl::Now();
  for (auto& t : threads) t.join();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5));
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("rank 2 (w2, inproc:2)"))
        << results[r].status();
  }
}

TEST(Failure, CorruptFrameIsDataLossNotAWrongResult) {
  const int g = 3;
  Ring ring(g, 64);
  ring.net.SetTamper(1, [](FrameMeta& m) {
    if (m.kind == FrameKind::kData && m.phase == Phase::kAllGather) m.offset += 1;
  });
  std::vector<std::vector<float>> bufs(g, std::vector<float>(300, 1.0f));
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    return ring.comms[r]->AllReduce(bufs[r].data(), 300, DType::kFloat32,
                                    ReduceOp::kSum, absl::Seconds(5),
                                    Algorithm::kRing);
  });
  // A rank whose own data arrived intact may finish; no rank may report
  // success with a wrong buffer.
  for (int r = 0; r < g; ++r) {
    if (results[r].ok()) {
      EXPECT_EQ(bufs[r], std::vector<float>(300, 3.0f)) << "rank " << r;
    }
  }
  EXPECT_EQ(results[2].status().code(), absl::StatusCode::kDataLoss)
      << results[2].status();
  EXPECT_THAT(std::string(results[2].status().message()),
              HasSubstr("corrupt frame from rank 1"));
}

TEST(Limits, OversizedOperationIsResourceExhausted) {
  CommConfig c;
  c.members.push_back(PeerInfo{0, "w0", "a"});
  c.max_op_bytes = 1024;
  InProcNetwork net(1);
  Communicator comm(c, net.transport(0), net.inbox(0));
  std::vector<float> big(1000);
  auto s = comm.AllReduce(big.data(), big.size(), DType::kFloat32,
                          ReduceOp::kSum, absl::ZeroDuration());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
}

// One booking per event feeds links (live), edges_total and last_op (when
// the operation ends) and the window, with the same numbers.
TEST(OpTelemetry, OneBookingFeedsEveryView) {
  using WaitEnd = OpTelemetry::WaitEnd;
  const absl::Time t = absl::FromUnixSeconds(1000);
  OpTelemetry ledger;
  ledger.BeginOp();
  ledger.BookSend(t, 1, 400, absl::Milliseconds(2), /*ok=*/true);
  ledger.BookSend(t, 1, 100, absl::Milliseconds(1), /*ok=*/false);
  ledger.BookWait(t, WaitEnd::kFrame, 2, 300, absl::Milliseconds(10));
  ledger.BookWait(t, WaitEnd::kFrame, 2, 300, absl::Milliseconds(30));
  ledger.BookWait(t, WaitEnd::kLinkFailed, 3, 0, absl::Milliseconds(5));
  ledger.BookWait(t, WaitEnd::kOther, 2, 0, absl::Milliseconds(7));
  ledger.BookReduce(t, 2, absl::Milliseconds(4));
  ledger.BookReduceTotal(absl::Milliseconds(6));

  // Mid-operation: links and the scalar sums are live, the per-edge totals
  // wait for the end of the operation.
  Telemetry mid = ledger.Snapshot(t);
  ASSERT_EQ(mid.links.size(), 2u);  // peer 3 only failed: no link entry
  EXPECT_EQ(mid.links[1].sent, 400u);
  EXPECT_EQ(mid.links[2].received, 600u);
  EXPECT_TRUE(mid.edges_total.empty());
  EXPECT_NEAR(mid.send_seconds, 0.003, 1e-12);
  EXPECT_NEAR(mid.wait_seconds, 0.052, 1e-12);
  EXPECT_NEAR(mid.reduce_seconds, 0.006, 1e-12);
  EXPECT_EQ(mid.window.edges[1].bytes_sent, 400u);
  EXPECT_EQ(mid.window.edges[1].errors, 1u);
  EXPECT_EQ(mid.window.edges[2].chunks_received, 2u);
  EXPECT_EQ(mid.window.edges[3].errors, 1u);

  OpTelemetry::OpEnd end;
  end.kind = OpKind::kAllReduce;
  end.algorithm = "ring";
  end.status = absl::UnavailableError("link broke");
  end.elapsed = absl::Milliseconds(70);
  end.chunk_bytes = 64;
  end.op_bytes = 1000;
  const LinkBytes moved = ledger.EndOp(t, end);
  EXPECT_EQ(moved.sent, 400u);
  EXPECT_EQ(moved.received, 600u);

  Telemetry after = ledger.Snapshot(t);
  ASSERT_EQ(after.edges_total.size(), 3u);
  for (const std::map<int, EdgeStats>* edges :
       {&after.edges_total, &after.last_op.edges, &after.window.edges}) {
    EXPECT_EQ(edges->at(1).bytes_sent, 400u);
    EXPECT_EQ(edges->at(1).errors, 1u);
    EXPECT_EQ(edges->at(2).bytes_received, 600u);
    EXPECT_NEAR(edges->at(2).wait_seconds, 0.040, 1e-12);
    EXPECT_NEAR(edges->at(2).reduce_seconds, 0.004, 1e-12);
    EXPECT_EQ(edges->at(2).chunks_received, 2u);
    EXPECT_EQ(edges->at(3).errors, 1u);
  }
  // Send time: every send in the sums, only sends that went through in
  // the window.
  EXPECT_NEAR(after.edges_total[1].send_seconds, 0.003, 1e-12);
  EXPECT_NEAR(after.window.edges[1].send_seconds, 0.002, 1e-12);
  EXPECT_EQ(after.links[1].sent, 400u);
  EXPECT_EQ(after.links[2].received, 600u);
  EXPECT_NEAR(after.last_op.edges[2].wait_p99_seconds, 0.030, 1e-12);
  EXPECT_EQ(after.last_op.ops, 1u);
  EXPECT_EQ(after.bytes_sent, 400u);
  EXPECT_EQ(after.bytes_received, 600u);
  EXPECT_EQ(after.ops_failed, 1u);
  EXPECT_EQ(after.last_error, "link broke");
  EXPECT_EQ(after.last_algorithm, "ring");
  EXPECT_EQ(after.last_op_bytes, 1000u);
  EXPECT_EQ((after.ops_by_label[{"all_reduce", "ring", "error"}]), 1u);
  EXPECT_EQ(after.latency_count, 1u);
  EXPECT_EQ(after.window.ops, 1u);

  // A ring that replaces this one keeps counting, and bytes of an
  // operation still running when it took over stay in links only.
  ledger.BeginOp();
  ledger.BookSend(t, 1, 50, absl::Milliseconds(1), /*ok=*/true);
  OpTelemetry next;
  next.InheritFrom(ledger);
  next.BeginOp();
  Telemetry inherited = next.Snapshot(t);
  EXPECT_EQ(inherited.links[1].sent, 450u);
  EXPECT_EQ(inherited.edges_total[1].bytes_sent, 400u);
  EXPECT_EQ(inherited.ops_failed, 1u);
}

// Every byte a ring all-reduce moves shows once, alike, in the result, the
// links, the per-edge totals, the last operation and the window.
TEST(Telemetry, RingAllReduceBooksEachByteOnce) {
  const int g = 3;
  const size_t count = 3000;
  Ring ring(g, 256);
  std::vector<std::vector<float>> bufs(g, std::vector<float>(count, 1.0f));
  auto results =
      ring.AllReduce(bufs, count, DType::kFloat32, ReduceOp::kSum,
                     Algorithm::kRing);
  // 2(G-1) segments of count/G floats each way.
  const uint64_t expected = 2 * (g - 1) * (count / g) * sizeof(float);
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    const int succ = (r + 1) % g;
    const int pred = (r + g - 1) % g;
    EXPECT_EQ(results[r]->bytes_sent, expected);
    EXPECT_EQ(results[r]->bytes_received, expected);
    Telemetry t = ring.comms[r]->GetTelemetry();
    EXPECT_EQ(t.bytes_sent, expected);
    EXPECT_EQ(t.links[succ].sent, expected);
    EXPECT_EQ(t.links[pred].received, expected);
    EXPECT_EQ(t.edges_total[succ].bytes_sent, expected);
    EXPECT_EQ(t.edges_total[pred].bytes_received, expected);
    EXPECT_EQ(t.last_op.edges[succ].bytes_sent, expected);
    EXPECT_EQ(t.window.edges[succ].bytes_sent, expected);
    EXPECT_EQ(t.window.edges[pred].bytes_received, expected);
    EXPECT_EQ(t.ops_completed, 1u);
    EXPECT_EQ(t.last_algorithm, "ring");
  }
}

}  // namespace
}  // namespace halka
