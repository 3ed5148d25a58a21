// G Communicators over one InProcNetwork, for tests of the algorithms
// (every rank in this process), and the collectives run on all of them at
// once, one thread per rank (RunRanks).
#ifndef HALKA_TESTS_TESTING_INPROC_RING_H_
#define HALKA_TESTS_TESTING_INPROC_RING_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/communicator.h"
#include "core/telemetry.h"
#include "core/testing/inproc_transport.h"
#include "core/testing/reference.h"
#include "core/timeline.h"
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

  // Every rank's float32 SUM all-reduce of its whole bufs[r] with
  // `algorithm` and `timeout`, while rank `dead` is killed `kill_after`
  // into it: the results by rank, and how long after the kill each rank's
  // call returned.
  struct KilledRun {
    Results results;
    std::vector<absl::Duration> after_kill;
  };
  KilledRun AllReduceKilling(std::vector<std::vector<float>>& bufs,
                             Algorithm algorithm, absl::Duration timeout,
                             int dead, absl::Duration kill_after) {
    KilledRun run;
    run.results.resize(static_cast<size_t>(g));
    std::vector<absl::Time> ended(static_cast<size_t>(g));
    std::vector<std::thread> threads;
    for (int r = 0; r < g; ++r) {
      threads.emplace_back([&, r] {
        run.results[r] = comms[r]->AllReduce(
            bufs[r].data(), bufs[r].size(), DType::kFloat32, ReduceOp::kSum,
            timeout, algorithm);
        ended[r] = absl::Now();
      });
    }
    absl::SleepFor(kill_after);
    net.Kill(dead);
    const absl::Time killed = absl::Now();
    for (auto& t : threads) t.join();
    for (int r = 0; r < g; ++r) run.after_kill.push_back(ended[r] - killed);
    return run;
  }

  // Every rank's broadcast from `root` into its bufs[r], by rank.
  template <typename T>
  Results Broadcast(std::vector<std::vector<T>>& bufs, size_t count,
                    DType dtype, int root,
                    Algorithm algorithm = Algorithm::kAuto) {
    return RunRanks<absl::StatusOr<OpResult>>(g, [&](int r) {
      return comms[r]->Broadcast(bufs[r].data(), count, dtype, root,
                                 absl::ZeroDuration(), algorithm);
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

  // An all-reduce of `count` elements of MakeRanksData(seed) with
  // `algorithm` on every rank: each must succeed, report `ran` as its
  // algorithm and end with rank 0's bytes, which must be within the
  // reference's bound (a fatal failure at the first rank that does not).
  void ExpectAllReduceAgrees(DType dtype, ReduceOp op, size_t count,
                             Algorithm algorithm, const std::string& ran,
                             uint32_t seed) {
    std::vector<std::vector<uint8_t>> inputs =
        MakeRanksData(dtype, op, count, g, seed);
    std::vector<std::vector<uint8_t>> bufs = inputs;
    Results results = AllReduce(bufs, count, dtype, op, algorithm);
    for (int r = 0; r < g; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(results[r]->algorithm, ran);
      ASSERT_EQ(bufs[r], bufs[0]) << "rank " << r;
    }
    const CheckResult check =
        CheckAllReduce(dtype, op, inputs, bufs[0].data(), count);
    EXPECT_EQ(check.wrong, 0u) << check.first;
  }

  // ExpectAllReduceAgrees over float32, int64 and bfloat16 x SUM, AVG and
  // MAX x 1, 5 and 1001 elements.
  void ExpectAllReduceMatrixAgrees(Algorithm algorithm, const std::string& ran,
                                   uint32_t seed) {
    for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        for (size_t count : {size_t{1}, size_t{5}, size_t{1001}}) {
          SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " op ",
                                    static_cast<int>(op), " count ", count));
          ExpectAllReduceAgrees(dtype, op, count, algorithm, ran, seed);
        }
      }
    }
  }

  // A float32 SUM all-reduce of `count` elements with `algorithm` on every
  // rank (each must succeed) and the payload
  // bytes each rank sent to each peer while it ran (Telemetry's edges).
  std::vector<std::map<int, uint64_t>> SentDuringAllReduce(
      size_t count, Algorithm algorithm) {
    std::vector<std::vector<uint8_t>> bufs =
        MakeRanksData(DType::kFloat32, ReduceOp::kSum, count, g, 5);
    std::vector<std::map<int, uint64_t>> sent(static_cast<size_t>(g));
    for (int r = 0; r < g; ++r) sent[r] = SentBy(r);
    Results results =
        AllReduce(bufs, count, DType::kFloat32, ReduceOp::kSum, algorithm);
    for (int r = 0; r < g; ++r) {
      EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
      std::map<int, uint64_t> after = SentBy(r);
      for (auto& [peer, bytes] : after) bytes -= sent[r][peer];
      sent[r] = std::move(after);
    }
    return sent;
  }
  // Whether rank r's last operation sent data (a send of more than 0
  // bytes) while still in its fingerprint phase: a first step that left
  // before the fingerprints agreed. A rank that ran no operation fails the
  // test.
  bool SentDataBeforeAgreeing(int r) const {
    const std::vector<TraceOp> trace = comms[r]->GetTrace();
    EXPECT_FALSE(trace.empty()) << "rank " << r << " ran no operation";
    if (trace.empty()) return false;
    for (const TraceSpan& s : trace.back().spans) {
      if (s.kind == TraceSpan::Kind::kSend && s.phase == Phase::kFingerprint &&
          s.bytes > 0) {
        return true;
      }
    }
    return false;
  }

  // The frames rank r's last operation sent while in its fingerprint
  // phase (its fingerprints, and a first step that left early).
  size_t SendsBeforeAgreeing(int r) const {
    const std::vector<TraceOp> trace = comms[r]->GetTrace();
    EXPECT_FALSE(trace.empty()) << "rank " << r << " ran no operation";
    size_t n = 0;
    if (trace.empty()) return n;
    for (const TraceSpan& s : trace.back().spans) {
      if (s.kind == TraceSpan::Kind::kSend && s.phase == Phase::kFingerprint) {
        ++n;
      }
    }
    return n;
  }

  // The bytes rank r sent to each peer over the ring's life.
  std::map<int, uint64_t> SentBy(int r) const {
    std::map<int, uint64_t> sent;
    const Telemetry t = comms[r]->GetTelemetry();
    for (const auto& [peer, edge] : t.edges_total) sent[peer] = edge.bytes_sent;
    return sent;
  }

  const int g;
  InProcNetwork net;
  std::vector<std::unique_ptr<Communicator>> comms;
};

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_INPROC_RING_H_
