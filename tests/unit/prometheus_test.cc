// PrometheusWriter: the text exposition format, byte for byte.
#include "common/prometheus.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace halka {
namespace {

TEST(PrometheusWriterTest, EmptyWriterWritesNothing) {
  EXPECT_EQ(PrometheusWriter().Text(), "");
}

TEST(PrometheusWriterTest, DeclaredFamilyWithoutSamplesKeepsItsHeader) {
  PrometheusWriter w;
  w.Family("halka_up", "gauge", "1 while up");
  EXPECT_EQ(w.Text(), "# HELP halka_up 1 while up\n# TYPE halka_up gauge\n");
}

TEST(PrometheusWriterTest, HeaderOncePerFamilyInDeclarationOrder) {
  PrometheusWriter w;
  w.Family("b_total", "counter", "bees");
  w.Family("a", "gauge", "ays");
  w.Family("b_total", "gauge", "declared twice: ignored");
  // Interleaved samples land in their own family, in the order added.
  w.Sample("a", {{"job", "x"}}, 1);
  w.Sample("b_total", {{"job", "x"}}, uint64_t{18446744073709551615u});
  w.Sample("a", {{"job", "y"}}, -1);
  w.Sample("b_total", {{"job", "y"}}, 2.5);
  EXPECT_EQ(w.Text(),
            "# HELP b_total bees\n# TYPE b_total counter\n"
            "b_total{job=\"x\"} 18446744073709551615\n"
            "b_total{job=\"y\"} 2.5\n"
            "# HELP a ays\n# TYPE a gauge\n"
            "a{job=\"x\"} 1\n"
            "a{job=\"y\"} -1\n");
}

TEST(PrometheusWriterTest, LabelsInOrderAndValuesEscaped) {
  PrometheusWriter w;
  w.Family("m", "gauge", "h");
  w.Sample("m", {{"job", "a\"b\\c\nd"}, {"rank", "3"}}, 0.125);
  w.Sample("m", {}, 7);
  EXPECT_EQ(w.Text(),
            "# HELP m h\n# TYPE m gauge\n"
            "m{job=\"a\\\"b\\\\c\\nd\",rank=\"3\"} 0.125\n"
            "m 7\n");
}

TEST(PrometheusWriterTest, DoublesAsStrCatFormatsThem) {
  PrometheusWriter w;
  w.Sample("d", {}, 1.0 / 3);
  w.Sample("d", {}, 1e21);
  w.Sample("d", {}, 0.0);
  // Undeclared family: samples without a header.
  EXPECT_EQ(w.Text(), "d 0.333333\nd 1e+21\nd 0\n");
}

TEST(PrometheusWriterTest, HistogramBucketsAreCumulativeThenSumAndCount) {
  PrometheusWriter w;
  w.Family("lat_seconds", "histogram", "latency");
  const std::vector<double> bounds = {0.001, 0.01, 0.1};
  // 2 in the first bucket, 0, 3, and 1 above the last bound.
  const std::vector<uint64_t> counts = {2, 0, 3, 1};
  w.Histogram("lat_seconds", {{"job", "j"}}, bounds, counts, 0.75, 6);
  EXPECT_EQ(w.Text(),
            "# HELP lat_seconds latency\n# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{job=\"j\",le=\"0.001\"} 2\n"
            "lat_seconds_bucket{job=\"j\",le=\"0.01\"} 2\n"
            "lat_seconds_bucket{job=\"j\",le=\"0.1\"} 5\n"
            "lat_seconds_bucket{job=\"j\",le=\"+Inf\"} 6\n"
            "lat_seconds_sum{job=\"j\"} 0.75\n"
            "lat_seconds_count{job=\"j\"} 6\n");
}

TEST(PrometheusWriterTest, HistogramWithoutLabelsOrObservations) {
  PrometheusWriter w;
  w.Histogram("h", {}, std::vector<double>{1}, {}, 0, 0);
  EXPECT_EQ(w.Text(),
            "h_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 0\nh_sum 0\n"
            "h_count 0\n");
}

}  // namespace
}  // namespace halka
