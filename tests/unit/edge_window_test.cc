// EdgeWindow: per-edge sums, wait percentiles and the rolling window.
#include "core/edge_window.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace halka {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

TEST(PercentileTest, NearestRank) {
  EXPECT_EQ(Percentile({}, 0.5), 0);
  EXPECT_EQ(Percentile({3}, 0.99), 3);
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 0.50), 50);
  EXPECT_EQ(Percentile(v, 0.99), 99);
  EXPECT_EQ(Percentile(v, 1.0), 100);
  EXPECT_EQ(Percentile(v, 0.0), 1);
}

TEST(EdgeWindowTest, SumsPerEdge) {
  EdgeWindow w(absl::Seconds(60));
  w.RecordSend(kT0, 1, 1000, 0.01);
  w.RecordSend(kT0, 1, 500, 0.02);
  w.RecordWait(kT0, 3, 2000, 0.5);
  w.RecordWait(kT0, 3, 2000, 0.1);
  w.RecordReduce(kT0, 3, 0.25);
  w.RecordError(kT0, 1);
  w.RecordOp(kT0, 1.5);
  const EdgeSummary s = w.Summarize(kT0 + absl::Seconds(1));
  EXPECT_EQ(s.ops, 1u);
  EXPECT_DOUBLE_EQ(s.op_seconds, 1.5);
  const EdgeStats& e1 = s.edges.at(1);
  EXPECT_EQ(e1.bytes_sent, 1500u);
  EXPECT_NEAR(e1.send_seconds, 0.03, 1e-12);
  EXPECT_EQ(e1.errors, 1u);
  EXPECT_EQ(e1.bytes_received, 0u);
  const EdgeStats& e3 = s.edges.at(3);
  EXPECT_EQ(e3.bytes_received, 4000u);
  EXPECT_EQ(e3.chunks_received, 2u);
  EXPECT_NEAR(e3.wait_seconds, 0.6, 1e-12);
  EXPECT_DOUBLE_EQ(e3.reduce_seconds, 0.25);
  EXPECT_DOUBLE_EQ(e3.wait_p50_seconds, 0.1);
  EXPECT_DOUBLE_EQ(e3.wait_p99_seconds, 0.5);
}

TEST(EdgeWindowTest, ForgetsSamplesOlderThanTheSpan) {
  EdgeWindow w(absl::Seconds(60));
  w.RecordWait(kT0, 0, 100, 9.0);  // will fall out
  w.RecordOp(kT0, 9.0);
  w.RecordWait(kT0 + absl::Seconds(30), 0, 10, 1.0);
  w.RecordOp(kT0 + absl::Seconds(30), 1.0);
  EdgeSummary s = w.Summarize(kT0 + absl::Seconds(59));
  EXPECT_EQ(s.edges.at(0).bytes_received, 110u);
  EXPECT_EQ(s.ops, 2u);
  s = w.Summarize(kT0 + absl::Seconds(61));
  EXPECT_EQ(s.edges.at(0).bytes_received, 10u);
  EXPECT_DOUBLE_EQ(s.edges.at(0).wait_p99_seconds, 1.0);
  EXPECT_EQ(s.ops, 1u);
  EXPECT_DOUBLE_EQ(s.op_seconds, 1.0);
  s = w.Summarize(kT0 + absl::Seconds(100));
  EXPECT_TRUE(s.edges.empty());
  EXPECT_EQ(s.ops, 0u);
}

TEST(EdgeWindowTest, BoundedSampleCount) {
  EdgeWindow w(absl::Seconds(60), /*max_samples=*/10);
  for (int i = 0; i < 100; ++i) w.RecordWait(kT0, 2, 1, 0.001 * i);
  const EdgeSummary s = w.Summarize(kT0);
  EXPECT_EQ(s.edges.at(2).chunks_received, 10u);  // the newest 10
  EXPECT_NEAR(s.edges.at(2).wait_p50_seconds, 0.094, 1e-9);
}

// The samples live in a ring that grows to its bound and then overwrites
// the oldest; a prune by time frees its front wherever the ring wraps.
// Every sample's bytes are its index, so the sum says exactly which
// samples are held: the newest ones, each once.
TEST(EdgeWindowTest, KeepsTheNewestSamplesAcrossGrowingWrappingAndPruning) {
  constexpr int kMax = 100;  // above the first ring's 64: it grows once
  EdgeWindow w(absl::Seconds(60), kMax);
  auto bytes_of = [](int from, int to) {  // sum of from..to-1
    uint64_t sum = 0;
    for (int i = from; i < to; ++i) sum += static_cast<uint64_t>(i);
    return sum;
  };
  // Sample i at kT0 + i ms: 250 of them wrap the full ring more than once.
  for (int i = 0; i < 250; ++i) {
    w.RecordWait(kT0 + absl::Milliseconds(i), 1, static_cast<uint64_t>(i), 1);
    if (i == 40 || i == 70 || i == 249) {  // growing, grown, wrapped
      const int held = std::min(i + 1, kMax);
      const EdgeSummary s = w.Summarize(kT0 + absl::Milliseconds(i));
      EXPECT_EQ(s.edges.at(1).chunks_received, static_cast<uint64_t>(held))
          << "after sample " << i;
      EXPECT_EQ(s.edges.at(1).bytes_received, bytes_of(i + 1 - held, i + 1))
          << "after sample " << i;
    }
  }
  // Samples 150..249 are held, sample k in place k % 100 (150..199 at
  // the ring's end, 200..249 wrapped to its start). 60 s after sample 209
  // everything up to 209 has aged out: the prune runs off the ring's end
  // and on from its start.
  const absl::Time later = kT0 + absl::Seconds(60) + absl::Milliseconds(209);
  EdgeSummary s = w.Summarize(later);
  EXPECT_EQ(s.edges.at(1).chunks_received, 40u);
  EXPECT_EQ(s.edges.at(1).bytes_received, bytes_of(210, 250));
  // New samples after the prune fill the freed places; once the ring is
  // full again the oldest go first.
  for (int i = 250; i < 330; ++i) {
    w.RecordWait(later, 1, static_cast<uint64_t>(i), 1);
  }
  s = w.Summarize(later);
  EXPECT_EQ(s.edges.at(1).chunks_received, 100u);
  EXPECT_EQ(s.edges.at(1).bytes_received, bytes_of(230, 330));
}

// The ring grows while it is wrapped (its oldest sample not in its first
// place), and shrinks when a prune leaves it mostly empty; the samples
// keep their order through both.
TEST(EdgeWindowTest, GrowsWhileWrappedAndShrinksWhenMostlyEmpty) {
  EdgeWindow w(absl::Seconds(60), /*max_samples=*/1000);
  auto bytes_of = [](int from, int to) {
    uint64_t sum = 0;
    for (int i = from; i < to; ++i) sum += static_cast<uint64_t>(i);
    return sum;
  };
  auto add = [&](int from, int to, absl::Time at) {
    for (int i = from; i < to; ++i) {
      w.RecordWait(at == absl::InfinitePast() ? kT0 + absl::Milliseconds(i)
                                              : at,
                   1, static_cast<uint64_t>(i), 1);
    }
  };
  auto expect = [&](absl::Time now, uint64_t n, uint64_t bytes) {
    const EdgeSummary s = w.Summarize(now);
    ASSERT_EQ(s.edges.count(1), 1u);
    EXPECT_EQ(s.edges.at(1).chunks_received, n);
    EXPECT_EQ(s.edges.at(1).bytes_received, bytes);
  };
  add(0, 64, absl::InfinitePast());  // the first ring (64 places), full
  const absl::Time t1 = kT0 + absl::Seconds(60) + absl::Milliseconds(9);
  expect(t1, 54, bytes_of(10, 64));  // 0..9 aged out: the front is at 10
  add(64, 74, t1);                   // wrapped into places 0..9: full again
  EXPECT_EQ(w.places(), 64u);
  add(74, 75, t1);                   // grows, unwrapping from place 10
  EXPECT_EQ(w.places(), 128u);
  expect(t1, 65, bytes_of(10, 75));
  const absl::Time t2 = kT0 + absl::Seconds(120) + absl::Milliseconds(8);
  expect(t2, 11, bytes_of(64, 75));  // 10..63 aged out: it shrinks
  EXPECT_EQ(w.places(), 64u);
  add(75, 175, t2);                  // and grows again
  EXPECT_EQ(w.places(), 128u);
  expect(t2, 111, bytes_of(64, 175));
}

TEST(EdgeWindowTest, NoSamplesWithABoundOfZero) {
  EdgeWindow w(absl::Seconds(60), /*max_samples=*/0);
  w.RecordOp(kT0, 1.0);
  w.RecordWait(kT0, 1, 10, 1.0);
  const EdgeSummary s = w.Summarize(kT0);
  EXPECT_EQ(s.ops, 0u);
  EXPECT_TRUE(s.edges.empty());
}

}  // namespace
}  // namespace halka
