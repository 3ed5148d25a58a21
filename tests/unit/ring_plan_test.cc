#include "core/ring_plan.h"

#include <vector>

#include "gtest/gtest.h"

namespace halka {
namespace {

class RingPlanTest
    : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

// Every element is covered by exactly one segment and one chunk, segment
// sizes differ by at most one, and chunks respect the chunk size.
TEST_P(RingPlanTest, CoversEveryElementOnce) {
  const int g = std::get<0>(GetParam());
  const size_t count = std::get<1>(GetParam());
  const std::vector<Range> segs = PlanSegments(count, g);
  ASSERT_EQ(segs.size(), static_cast<size_t>(g));
  std::vector<int> hits(count, 0);
  size_t min_seg = count, max_seg = 0;
  for (const Range& s : segs) {
    min_seg = std::min(min_seg, s.count);
    max_seg = std::max(max_seg, s.count);
    for (size_t chunk_elems : {size_t{1}, size_t{3}, size_t{4096}}) {
      if (chunk_elems == 1 && count > 5000) continue;  // keep it quick
      size_t covered = 0;
      size_t next = s.offset;
      for (const Range& c : PlanChunks(s, chunk_elems)) {
        EXPECT_EQ(c.offset, next);
        EXPECT_GT(c.count, 0u);
        EXPECT_LE(c.count, chunk_elems);
        next += c.count;
        covered += c.count;
      }
      EXPECT_EQ(covered, s.count);
    }
    for (size_t i = s.offset; i < s.offset + s.count; ++i) ++hits[i];
  }
  EXPECT_LE(max_seg - std::min(min_seg, max_seg), 1u);
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(hits[i], 1) << "element " << i;
}

std::vector<size_t> Counts() { return {0, 1, 2, 7, 9, 1001, 1000003}; }

INSTANTIATE_TEST_SUITE_P(
    WorldsAndCounts, RingPlanTest,
    ::testing::Combine(::testing::Range(1, 9), ::testing::ValuesIn(Counts())));

TEST(RingPlanEdgeCases, GMinusOneAndGPlusOne) {
  for (int g = 1; g <= 8; ++g) {
    for (size_t count : {static_cast<size_t>(g - 1), static_cast<size_t>(g + 1)}) {
      const std::vector<Range> segs = PlanSegments(count, g);
      size_t sum = 0;
      for (const Range& s : segs) sum += s.count;
      EXPECT_EQ(sum, count) << "g=" << g;
    }
  }
}

// Over the 2(G-1) steps each rank receives every segment but its own in
// reduce-scatter, ends owning segment r+1, and in all-gather receives every
// segment but the one it owns; successor receives what predecessor sends.
TEST(RingPlanSteps, ScheduleIsConsistent) {
  for (int g = 2; g <= 8; ++g) {
    for (int r = 0; r < g; ++r) {
      std::vector<int> rs(g, 0), ag(g, 0);
      for (int s = 0; s < g - 1; ++s) {
        ++rs[RsRecvSegment(r, g, s)];
        ++ag[AgRecvSegment(r, g, s)];
        // What r receives at step s is what its predecessor sends.
        EXPECT_EQ(RsRecvSegment(r, g, s), RsSendSegment(Mod(r - 1, g), g, s));
        EXPECT_EQ(AgRecvSegment(r, g, s), AgSendSegment(Mod(r - 1, g), g, s));
        if (s > 0) {
          EXPECT_EQ(RsSendSegment(r, g, s), RsRecvSegment(r, g, s - 1));
          EXPECT_EQ(AgSendSegment(r, g, s), AgRecvSegment(r, g, s - 1));
        }
      }
      EXPECT_EQ(RsRecvSegment(r, g, g - 2), Mod(r + 1, g));
      EXPECT_EQ(SegmentOwner(Mod(r + 1, g), g), r);
      EXPECT_EQ(AgSendSegment(r, g, 0), Mod(r + 1, g));
      for (int seg = 0; seg < g; ++seg) {
        EXPECT_EQ(rs[seg], seg == r ? 0 : 1) << "g=" << g << " r=" << r;
        EXPECT_EQ(ag[seg], seg == Mod(r + 1, g) ? 0 : 1);
      }
    }
  }
}

}  // namespace
}  // namespace halka
