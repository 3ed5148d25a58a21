// EdgeWindow: per-edge sums, wait percentiles and the rolling window.
#include "core/edge_window.h"

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

}  // namespace
}  // namespace halka
