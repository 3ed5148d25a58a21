// The latency-bandwidth model of docs/scaling.md ("The model"): what a
// collective of S bytes should cost with each algorithm on a ring of G
// ranks over H hosts of g ranks, given each level's per-message latency α
// and rate B. Pure functions, no I/O.
//
// Levels: kLocal is a link between two ranks of one host (shared memory),
// kNet a link between hosts. A flat algorithm on ranks spread over two or
// more hosts moves at the pace of its slowest edge, which is taken to be a
// net edge; on one host (or hosts not known and a model that has only one
// level) its edges are local.
#ifndef HALKA_CORE_COST_MODEL_H_
#define HALKA_CORE_COST_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "halka/types.h"

namespace halka {

struct LevelCost {
  double alpha_s = 0;      // per message, seconds
  double bytes_per_s = 0;  // rate; 0: not known
  bool known() const { return bytes_per_s > 0 && alpha_s >= 0; }
  // alpha + bytes / B.
  double Message(double bytes) const { return alpha_s + bytes / bytes_per_s; }
};

struct LinkModel {
  LevelCost local;  // between ranks of one host
  LevelCost net;    // between hosts
};

// The ring's shape as the algorithms see it (CommConfig::hosts): the
// number of ranks on each host, in ring order. Empty: hosts not known.
struct RingShape {
  int world = 1;
  std::vector<int> host_sizes;

  int hosts() const { return static_cast<int>(host_sizes.size()); }
  // Two-level's rule (TwoLevelUsable): at least 2 hosts of the same size,
  // at least 2.
  bool two_level_usable() const;
  // g, where every host has the same size; 0 otherwise.
  int per_host() const;
};

// Predicted seconds for `kind` over a whole buffer of `bytes` (an
// all-gather's result, a reduce-scatter's input, as nccl-tests counts)
// with `algorithm` as it runs on `shape` (two_level on a shape it cannot
// use runs the ring, and is predicted as the ring). nullopt where the
// model has no formula (the parameter server, collectives other than
// all-reduce, reduce-scatter, all-gather, broadcast) or lacks a level the
// algorithm uses.
std::optional<double> PredictSeconds(const RingShape& shape, OpKind kind,
                                     Algorithm algorithm, double bytes,
                                     const LinkModel& model);

// The algorithm with the least predicted time for `kind` of `bytes` on
// `shape` among those the collective implements (all-reduce: ring,
// recursive doubling, tree, two-level where usable, naive; reduce-scatter
// and all-gather: ring, two-level where usable), and its prediction.
// nullopt where nothing can be predicted.
struct ModelChoice {
  Algorithm algorithm = Algorithm::kRing;
  double seconds = 0;
};
std::optional<ModelChoice> BestByModel(const RingShape& shape, OpKind kind,
                                       double bytes, const LinkModel& model);

// "α 38 µs, B 1.21 GB/s" for a level; "not known" where it is not.
std::string DescribeLevel(const LevelCost& level);

}  // namespace halka

#endif  // HALKA_CORE_COST_MODEL_H_
