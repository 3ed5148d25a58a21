// Fingerprint exchanges: before any data moves, every rank learns every
// other rank's fingerprint, so ranks that disagree fail alike, naming both.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/algorithms/algorithms.h"
#include "core/cost_model.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"

namespace halka {
namespace {

// What a rank whose fingerprint is `f` runs, as this rank sees it: the
// algorithm its fingerprint names, or, for a worker older than the tree
// (which says nothing), what its auto runs.
Algorithm TheirAlgorithm(const OpContext& op, const Fingerprint& f) {
  if (f.resolved != Algorithm::kAuto) return f.resolved;
  // Such a worker knows no link model: what this rank's counting rules
  // would run is where its guess starts.
  Algorithm runs = op.algorithm();
  if (op.config().link_model.has_value() && f.algorithm == Algorithm::kAuto) {
    CommConfig rules = op.config();
    rules.link_model.reset();
    runs = ResolveAlgorithm(rules, op.fp());
  }
  // (An older worker's auto runs naive or the ring: where this rank's auto
  // runs the tree, two-level or halving-doubling it runs the ring, where
  // recursive doubling naive.)
  if (f.algorithm == Algorithm::kAuto) {
    if (runs == Algorithm::kTree || runs == Algorithm::kTwoLevel ||
        runs == Algorithm::kHalvingDoubling) {
      return Algorithm::kRing;
    }
    if (runs == Algorithm::kRecursiveDoubling) {
      const uint64_t bytes = op.fp().count * DTypeSize(op.fp().dtype);
      return bytes <= op.config().eager_bytes ? Algorithm::kNaive
                                              : Algorithm::kRing;
    }
  }
  return runs;
}

// FAILED_PRECONDITION unless rank i, whose fingerprint is f, runs the call
// as this rank does.
absl::Status CheckRunsAlike(OpContext& op, const Fingerprint& all0, int i,
                            const Fingerprint& f) {
  const Algorithm runs = op.algorithm();
  const bool older = f.resolved == Algorithm::kAuto;
  const Algorithm theirs = TheirAlgorithm(op, f);
  if (theirs == runs) return absl::OkStatus();
  const bool unknown = AlgorithmName(theirs) == "unknown";
  return absl::FailedPreconditionError(absl::StrCat(
      op.Where(), ": ranks would run ", all0.ToString(),
      " differently: this rank runs ", AlgorithmName(runs), ", ", op.Who(i),
      " runs ",
      unknown ? absl::StrCat("an algorithm this version does not know "
                             "(halka.v1.Algorithm ",
                             static_cast<int>(theirs),
                             "; a worker of a newer version of halka: run "
                             "one version of halka-worker in a job)")
              : std::string(AlgorithmName(theirs)),
      older ? absl::StrCat(" (a worker older than the tree algorithm: its "
                           "auto runs ", AlgorithmName(theirs),
                           "; run one version of halka-worker in a job)")
            : std::string(!unknown && f.algorithm == Algorithm::kAuto
                   ? " (both ask for auto: a worker of another version "
                     "of halka; run one version of halka-worker in a job)"
                   : "")));
}

absl::Status CheckFingerprints(OpContext& op,
                               const std::vector<Fingerprint>& all) {
  const int g = op.world();
  // Every rank holds the same list, so every rank reaches the same verdict
  // and names the same pair.
  for (int i = 1; i < g; ++i) {
    if (all[static_cast<size_t>(i)] != all[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          op.Where(), ": ranks disagree on the operation: ",
          DescribePeer(op.config().members[0]), " calls ", all[0].ToString(),
          " but ", op.Who(i), " calls ",
          all[static_cast<size_t>(i)].ToString()));
    }
  }
  // Ranks that agree on the call must also run it alike. A rank that does
  // not say what it runs is older than the tree: its auto runs the ring
  // where this rank's runs the tree. All-to-all, every fingerprint came
  // straight from its rank; around the ring, an older rank also drops what
  // the fingerprints it forwards said, so only the nearest upstream rank
  // that says nothing is known to be older: the walk stops there.
  for (int s = 1; s < g; ++s) {
    const int i = op.path().rank_at(op.position() - s);
    const Fingerprint& f = all[static_cast<size_t>(i)];
    HALKA_RETURN_IF_ERROR(CheckRunsAlike(op, all[0], i, f));
    if (f.resolved == Algorithm::kAuto && !op.all_to_all()) break;
  }
  return absl::OkStatus();
}

// G-1 hops: each rank forwards the fingerprint it received to its
// successor, so after step s it holds the fingerprint of the rank s+1
// places before it in the ring.
absl::Status ExchangeAroundRing(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  if (g == 1) return absl::OkStatus();
  const int succ = op.succ();
  const int pred = op.pred();
  std::vector<Fingerprint> all(static_cast<size_t>(g));
  all[static_cast<size_t>(r)] = op.fp();
  FrameMeta meta = op.FingerprintMeta();
  op.SetLedger(Phase::kFingerprint, 0, 0, 1, -1);
  HALKA_RETURN_IF_ERROR(op.Send(succ, meta, nullptr, 0, -1));
  for (int s = 0; s < g - 1; ++s) {
    op.SetLedger(Phase::kFingerprint, s, 0, 1, pred);
    const int origin = op.path().rank_at(op.position() - 1 - s);
    HALKA_ASSIGN_OR_RETURN(
        InFrame in,
        op.AwaitFingerprint(
            pred, origin,
            s == 0 ? std::string()
                   : absl::StrCat("it forwards the fingerprint of ",
                                  op.Who(origin), ", which has not arrived")));
    if (in.meta.kind != FrameKind::kFingerprint ||
        in.meta.origin_rank != origin || in.meta.step != s) {
      return absl::DataLossError(absl::StrCat(
          op.Where(), ": expected the fingerprint of rank ", origin, " from ",
          op.Who(pred), " at step ", s, ", got a frame of kind ",
          static_cast<int>(in.meta.kind), " from origin ",
          in.meta.origin_rank));
    }
    all[static_cast<size_t>(origin)] = in.meta.fingerprint;
    if (s < g - 2) {
      FrameMeta fwd = in.meta;
      fwd.sender_rank = r;
      fwd.step = s + 1;
      HALKA_RETURN_IF_ERROR(op.Send(succ, fwd, nullptr, 0, -1));
    }
  }
  return CheckFingerprints(op, all);
}

// One hop: every rank sends its fingerprint (and, when eager, its whole
// buffer) to every other rank. Eager payloads are kept in op.eager().
// The bytes of an eager payload riding on the fingerprint frames, 0 when
// the fingerprints go alone.
size_t EagerBytes(const OpContext& op) {
  const uint64_t bytes = op.fp().count * DTypeSize(op.fp().dtype);
  const bool eager = op.fp().kind == OpKind::kAllReduce &&
                     op.algorithm() == Algorithm::kNaive && bytes > 0 &&
                     bytes <= op.config().eager_bytes;
  return eager ? static_cast<size_t>(bytes) : 0;
}

absl::Status SendAllToAll(OpContext& op) {
  const size_t bytes = EagerBytes(op);
  const bool eager = bytes > 0;
  const Fingerprint& fp = op.fp();
  FrameMeta meta = op.FingerprintMeta();
  meta.count = eager ? fp.count : 0;
  op.SetLedger(Phase::kFingerprint, 0, 0, 1, -1);
  const uint8_t* payload = nullptr;
  if (eager) {
    HALKA_ASSIGN_OR_RETURN(payload, op.buffer().HostView(0, fp.count));
  }
  // Start with the successor, so the ring's first link is warm first.
  for (int i = 1; i < op.world(); ++i) {
    HALKA_RETURN_IF_ERROR(
        op.Send(op.path().rank_at(op.position() + i), meta, payload, bytes, -1));
  }
  return absl::OkStatus();
}

// Waits for the fingerprint `from` sends of its own call. Where the
// deadline passes first, those of `rest` whose frames are not here either
// are late too (two newcomers at once).
absl::StatusOr<InFrame> AwaitOwnFingerprint(OpContext& op, int from,
                                            absl::Span<const int> rest) {
  absl::StatusOr<InFrame> got =
      op.AwaitFingerprint(from, from, "its fingerprint");
  if (!got.ok()) {
    op.AlsoLate(rest);
    return got.status();
  }
  if (got->meta.kind != FrameKind::kFingerprint ||
      got->meta.origin_rank != from) {
    return absl::DataLossError(absl::StrCat(
        op.Where(), ": expected the fingerprint of ", op.Who(from),
        ", got a frame of kind ", static_cast<int>(got->meta.kind),
        " from origin ", got->meta.origin_rank));
  }
  return got;
}

// Whether rank k's fingerprint was taken ahead of the exchange's wait.
bool HeardEarly(OpContext& op, int k) {
  const auto& early = op.early_fingerprints();
  return static_cast<size_t>(k) < early.size() &&
         early[static_cast<size_t>(k)].has_value();
}

absl::Status AwaitAllToAll(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  const size_t bytes = EagerBytes(op);
  const bool eager = bytes > 0;
  const Fingerprint& fp = op.fp();
  std::vector<Fingerprint> all(static_cast<size_t>(g));
  all[static_cast<size_t>(r)] = fp;
  std::vector<InFrame>& kept = op.eager();
  if (eager) kept.resize(static_cast<size_t>(g));
  for (int i = 1; i < g; ++i) {
    const int from = op.path().rank_at(op.position() - i);
    if (!eager && HeardEarly(op, from)) {
      all[static_cast<size_t>(from)] =
          *op.early_fingerprints()[static_cast<size_t>(from)];
      continue;
    }
    std::vector<int> rest;
    for (int j = i + 1; j < g; ++j) {
      const int k = op.path().rank_at(op.position() - j);
      if (!HeardEarly(op, k)) rest.push_back(k);
    }
    HALKA_ASSIGN_OR_RETURN(InFrame in, AwaitOwnFingerprint(op, from, rest));
    all[static_cast<size_t>(from)] = in.meta.fingerprint;
    if (eager) kept[static_cast<size_t>(from)] = std::move(in);
  }
  HALKA_RETURN_IF_ERROR(CheckFingerprints(op, all));
  if (eager) {
    for (int k = 0; k < g; ++k) {
      if (k == r) continue;
      const InFrame& f = kept[static_cast<size_t>(k)];
      if (f.PayloadBytes() != bytes || f.meta.dtype != fp.dtype) {
        return absl::DataLossError(absl::StrCat(
            op.Where(), ": the eager payload of ", op.Who(k), " has ",
            f.PayloadBytes(), " bytes, expected ", bytes));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> AwaitFingerprintsEarly(OpContext& op,
                                            const std::vector<int>& ranks) {
  if (!op.all_to_all() || EagerBytes(op) > 0) {
    return absl::InternalError(
        "AwaitFingerprintsEarly needs all-to-all fingerprints, not eager");
  }
  auto& early = op.early_fingerprints();
  early.resize(static_cast<size_t>(op.world()));
  bool agree = true;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int from = ranks[i];
    // Should the deadline pass, every rank not heard from yet is late too.
    std::vector<int> rest;
    for (int k = 0; k < op.world(); ++k) {
      if (k != op.rank() && k != from && !HeardEarly(op, k)) rest.push_back(k);
    }
    HALKA_ASSIGN_OR_RETURN(InFrame in, AwaitOwnFingerprint(op, from, rest));
    early[static_cast<size_t>(from)] = in.meta.fingerprint;
    agree = agree && CheckFingerprintPair(op, from, in.meta.fingerprint).ok();
  }
  return agree;
}

absl::Status CheckFingerprintPair(OpContext& op, int from,
                                  const Fingerprint& theirs) {
  const Fingerprint& mine = op.fp();
  if (theirs != mine) {
    return absl::FailedPreconditionError(absl::StrCat(
        op.Where(), ": ranks disagree on the operation: this rank calls ",
        mine.ToString(), " but ", op.Who(from), " calls ", theirs.ToString()));
  }
  return CheckRunsAlike(op, mine, from, theirs);
}

namespace {

// The ring's shape as the cost model sees it: the host sizes where the
// hosts partition the ranks, else none known.
RingShape ShapeOf(const CommConfig& config) {
  RingShape shape;
  shape.world = config.world_size;
  if (HostsPartitionRanks(config)) {
    for (const std::vector<int>& h : config.hosts) {
      shape.host_sizes.push_back(static_cast<int>(h.size()));
    }
  }
  return shape;
}

// AUTO by the job's link model: the algorithm it predicts fastest for this
// call among those that may run on this ring (AutoCandidates). nullopt
// without a model, or with one that cannot price every candidate (a level
// it lacks): the counting rules.
std::optional<Algorithm> ByLinkModel(const CommConfig& config,
                                     const Fingerprint& fp) {
  if (!config.link_model.has_value()) return std::nullopt;
  const RingShape shape = ShapeOf(config);
  const double bytes = static_cast<double>(fp.count * DTypeSize(fp.dtype));
  const std::vector<Algorithm> candidates =
      AutoCandidates(shape, fp.kind, bytes, config.all_to_all_max_world,
                     static_cast<double>(kDoublingMaxBytes),
                     static_cast<double>(config.eager_bytes),
                     static_cast<double>(config.halving_bytes));
  // Only a model that prices every candidate ranks them (one that lacks
  // the level two-level or the tree needs would drop them unseen). Ties go
  // to the earlier candidate.
  std::optional<ModelChoice> best;
  for (Algorithm a : candidates) {
    const std::optional<double> t =
        PredictSeconds(shape, fp.kind, a, bytes, *config.link_model);
    if (!t.has_value()) return std::nullopt;
    if (!best.has_value() || *t < best->seconds) best = ModelChoice{a, *t};
  }
  if (!best.has_value()) return std::nullopt;
  return best->algorithm;
}

}  // namespace

double ModelSeconds(const CommConfig& config, const Fingerprint& fp,
                    Algorithm algorithm) {
  if (!config.link_model.has_value()) return 0;
  return PredictSeconds(ShapeOf(config), fp.kind, algorithm,
                        static_cast<double>(fp.count * DTypeSize(fp.dtype)),
                        *config.link_model)
      .value_or(0);
}

Algorithm ResolveAlgorithm(const CommConfig& config, const Fingerprint& fp) {
  switch (fp.kind) {
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAllToAll:
      return Algorithm::kNaive;  // straight to the peer: one hop
    case OpKind::kReduce:
      // Straight to the root while the root's links stay few (as the
      // naive all-reduce's), else the ring.
      if (fp.algorithm != Algorithm::kAuto) return fp.algorithm;
      return config.world_size <= config.all_to_all_max_world &&
                     fp.count * DTypeSize(fp.dtype) <= config.eager_bytes
                 ? Algorithm::kNaive
                 : Algorithm::kRing;
    case OpKind::kBroadcast: {
      // A buffer of one chunk does not pipeline: the chain takes G-1 hops
      // of the whole buffer in a row, the tree ceil(log2 H) + ceil(log2 g)
      // (fewer on any link). Larger ones pipeline along the chain, whose
      // every link carries the buffer once where a tree's inner node sends
      // it once per child.
      if (fp.algorithm != Algorithm::kAuto) return fp.algorithm;
      if (std::optional<Algorithm> a = ByLinkModel(config, fp)) return *a;
      return config.world_size >= 3 &&
                     fp.count * DTypeSize(fp.dtype) <= config.chunk_bytes
                 ? Algorithm::kTree
                 : Algorithm::kRing;
    }
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
      // Two-level wherever the hosts allow it, at every size: (g-1) steps
      // inside the host and H-1 across, against the flat ring's G-1 that
      // each cross a host boundary somewhere, and (H-1)/H of the buffer
      // through each host's NIC against (G-1)/G.
      if (fp.algorithm == Algorithm::kRing) return Algorithm::kRing;
      if (fp.algorithm == Algorithm::kAuto) {
        if (std::optional<Algorithm> a = ByLinkModel(config, fp)) return *a;
      }
      return TwoLevelUsable(config) ? Algorithm::kTwoLevel : Algorithm::kRing;
    default:
      break;
  }
  if (fp.kind != OpKind::kAllReduce) return Algorithm::kRing;
  if (fp.algorithm == Algorithm::kTwoLevel) {
    return TwoLevelUsable(config) ? Algorithm::kTwoLevel : Algorithm::kRing;
  }
  if (fp.algorithm == Algorithm::kRecursiveDoubling &&
      fp.count * DTypeSize(fp.dtype) > kDoublingMaxBytes) {
    return Algorithm::kRing;  // each frame would carry the whole buffer
  }
  if (fp.algorithm != Algorithm::kAuto) return fp.algorithm;
  if (std::optional<Algorithm> a = ByLinkModel(config, fp)) return *a;
  // Small buffers: recursive doubling while every rank may talk to every
  // rank (log2 G swaps of one frame each: G log2 G frames in all where
  // naive's one hop takes G(G-1), and each frame costs the CPU wake-ups that
  // dominate a small operation; docs/performance.md); on larger worlds the
  // tree's 2 + 2*ceil(log2 H) hops, not the ring's 2(G-1) (docs/scaling.md's
  // model: the alpha terms dominate).
  // Larger ones: on hosts of g >= 2 ranks each, two-level (2(H-1)/H of the
  // buffer through each host's NIC, not the flat ring's 2(G-1)/G, in
  // 2(H-1) network steps); else recursive doubling still up to
  // doubling_bytes where every rank may talk to every rank (its log2 G
  // steps against the ring's 2(G-1): measured faster up to 256 KiB), and
  // the ring above. Not for two ranks on one host: there the ring's two
  // half-size steps cost one same-host hop more (microseconds) and save
  // copying and reducing half the buffer, measured as fast at 128 KiB and
  // faster at 256 KiB (docs/performance.md). The rule reads the ring's
  // hosts, the same on every rank; a group's sub-ring knows no hosts and
  // keeps recursive doubling.
  // Above doubling_bytes and up to halving_bytes, on such a ring of 4 or
  // 8 ranks, halving-doubling: 2 log2 G steps against the ring's 2(G-1),
  // each rank sending what it sends in the ring (measured faster at G = 4
  // and 8 from 512 KiB to 2 MiB and at G = 8 at 4 MiB, as fast at G = 4 at
  // 4 MiB; at 16 MiB on 8 ranks the ring's pipeline wins;
  // docs/performance.md). Not where ranks would fold in (their whole
  // buffer goes out and comes back), nor on 16 ranks, where two cores could
  // not tell the two apart.
  const uint64_t bytes = fp.count * DTypeSize(fp.dtype);
  if (bytes > config.eager_bytes) {
    if (TwoLevelUsable(config)) return Algorithm::kTwoLevel;
    const int g = config.world_size;
    const bool two_on_one_host = g == 2 && config.hosts.size() == 1;
    const bool all_to_all = g <= config.all_to_all_max_world;
    if (all_to_all && !two_on_one_host &&
        bytes <= std::max<uint64_t>(config.doubling_bytes,
                                    config.eager_bytes)) {
      return Algorithm::kRecursiveDoubling;
    }
    if (all_to_all && (g == 4 || g == 8) && bytes <= config.halving_bytes) {
      return Algorithm::kHalvingDoubling;
    }
    return Algorithm::kRing;
  }
  return config.world_size <= config.all_to_all_max_world
             ? Algorithm::kRecursiveDoubling
             : Algorithm::kTree;
}

absl::Status ExchangeFingerprints(OpContext& op) {
  if (!op.all_to_all()) return ExchangeAroundRing(op);
  HALKA_RETURN_IF_ERROR(SendAllToAll(op));
  return AwaitAllToAll(op);
}

absl::Status SendFingerprints(OpContext& op) {
  if (!op.all_to_all()) {
    return absl::InternalError("SendFingerprints needs all-to-all fingerprints");
  }
  return SendAllToAll(op);
}

absl::Status AwaitFingerprints(OpContext& op) {
  if (!op.all_to_all()) {
    return absl::InternalError("AwaitFingerprints needs all-to-all fingerprints");
  }
  return AwaitAllToAll(op);
}

}  // namespace halka
