// Which ranks pair up in recursive doubling (doubling.cc) and in
// halving-doubling (halving.cc): internal to core/algorithms.
#ifndef HALKA_CORE_ALGORITHMS_DOUBLING_PLAN_H_
#define HALKA_CORE_ALGORITHMS_DOUBLING_PLAN_H_

#include <algorithm>

#include "absl/time/time.h"

namespace halka {

// One unit of a wait's deadline slack in both: a wait at a later step
// waits on ranks that wait themselves, so it ends a unit per step past the
// deadline, and the wait nearest the cause fails first and names it in its
// ABORT. A fiftieth of the timeout, within [20 ms, 250 ms].
inline absl::Duration SlackUnit(absl::Duration timeout) {
  return std::clamp(timeout / 50, absl::Milliseconds(20),
                    absl::Milliseconds(250));
}

// The positions on the ring's path (op.path(): a host's ranks adjacent, so
// the rounds between near partners stay inside hosts) of a world of g: the
// first p (the largest power of two <= g) "virtual" ranks pair up in
// rounds; each of the g - p ranks beyond them folds into a partner first
// and takes the result back at the end. As MPICH's: position 2i+1
// (i < g - p) folds into position 2i, which takes virtual rank i; position
// r >= 2(g - p) takes virtual rank r - (g - p).
struct DoublingPlan {
  int p = 1;        // ranks that pair up in rounds
  int extra = 0;    // g - p ranks that fold in and out
  int vrank = -1;   // this rank's virtual rank; -1: it folds in
  int folds = -1;   // the position that folds into this one, or into which
                    // this one folds (-1: none)
  int rounds = 0;   // log2 p
};

inline DoublingPlan PlanFor(int g, int r) {
  DoublingPlan d;
  while (d.p * 2 <= g) {
    d.p *= 2;
    ++d.rounds;
  }
  d.extra = g - d.p;
  if (r < 2 * d.extra) {
    if (r % 2 == 1) {
      d.folds = r - 1;  // folds into its even neighbour; no virtual rank
    } else {
      d.vrank = r / 2;
      d.folds = r + 1;
    }
  } else {
    d.vrank = r - d.extra;
  }
  return d;
}

// The position of virtual rank v.
inline int RealRank(const DoublingPlan& d, int v) {
  return v < d.extra ? 2 * v : v + d.extra;
}

}  // namespace halka

#endif  // HALKA_CORE_ALGORITHMS_DOUBLING_PLAN_H_
