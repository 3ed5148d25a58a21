#include "core/ring_plan.h"

#include <algorithm>

namespace halka {

RingPath::RingPath(int world, const std::vector<int>& order) {
  const size_t g = static_cast<size_t>(std::max(world, 1));
  rank_at_.resize(g);
  position_of_.assign(g, -1);
  bool valid = order.size() == g;
  for (size_t p = 0; valid && p < g; ++p) {
    const int r = order[p];
    valid = r >= 0 && static_cast<size_t>(r) < g &&
            position_of_[static_cast<size_t>(r)] < 0;
    if (valid) position_of_[static_cast<size_t>(r)] = static_cast<int>(p);
  }
  for (size_t p = 0; p < g; ++p) {
    rank_at_[p] = valid ? order[p] : static_cast<int>(p);
    position_of_[static_cast<size_t>(rank_at_[p])] = static_cast<int>(p);
  }
}

std::vector<Range> PlanSegments(size_t count, int world_size) {
  std::vector<Range> segments(static_cast<size_t>(world_size));
  const size_t g = static_cast<size_t>(world_size);
  const size_t base = count / g;
  const size_t extra = count % g;
  size_t offset = 0;
  for (size_t i = 0; i < g; ++i) {
    segments[i].offset = offset;
    segments[i].count = base + (i < extra ? 1 : 0);
    offset += segments[i].count;
  }
  return segments;
}

std::vector<Range> PlanChunks(const Range& range, size_t chunk_elems) {
  std::vector<Range> chunks;
  if (chunk_elems == 0) chunk_elems = 1;
  for (size_t done = 0; done < range.count; done += chunk_elems) {
    const size_t n = range.count - done < chunk_elems ? range.count - done
                                                      : chunk_elems;
    chunks.push_back(Range{range.offset + done, n});
  }
  return chunks;
}

}  // namespace halka
