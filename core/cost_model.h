// The latency-bandwidth model of docs/scaling.md ("The model"): what a
// collective of S bytes should cost with each algorithm on a ring of G
// ranks over H hosts of g ranks, given each level's per-message latency α
// and rate B. Pure functions, no I/O.
//
// Levels: `local` is a link between two ranks of one host (shared
// memory), `net` a link between hosts. A flat algorithm on ranks spread
// over two or more hosts moves at the pace of its slowest edge, taken to
// be a net edge, and so with hosts not known (a group's ring); on one host
// at the local level (each where the model has it, else the other). Where several of a host's
// ranks send across hosts at once the host's NIC is charged for all of
// them: two-level's g rings, naive's g (G-g) copies, recursive doubling's
// cross-host rounds (g buffers; its first log2 g rounds stay inside the
// host when g is a power of two). The ring in host order crosses each
// host boundary once each way: each step is bound by its NIC's share (one
// edge) or by the cycle of hops around the ring, a net hop H times in G,
// a local one otherwise. The double binary tree moves half a buffer per
// edge of either tree, charged per link, and its first chunk is stored
// and forwarded at every hop.
#ifndef HALKA_CORE_COST_MODEL_H_
#define HALKA_CORE_COST_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
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
  // Non-zero: measured by the job's members on this generation's ring
  // (LinkModel.measured_generation); 0: given by the operator. Not part
  // of the model's values (SameLinkModel ignores it).
  uint64_t measured_generation = 0;
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
// use runs the ring, and is predicted as the ring): its data phase and
// its fingerprint pass (FingerprintPassSeconds). nullopt where the
// model has no formula (the parameter server, collectives other than
// all-reduce, reduce-scatter, all-gather, broadcast) or lacks a level the
// algorithm uses.
std::optional<double> PredictSeconds(const RingShape& shape, OpKind kind,
                                     Algorithm algorithm, double bytes,
                                     const LinkModel& model);
// The fingerprint pass that precedes the data (core/communicator.cc
// AgreeOnFingerprints): one hop at the level a flat algorithm moves at
// (every rank sends its fingerprint to every rank), where recursive
// doubling's all-reduce carries them on its data frames (0). The ring's
// first step leaves while the pass is under way (halving-doubling's too,
// where it reads only the rank's input), and a two-level
// all-reduce on hosts a network hop apart reduces its host's sums and
// sends its first cross-host step meanwhile (TwoLevelStartEarly), but
// neither reduces a chunk into the buffer before the pass ends. Measured
// on the delayed test bed (docs/scaling.md) the ring, two-level and naive
// took about one net hop more than their data phase (two-level with its
// early start: 0.96-1.05 of the prediction with that hop at 4-64 KiB). Worlds above all_to_all_max_world pass the fingerprints around
// the ring, which this does not price. 0 on one rank; nullopt without the
// level.
std::optional<double> FingerprintPassSeconds(const RingShape& shape,
                                             OpKind kind, Algorithm algorithm,
                                             const LinkModel& model);

// What AUTO may run for `kind` of `bytes` on `shape`, as
// ResolveAlgorithm allows it, in the order ties go: the ring; two-level
// where the hosts allow it (all-reduce, reduce-scatter, all-gather); for
// an all-reduce the tree, and on worlds of at most all_to_all_max_world
// recursive doubling (up to doubling_max_bytes, where a frame may carry
// the whole buffer) and naive (up to naive_max_bytes, the eager size: it
// stages a whole copy of the buffer and does not pipeline, which the
// model does not price), then halving-doubling on worlds of 4, 8 or 16
// where two-level cannot run (up to halving_max_bytes: above it the ring's
// pipeline, which the model does not price either, was measured faster;
// CommConfig::halving_bytes; on other worlds ranks fold their whole buffer
// in and out, as in the counting rules).
std::vector<Algorithm> AutoCandidates(
    const RingShape& shape, OpKind kind, double bytes,
    int all_to_all_max_world = 16,
    double doubling_max_bytes = 16.0 * (1 << 20),
    double naive_max_bytes = 64.0 * 1024,
    double halving_max_bytes = 4.0 * (1 << 20));

// The algorithm with the least predicted time for `kind` of `bytes` on
// `shape` among AutoCandidates (the defaults), and its prediction.
// nullopt where nothing can be predicted.
struct ModelChoice {
  Algorithm algorithm = Algorithm::kRing;
  double seconds = 0;
};
std::optional<ModelChoice> BestByModel(const RingShape& shape, OpKind kind,
                                       double bytes, const LinkModel& model);

// The same over the algorithms in `candidates` only (those that can run
// where the caller asks).
std::optional<ModelChoice> BestByModel(const RingShape& shape, OpKind kind,
                                       double bytes, const LinkModel& model,
                                       const std::vector<Algorithm>& candidates);

// Whether two optional models are the same (both none, or every value
// equal within a part in 10^9: read back from a membership's microseconds).
bool SameLinkModel(const std::optional<LinkModel>& a,
                   const std::optional<LinkModel>& b);

// The median of `values` (the mean of the middle two for an even count);
// 0 for none. (The rendezvous's medians of probes and edge figures, a
// probe's of its timings.)
double Median(std::vector<double> values);

// "alpha 38.0 us, B 1.210 GB/s" for a level; "not known" where it is not.
std::string DescribeLevel(const LevelCost& level);
// "local: alpha 1.0 us, B 10.000 GB/s; net: alpha 100.0 us, B 1.000 GB/s",
// then ", measured at generation N" for a measured one.
std::string DescribeLinkModel(const LinkModel& model);

// "local=ALPHA_US:GBPS,net=ALPHA_US:GBPS" (either part may be left out:
// that level is not known), e.g. "local=5:8,net=60:1.2": 5 us and 8 GB/s
// inside a host. INVALID_ARGUMENT, naming the part, for anything else:
// an unknown level, a missing or negative alpha, a rate that is not above
// zero, nothing at all.
absl::StatusOr<LinkModel> ParseLinkModel(const std::string& text);

}  // namespace halka

#endif  // HALKA_CORE_COST_MODEL_H_
