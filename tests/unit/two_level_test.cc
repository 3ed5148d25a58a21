// The two-level all-reduce (Algorithm::kTwoLevel, core/algorithms/ring.cc)
// on in-process rings whose members sit on hosts (CommConfig::hosts, as the
// rendezvous publishes them): every rank ends with the same bits, within
// the reference's bound (exact for integers, MIN and MAX); the data that
// crosses between hosts is exactly 2(H-1)/H of the buffer per cross-host
// ring, and goes only to the rank of the same local position on the next
// host; hosts it cannot use (one host, one rank per host, uneven hosts)
// run the flat ring; auto takes it above eager_bytes where it is usable.
// Its reduce-scatter and all-gather (TwoLevelSlices): every rank's slice
// within the reference (all-gather: exact), only the cross-host rings of
// the same local position crossing hosts, with (H-1)/H of the buffer per
// host; auto takes them wherever the hosts allow.
#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/algorithms/algorithms.h"
#include "core/communicator.h"
#include "core/op_buffer.h"
#include "core/ring_plan.h"
#include "core/telemetry.h"
#include "core/testing/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/hosts.h"
#include "tests/testing/inproc_ring.h"

namespace halka {
namespace {

using halka::testing::HostOf;
using halka::testing::Hosts;
using halka::testing::InProcRing;
using halka::testing::Name;
using halka::testing::OrderOf;
using halka::testing::RunRanks;
using halka::testing::WorldOf;

struct HostRing : InProcRing {
  HostRing(const Hosts& hosts, size_t chunk_bytes, int fp_world)
      : InProcRing(WorldOf(hosts), chunk_bytes, [&](CommConfig& c) {
          c.ring_order = OrderOf(hosts);
          c.hosts = hosts;
          c.all_to_all_max_world = fp_world;
        }) {}
};

// 2x2, 2x3, 4x2, 3x2 with hosts interleaved in rank order, 2x4.
std::vector<Hosts> Shapes() {
  return {{{0, 1}, {2, 3}},
          {{0, 1, 2}, {3, 4, 5}},
          {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
          {{0, 3}, {1, 4}, {2, 5}},
          {{0, 2, 4, 6}, {1, 3, 5, 7}}};
}

// Shapes, and whether two-level can run on them.
std::vector<std::pair<Hosts, bool>> UsableOrNot() {
  return {{{{0, 1}, {2, 3}}, true},
          {{{0, 3}, {1, 4}, {2, 5}}, true},
          {{{0, 1, 2}, {3}}, false},
          {{{0, 1, 2, 3}}, false},
          {{{0}, {1}, {2}}, false}};
}

TEST(TwoLevel, EveryShapeCountOpAndDtypeAgreesEverywhereAndWithTheReference) {
  for (const Hosts& hosts : Shapes()) {
    for (int fp_world : {16, 1}) {  // fingerprints all-to-all, around the ring
      SCOPED_TRACE(absl::StrCat(Name(hosts), " fp_world ", fp_world));
      HostRing(hosts, 40, fp_world)
          .ExpectAllReduceMatrixAgrees(Algorithm::kTwoLevel, "two_level", 11);
    }
  }
}

TEST(TwoLevel, OnlyTheCrossHostRingsCrossHostsAndWithTheirShareOnly) {
  for (const Hosts& hosts : Shapes()) {
    SCOPED_TRACE(Name(hosts));
    HostRing ring(hosts, 4096, 16);
    const int g = ring.g;
    const int h = static_cast<int>(hosts.size());
    const size_t count = 6000;
    const std::vector<std::map<int, uint64_t>> sent_by =
        ring.SentDuringAllReduce(count, Algorithm::kTwoLevel);
    uint64_t across = 0;
    for (int r = 0; r < g; ++r) {
      const int host = HostOf(hosts, r);
      const auto& mine = hosts[static_cast<size_t>(host)];
      const int local = static_cast<int>(
          std::find(mine.begin(), mine.end(), r) - mine.begin());
      const int cross_succ =
          hosts[static_cast<size_t>((host + 1) % h)][static_cast<size_t>(local)];
      for (auto [peer, sent] : sent_by[r]) {
        if (HostOf(hosts, peer) == host) continue;
        if (peer == cross_succ) {
          EXPECT_GT(sent, 0u) << r << "->" << peer;
          across += sent;
        } else {
          EXPECT_EQ(sent, 0u) << r << "->" << peer << " crosses hosts";
        }
      }
    }
    // Each cross-host ring all-reduces its part: 2(H-1) steps that together
    // carry the part once per step; the parts make up the buffer.
    EXPECT_EQ(across, 2u * static_cast<uint64_t>(h - 1) * count * 4)
        << "payload bytes across hosts";
  }
}

TEST(TwoLevel, HostsItCannotUseRunTheFlatRing) {
  const std::vector<Hosts> unusable = {
      {{0, 1, 2, 3}},          // one host
      {{0}, {1}, {2}},         // one rank per host
      {{0, 1, 2}, {3}},        // uneven
      {}};                     // not known
  for (const Hosts& hosts : unusable) {
    SCOPED_TRACE(Name(hosts));
    const int g = hosts.empty() ? 3 : WorldOf(hosts);
    InProcRing ring(g, 64, [&](CommConfig& c) {
      c.ring_order = OrderOf(hosts);
      c.hosts = hosts;
    });
    EXPECT_FALSE(TwoLevelUsable(ring.comms[0]->config()));
    const size_t count = 300;
    std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(DType::kInt64, ReduceOp::kSum, count, g, 2);
    std::vector<std::vector<uint8_t>> bufs = inputs;
    auto results = ring.AllReduce(bufs, count, DType::kInt64, ReduceOp::kSum,
                                  Algorithm::kTwoLevel);
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(results[r]->algorithm, "ring");
      EXPECT_EQ(bufs[r], bufs[0]);
    }
    EXPECT_EQ(CheckAllReduce(DType::kInt64, ReduceOp::kSum, inputs,
                             bufs[0].data(), count).wrong, 0u);
  }
}

// auto above eager_bytes: two-level on hosts it can use, the flat ring on
// hosts it cannot; at or below eager_bytes as before (naive on these
// worlds of at most all_to_all_max_world ranks).
TEST(TwoLevel, AutoTakesItAboveEagerBytesWhereHostsAllowIt) {
  for (const auto& [hosts, usable] : UsableOrNot()) {
    for (int fp_world : {16, 1}) {
      SCOPED_TRACE(absl::StrCat(Name(hosts), " fp_world ", fp_world));
      InProcRing ring(WorldOf(hosts), 256, [&](CommConfig& c) {
        c.ring_order = OrderOf(hosts);
        c.hosts = hosts;
        c.all_to_all_max_world = fp_world;
        c.eager_bytes = 4096;
        c.doubling_bytes = 0;  // the flat ring above eager_bytes
        c.halving_bytes = 0;
      });
      ring.ExpectAllReduceAgrees(DType::kFloat32, ReduceOp::kSum, 1025,
                                 Algorithm::kAuto, usable ? "two_level" : "ring",
                                 7);
      ring.ExpectAllReduceAgrees(DType::kInt64, ReduceOp::kMax, 512,
                                 Algorithm::kAuto,
                                 fp_world == 16 ? "recursive_doubling" : "tree",
                                 8);
    }
  }
}

// A link model under which a two-level all-reduce of any size here starts
// while the fingerprints are in flight (TwoLevelCanStartEarly: copying the
// buffer costs less than a network hop of a second).
LinkModel SlowNetwork() {
  LinkModel m;
  m.local = LevelCost{1e-5, 1e9};
  m.net = LevelCost{1.0, 1e8};
  return m;
}

// Fingerprints all-to-all, with that model (or, model false, none).
struct EarlyHostRing : InProcRing {
  EarlyHostRing(const Hosts& hosts, size_t chunk_bytes, bool model = true)
      : InProcRing(WorldOf(hosts), chunk_bytes, [&](CommConfig& c) {
          c.ring_order = OrderOf(hosts);
          c.hosts = hosts;
          c.all_to_all_max_world = 16;
          if (model) c.link_model = SlowNetwork();
        }) {}
};

// With the early start every result is the one without it, bit for bit
// (the same reductions in the same order), on every rank, and within the
// reference's bound: five shapes, three dtypes, SUM/AVG/MAX, 1, 5 and 1001
// elements in 40-byte chunks.
TEST(TwoLevelEarly, EveryShapeCountOpAndDtypeGivesTheSameBitsAsWithoutIt) {
  for (const Hosts& hosts : Shapes()) {
    SCOPED_TRACE(Name(hosts));
    EarlyHostRing early(hosts, 40);
    HostRing plain(hosts, 40, 16);
    ASSERT_TRUE(early.comms[0]->config().link_model.has_value());
    ASSERT_FALSE(plain.comms[0]->config().link_model.has_value());
    const int g = early.g;
    for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        for (size_t count : {size_t{1}, size_t{5}, size_t{1001}}) {
          SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " op ",
                                    static_cast<int>(op), " count ", count));
          const std::vector<std::vector<uint8_t>> inputs =
              MakeRanksData(dtype, op, count, g, 12);
          std::vector<std::vector<uint8_t>> a = inputs, b = inputs;
          auto ra = early.AllReduce(a, count, dtype, op, Algorithm::kTwoLevel);
          auto rb = plain.AllReduce(b, count, dtype, op, Algorithm::kTwoLevel);
          for (int r = 0; r < g; ++r) {
            ASSERT_TRUE(ra[r].ok()) << "rank " << r << ": " << ra[r].status();
            ASSERT_TRUE(rb[r].ok()) << "rank " << r << ": " << rb[r].status();
            EXPECT_EQ(ra[r]->algorithm, "two_level");
            ASSERT_EQ(a[r], a[0]) << "rank " << r;
            ASSERT_EQ(a[r], b[r]) << "rank " << r << ": early start differs";
          }
          const CheckResult check =
              CheckAllReduce(dtype, op, inputs, a[0].data(), count);
          EXPECT_EQ(check.wrong, 0u) << check.first;
        }
      }
    }
  }
}

// Whether the early start happens: on 2 x 2, rank 3 calls 300 ms after the
// others. With the model, rank 0 reduces its host's sums with rank 1 and
// sends its cross-host ring's first step (a data frame of a cross-host
// segment, g or above) before rank 3's fingerprint can have come; without
// it (and with fingerprints around the ring) nothing of its data leaves
// before then. The results agree either way.
TEST(TwoLevelEarly, TheCrossHostRingsFirstStepLeavesBeforeTheFingerprintsAgree) {
  const Hosts hosts = {{0, 1}, {2, 3}};
  for (bool model : {true, false}) {
    SCOPED_TRACE(model ? "with the model" : "without a model");
    EarlyHostRing ring(hosts, 256, model);
    EXPECT_EQ(TwoLevelUsable(ring.comms[0]->config()), true);
    absl::Mutex mu;
    std::vector<absl::Time> cross_sent;  // rank 0's cross-host data frames
    ring.net.SetTamper(0, [&](FrameMeta& m) {
      if (m.kind == FrameKind::kData && m.segment >= 2) {
        absl::MutexLock lock(&mu);
        cross_sent.push_back(absl::Now());
      }
    });
    const size_t count = 1000;
    std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(DType::kFloat32, ReduceOp::kSum, count, 4, 4);
    std::vector<std::vector<uint8_t>> bufs = inputs;
    absl::Time late_call;
    auto results = RunRanks<absl::StatusOr<OpResult>>(4, [&](int r) {
      if (r == 3) {
        absl::SleepFor(absl::Milliseconds(300));
        late_call = absl::Now();
      }
      HostOpBuffer b(bufs[r].data());
      return ring.comms[r]->AllReduce(b, count, DType::kFloat32,
                                      ReduceOp::kSum, absl::ZeroDuration(),
                                      Algorithm::kTwoLevel);
    });
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
      EXPECT_EQ(results[r]->algorithm, "two_level");
      EXPECT_EQ(bufs[r], bufs[0]) << "rank " << r;
    }
    EXPECT_EQ(CheckAllReduce(DType::kFloat32, ReduceOp::kSum, inputs,
                             bufs[0].data(), count).wrong, 0u);
    absl::MutexLock lock(&mu);
    ASSERT_FALSE(cross_sent.empty());
    if (model) {
      EXPECT_LT(cross_sent.front(), late_call)
          << "the cross-host ring's first step waited for the fingerprints";
    } else {
      EXPECT_GT(cross_sent.front(), late_call)
          << "data left before every fingerprint agreed, without the model";
    }
  }
}

// A rank that never calls, on the host (rank 1: rank 0 waits for it
// before anything starts early) or on the other host (rank 3: host 0
// starts early and its frames wait in host 1's inboxes): every caller
// fails within its deadline (and the slack of its later waits), naming
// it, in the fingerprint phase, its buffer untouched.
TEST(TwoLevelEarly, ARankThatNeverCallsIsNamedAndNoBufferIsTouched) {
  const Hosts hosts = {{0, 1}, {2, 3}};
  for (int missing : {1, 3}) {
    SCOPED_TRACE(absl::StrCat("rank ", missing, " never calls"));
    EarlyHostRing ring(hosts, 256);
    std::vector<std::vector<float>> bufs(4, std::vector<float>(3000, 2.5f));
    const absl::Time start = absl::Now();
    auto results = RunRanks<absl::StatusOr<OpResult>>(4, [&](int r) {
      if (r == missing) {
        return absl::StatusOr<OpResult>(absl::CancelledError("not called"));
      }
      return ring.comms[r]->AllReduce(bufs[r].data(), 3000, DType::kFloat32,
                                      ReduceOp::kSum, absl::Milliseconds(400),
                                      Algorithm::kTwoLevel);
    });
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    for (int r = 0; r < 4; ++r) {
      if (r == missing) continue;
      ASSERT_FALSE(results[r].ok()) << "rank " << r;
      EXPECT_TRUE(absl::StrContains(results[r].status().message(),
                                    absl::StrCat("rank ", missing, " (w",
                                                 missing)))
          << "rank " << r << ": " << results[r].status();
      EXPECT_TRUE(absl::StrContains(results[r].status().message(),
                                    "fingerprint"))
          << "rank " << r << " failed outside the fingerprint phase: "
          << results[r].status();
      EXPECT_EQ(bufs[r], std::vector<float>(3000, 2.5f)) << "rank " << r;
    }
  }
}

// The rings hand chunks on as they finish them: on 2 x 2 in 64-byte
// chunks, rank 0 sends each chunk of its part to its host peer (the
// host's all-gather) as soon as its cross-host ring has finished it, so
// its first all-gather frame to rank 1 leaves before its last cross-host
// all-gather frame to rank 2; where the host's all-gather waited for the
// cross-host ring to end, every cross-host frame would leave first. With
// and without the early start; the results agree either way.
TEST(TwoLevel, TheHostsAllGatherTakesEachChunkAsTheCrossHostRingFinishesIt) {
  const Hosts hosts = {{0, 1}, {2, 3}};
  for (bool model : {false, true}) {
    SCOPED_TRACE(model ? "early start" : "no early start");
    EarlyHostRing ring(hosts, 64, model);
    absl::Mutex mu;
    std::vector<bool> to_host;  // rank 0's all-gather frames: host or cross
    ring.net.SetTamper(0, [&](FrameMeta& m) {
      if (m.kind == FrameKind::kData && m.phase == Phase::kAllGather) {
        absl::MutexLock lock(&mu);
        to_host.push_back(m.segment < 2);  // host segments 0..g-1
      }
    });
    const size_t count = 1000;
    std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(DType::kFloat32, ReduceOp::kAvg, count, 4, 6);
    std::vector<std::vector<uint8_t>> bufs = inputs;
    auto results = ring.AllReduce(bufs, count, DType::kFloat32,
                                  ReduceOp::kAvg, Algorithm::kTwoLevel);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
      EXPECT_EQ(bufs[r], bufs[0]) << "rank " << r;
    }
    EXPECT_EQ(CheckAllReduce(DType::kFloat32, ReduceOp::kAvg, inputs,
                             bufs[0].data(), count).wrong, 0u);
    absl::MutexLock lock(&mu);
    // 1000 floats: parts of 2000 bytes, cross-host segments of 1000 bytes
    // in 16 chunks each; rank 0 sends its part's 32 chunks to rank 1 and
    // its own finished segment's 16 to rank 2.
    ASSERT_EQ(std::count(to_host.begin(), to_host.end(), true), 32);
    ASSERT_EQ(std::count(to_host.begin(), to_host.end(), false), 16);
    const auto first_host =
        std::find(to_host.begin(), to_host.end(), true) - to_host.begin();
    const auto last_cross =
        to_host.rend() - std::find(to_host.rbegin(), to_host.rend(), false) - 1;
    EXPECT_LT(first_host, last_cross)
        << "the host's all-gather waited for the cross-host ring to end";
  }
}

// A disagreement, on the host (rank 1 against rank 0, so its host starts
// nothing early) or on the other host (rank 3: host 0 agrees and starts
// early): every rank fails with FAILED_PRECONDITION naming the same pair,
// and no buffer changed.
TEST(TwoLevelEarly, ADisagreementTouchesNoBufferAndEveryRankNamesTheSamePair) {
  const Hosts hosts = {{0, 1}, {2, 3}};
  for (int odd : {1, 3}) {
    SCOPED_TRACE(absl::StrCat("rank ", odd, " calls another count"));
    EarlyHostRing ring(hosts, 256);
    std::vector<std::vector<float>> bufs(4, std::vector<float>(2001, 1.5f));
    auto results = RunRanks<absl::StatusOr<OpResult>>(4, [&](int r) {
      return ring.comms[r]->AllReduce(bufs[r].data(), r == odd ? 2001 : 2000,
                                      DType::kFloat32, ReduceOp::kSum,
                                      absl::Seconds(5), Algorithm::kTwoLevel);
    });
    for (int r = 0; r < 4; ++r) {
      ASSERT_FALSE(results[r].ok()) << "rank " << r;
      EXPECT_EQ(results[r].status().code(),
                absl::StatusCode::kFailedPrecondition)
          << "rank " << r << ": " << results[r].status();
      EXPECT_TRUE(absl::StrContains(
          results[r].status().message(),
          absl::StrCat("ranks disagree on the operation: rank 0 (w0, inproc:0) "
                       "calls all_reduce #1 float32x2000 sum (two_level) but "
                       "rank ", odd, " (w", odd, ", inproc:", odd,
                       ") calls all_reduce #1 float32x2001")))
          << "rank " << r << ": " << results[r].status();
      EXPECT_EQ(bufs[r], std::vector<float>(2001, 1.5f)) << "rank " << r;
    }
    // The next call agrees, and runs: the failed one left nothing behind.
    ring.ExpectAllReduceAgrees(DType::kFloat32, ReduceOp::kSum, 777,
                               Algorithm::kTwoLevel, "two_level", 9);
  }
}

// A worker whose auto runs the ring where this one's runs two-level (an
// older version): it says so in its fingerprint (resolved ring) or says
// nothing (older than the tree); either way the others name it before any
// data moves and no buffer changes.
TEST(TwoLevel, AWorkerWhoseAutoRunsTheRingIsNamedBeforeAnyDataMoves) {
  const Hosts hosts = {{0, 1}, {2, 3}};
  for (Algorithm says : {Algorithm::kRing, Algorithm::kAuto}) {
    SCOPED_TRACE(AlgorithmName(says));
    InProcRing ring(4, 256, [&](CommConfig& c) {
      c.ring_order = OrderOf(hosts);
      c.hosts = hosts;
      c.eager_bytes = 4096;
    });
    ring.net.SetTamper(2, [says](FrameMeta& m) {
      if (m.kind == FrameKind::kFingerprint) m.fingerprint.resolved = says;
    });
    std::vector<std::vector<float>> bufs(4, std::vector<float>(2000, 1.0f));
    auto results = RunRanks<absl::StatusOr<OpResult>>(4, [&](int r) {
      return ring.comms[r]->AllReduce(bufs[r].data(), 2000, DType::kFloat32,
                                      ReduceOp::kSum, absl::Seconds(5),
                                      Algorithm::kAuto);
    });
    for (int r = 0; r < 4; ++r) {
      ASSERT_FALSE(results[r].ok()) << "rank " << r;
      EXPECT_EQ(bufs[r], std::vector<float>(2000, 1.0f)) << "rank " << r;
      if (r == 2) continue;  // it checks its own view, which looks new
      EXPECT_EQ(results[r].status().code(),
                absl::StatusCode::kFailedPrecondition)
          << results[r].status();
      EXPECT_TRUE(absl::StrContains(
          results[r].status().message(),
          absl::StrCat("this rank runs two_level, rank 2 (w2, inproc:2) runs ring (",
                       says == Algorithm::kAuto ? "a worker older than the tree"
                                                : "both ask for auto")))
          << results[r].status();
    }
  }
}

// One reduce-scatter or all-gather of `slice` elements per rank on every
// rank of `ring`, checked against the reference on every rank; each must
// report `ran`.
void ExpectSlicesAgree(InProcRing& ring, OpKind kind, DType dtype,
                       ReduceOp op, size_t slice, Algorithm algorithm,
                       const std::string& ran, uint32_t seed, int shift = 1) {
  const int g = ring.g;
  const size_t es = DTypeSize(dtype);
  const size_t whole = static_cast<size_t>(g) * slice;
  std::vector<std::vector<uint8_t>> inputs, bufs;
  if (kind == OpKind::kReduceScatter) {
    inputs = MakeRanksData(dtype, op, whole, g, seed);
    bufs = inputs;
  } else {
    // Each rank's contribution waits in slice (r+shift) mod g: its own, or
    // another.
    for (int r = 0; r < g; ++r) {
      inputs.push_back(MakeRankData(dtype, ReduceOp::kSum, slice, r, seed));
      bufs.emplace_back(whole * es, 0xEE);
      std::copy(inputs[r].begin(), inputs[r].end(),
                bufs[r].begin() +
                    static_cast<long>(((r + shift) % g) * slice * es));
    }
  }
  auto results = RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
    HostOpBuffer b(bufs[r].data());
    return kind == OpKind::kReduceScatter
               ? ring.comms[r]->ReduceScatter(b, whole, slice, dtype, op,
                                              absl::ZeroDuration(), algorithm)
               : ring.comms[r]->AllGather(b, slice, whole, (r + shift) % g,
                                          dtype, absl::ZeroDuration(),
                                          algorithm);
  });
  for (int r = 0; r < g; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->algorithm, ran) << "rank " << r;
    const CheckResult check =
        kind == OpKind::kReduceScatter
            ? CheckReduceScatter(dtype, op, inputs,
                                 bufs[r].data() + r * slice * es, r, slice)
            : CheckAllGather(dtype, inputs, bufs[r].data(), slice);
    EXPECT_EQ(check.wrong, 0u) << "rank " << r << ": " << check.first;
  }
}

TEST(TwoLevelSlices, EveryShapeDtypeOpAndSliceAgreesWithTheReference) {
  for (const Hosts& hosts : Shapes()) {
    for (int fp_world : {16, 1}) {
      HostRing ring(hosts, 40, fp_world);
      for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBFloat16}) {
        for (size_t slice : {size_t{1}, size_t{7}, size_t{301}}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
            SCOPED_TRACE(absl::StrCat(Name(hosts), " fp_world ", fp_world, " ",
                                      DTypeName(dtype), " op ",
                                      static_cast<int>(op), " slice ", slice));
            ExpectSlicesAgree(ring, OpKind::kReduceScatter, dtype, op, slice,
                              Algorithm::kTwoLevel, "two_level", 21);
            if (::testing::Test::HasFatalFailure()) return;
          }
          SCOPED_TRACE(absl::StrCat(Name(hosts), " fp_world ", fp_world, " ",
                                    DTypeName(dtype), " slice ", slice));
          for (int shift : {0, 1}) {
            ExpectSlicesAgree(ring, OpKind::kAllGather, dtype, ReduceOp::kSum,
                              slice, Algorithm::kTwoLevel, "two_level", 22,
                              shift);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// The payload bytes each rank sent to each peer during one reduce-scatter
// or all-gather of `slice` float32 elements per rank with `algorithm`.
std::vector<std::map<int, uint64_t>> SentDuringSlices(InProcRing& ring,
                                                      OpKind kind,
                                                      size_t slice,
                                                      Algorithm algorithm) {
  std::vector<std::map<int, uint64_t>> before;
  for (int r = 0; r < ring.g; ++r) before.push_back(ring.SentBy(r));
  ExpectSlicesAgree(ring, kind, DType::kFloat32, ReduceOp::kSum, slice,
                    algorithm, std::string(AlgorithmName(algorithm)), 23);
  std::vector<std::map<int, uint64_t>> sent;
  for (int r = 0; r < ring.g; ++r) {
    std::map<int, uint64_t> after = ring.SentBy(r);
    for (auto& [peer, bytes] : after) bytes -= before[r][peer];
    sent.push_back(std::move(after));
  }
  return sent;
}

TEST(TwoLevelSlices, OnlyTheCrossHostRingsCrossHostsWithTheirColumnOnly) {
  for (const Hosts& hosts : Shapes()) {
    for (OpKind kind : {OpKind::kReduceScatter, OpKind::kAllGather}) {
      SCOPED_TRACE(absl::StrCat(Name(hosts), " ", OpKindName(kind)));
      HostRing ring(hosts, 1024, 16);
      const int g = ring.g;
      const int h = static_cast<int>(hosts.size());
      const size_t slice = 500;
      const auto sent =
          SentDuringSlices(ring, kind, slice, Algorithm::kTwoLevel);
      if (::testing::Test::HasFatalFailure()) return;
      uint64_t across = 0, total = 0;
      for (int r = 0; r < g; ++r) {
        const int host = HostOf(hosts, r);
        const auto& mine = hosts[static_cast<size_t>(host)];
        const int local = static_cast<int>(
            std::find(mine.begin(), mine.end(), r) - mine.begin());
        const int cross_succ = hosts[static_cast<size_t>((host + 1) % h)]
                                    [static_cast<size_t>(local)];
        for (auto [peer, bytes] : sent[r]) {
          total += bytes;
          if (HostOf(hosts, peer) == host) continue;
          EXPECT_EQ(peer == cross_succ ? bytes : 0u, bytes)
              << r << "->" << peer << " crosses hosts";
          across += bytes;
        }
      }
      // Each rank's cross-host ring moves H-1 slices of its column per
      // rank; inside a host each rank moves g-1 columns of H slices.
      EXPECT_EQ(across, static_cast<uint64_t>(g) * (h - 1) * slice * 4)
          << "payload bytes across hosts";
      const uint64_t per_host_ring =
          static_cast<uint64_t>(g) * (hosts[0].size() - 1) * h * slice * 4;
      EXPECT_EQ(total - across, per_host_ring) << "payload bytes inside hosts";
    }
  }
}

TEST(TwoLevelSlices, AutoTakesThemWhereHostsAllowAndRingIsKeptOnRequest) {
  for (const auto& [hosts, usable] : UsableOrNot()) {
    SCOPED_TRACE(Name(hosts));
    HostRing ring(hosts, 256, 16);
    for (OpKind kind : {OpKind::kReduceScatter, OpKind::kAllGather}) {
      for (size_t slice : {size_t{3}, size_t{2000}}) {
        ExpectSlicesAgree(ring, kind, DType::kFloat32, ReduceOp::kSum, slice,
                          Algorithm::kAuto, usable ? "two_level" : "ring", 24);
        ExpectSlicesAgree(ring, kind, DType::kInt64, ReduceOp::kSum, slice,
                          Algorithm::kTwoLevel, usable ? "two_level" : "ring",
                          25);
        ExpectSlicesAgree(ring, kind, DType::kInt64, ReduceOp::kMax, slice,
                          Algorithm::kRing, "ring", 26);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// A worker whose reduce-scatter runs the ring where this one's auto runs
// two-level (an older version) is named before any data moves, and no
// buffer changes.
TEST(TwoLevelSlices, AWorkerWhoseAutoRunsTheRingIsNamedBeforeAnyDataMoves) {
  const Hosts hosts = {{0, 1}, {2, 3}};
  for (OpKind kind : {OpKind::kReduceScatter, OpKind::kAllGather}) {
    SCOPED_TRACE(OpKindName(kind));
    HostRing ring(hosts, 256, 16);
    ring.net.SetTamper(1, [](FrameMeta& m) {
      if (m.kind == FrameKind::kFingerprint) {
        m.fingerprint.resolved = Algorithm::kRing;
      }
    });
    std::vector<std::vector<float>> bufs(4, std::vector<float>(800, 1.0f));
    auto results = RunRanks<absl::StatusOr<OpResult>>(4, [&](int r) {
      HostOpBuffer b(bufs[r].data());
      return kind == OpKind::kReduceScatter
                 ? ring.comms[r]->ReduceScatter(b, 800, 200, DType::kFloat32,
                                                ReduceOp::kSum,
                                                absl::Seconds(5))
                 : ring.comms[r]->AllGather(b, 200, 800, r, DType::kFloat32,
                                            absl::Seconds(5));
    });
    for (int r = 0; r < 4; ++r) {
      ASSERT_FALSE(results[r].ok()) << "rank " << r;
      EXPECT_EQ(bufs[r], std::vector<float>(800, 1.0f)) << "rank " << r;
      if (r == 1) continue;
      EXPECT_TRUE(absl::StrContains(results[r].status().message(),
                                    "this rank runs two_level, rank 1 (w1, "
                                    "inproc:1) runs ring"))
          << results[r].status();
    }
  }
}

}  // namespace
}  // namespace halka
