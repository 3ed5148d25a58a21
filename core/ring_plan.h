// How a buffer is cut into segments and chunks, and which segment each rank
// sends and receives at each ring step. Pure functions; every rank computes
// the same plan from (count, world_size, chunk size) alone.
#ifndef HALKA_CORE_RING_PLAN_H_
#define HALKA_CORE_RING_PLAN_H_

#include <cstddef>
#include <vector>

namespace halka {

// A contiguous run of elements.
struct Range {
  size_t offset = 0;  // elements from the start of the buffer
  size_t count = 0;
};

// Splits `count` elements into `world_size` segments. The first
// count % world_size segments hold one element more than the rest, so
// segment sizes differ by at most one. Segments may be empty (count <
// world_size). Requires world_size >= 1.
std::vector<Range> PlanSegments(size_t count, int world_size);

// Splits one range into chunks of at most `chunk_elems` elements (>= 1).
// An empty range has no chunks.
std::vector<Range> PlanChunks(const Range& range, size_t chunk_elems);

// Positive modulo: Mod(-1, 4) == 3.
inline int Mod(int a, int n) { return ((a % n) + n) % n; }

// The ring's path over the ranks (CommConfig::ring_order): the rank at
// each ring position and each rank's position. Ranks are the users'; the
// ring passes them in this order (the rendezvous keeps each host's ranks
// adjacent), so a rank's successor is the rank at the next position, not
// rank+1. The step formulas below take ring positions; the segment a step
// names is the rank at that position (rank_at), so that segment r is still
// rank r's slice (reduce-scatter, all-gather). An empty order, or one that
// is not a permutation of 0..world-1, is rank order.
class RingPath {
 public:
  RingPath(int world, const std::vector<int>& order);
  int world() const { return static_cast<int>(rank_at_.size()); }
  int rank_at(int position) const {
    return rank_at_[static_cast<size_t>(Mod(position, world()))];
  }
  int position(int rank) const {
    return position_of_[static_cast<size_t>(rank)];
  }
  int succ(int rank) const { return rank_at(position(rank) + 1); }
  int pred(int rank) const { return rank_at(position(rank) - 1); }

 private:
  std::vector<int> rank_at_;
  std::vector<int> position_of_;
};

// In rank order (positions = ranks):
// Reduce-scatter step s (0 <= s < G-1): rank r sends segment (r-s) mod G to
// its successor and receives segment (r-s-1) mod G from its predecessor,
// reducing it into its own copy. After G-1 steps rank r holds the full
// reduction of segment (r+1) mod G.
inline int RsSendSegment(int rank, int world, int step) {
  return Mod(rank - step, world);
}
inline int RsRecvSegment(int rank, int world, int step) {
  return Mod(rank - step - 1, world);
}
// All-gather step s: rank r sends segment (r+1-s) mod G and receives
// segment (r-s) mod G, overwriting its copy.
inline int AgSendSegment(int rank, int world, int step) {
  return Mod(rank + 1 - step, world);
}
inline int AgRecvSegment(int rank, int world, int step) {
  return Mod(rank - step, world);
}
// The rank that owns (finishes reducing) segment `segment`.
inline int SegmentOwner(int segment, int world) {
  return Mod(segment - 1, world);
}

}  // namespace halka

#endif  // HALKA_CORE_RING_PLAN_H_
