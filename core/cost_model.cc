#include "core/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace halka {
namespace {

int CeilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

int FloorLog2(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}

// The level a flat algorithm moves at: inside the host where every rank is
// on one, else (two or more hosts, or hosts not known: a group's ring)
// between hosts; the other level where that one is not known (a model of
// one level).
const LevelCost* FlatLevel(const RingShape& shape, const LinkModel& m) {
  const bool one_host = shape.hosts() == 1;
  const LevelCost& first = one_host ? m.local : m.net;
  const LevelCost& second = one_host ? m.net : m.local;
  if (first.known()) return &first;
  if (second.known()) return &second;
  return nullptr;
}

// tree.cc splits a buffer over its two trees from two chunks of the
// default chunk size (CommConfig::chunk_bytes, which the model does not
// see) up; a smaller one goes through tree 0 alone.
constexpr double kTreeSplitBytes = 2.0 * (1 << 20);
// CommConfig::chunk_bytes' default, for the chain broadcast's pipeline.
constexpr double kModelChunkBytes = 1 << 20;

// What the busiest link of tree.cc's trees of n nodes carries, in buffers
// each way. Each tree (tree 0 a heap, node i's children 2i+1, 2i+2; tree
// 1 its mirror, node i in place n-1-i) moves its part of the buffer once
// over each of its edges each way. Both trees, half the buffer each: a
// node's link carries half a buffer per edge it has in either: 1 for 2
// nodes, 1.5 for 3 or 4, 2 from 5 on (an inner node of one tree, parent
// and two children, is a leaf of the other). Tree 0 alone: a buffer per
// edge of it: 1, 2 for 3 or 4, 3 from 5 on.
double TreeLoad(int n, bool both) {
  int most = 0;
  for (int i = 0; i < n; ++i) {
    int edges = 0;
    for (int p : {i, n - 1 - i}) {
      edges += (p > 0) + (2 * p + 1 < n) + (2 * p + 2 < n);
      if (!both) break;
    }
    most = std::max(most, edges);
  }
  return both ? most / 2.0 : most;
}

// The ring on two or more hosts, in host order (the membership's ring
// order keeps a host's ranks adjacent): of its G edges H cross between
// hosts, the others stay inside one. `steps` steps of `piece` bytes, each
// bounded by the slower of
//   - the cycle: each step's piece moves one hop around a ring that is
//     pipelined by chunks, so a step costs on average a hop whose latency
//     is a net one H times in G and a local one G-H times in G;
//   - the host's NIC: one edge each way carries every step's piece;
//   - a link inside a host, which carries it too.
// nullopt where the hosts or a level are not known (the flat formula
// then). Measured on network namespaces with 2 ms between hosts
// (docs/scaling.md "Times with latency between hosts"), the ring took
// 0.82-1.59 times this (with the fingerprint pass), where charging every
// step a net hop predicted about twice its time.
std::optional<double> RingOnHosts(const RingShape& shape, double steps,
                                  double piece, const LinkModel& m) {
  const int h = shape.hosts();
  if (h < 2 || !m.local.known() || !m.net.known()) return std::nullopt;
  const double g = shape.world;
  const double cycle =
      (h * m.net.Message(piece) + (g - h) * m.local.Message(piece)) / g;
  return steps * std::max({cycle, piece / m.net.bytes_per_s,
                           piece / m.local.bytes_per_s});
}

// The double binary tree of `nodes` nodes over links of `level`: the
// buffer goes up ceil(log2 nodes) levels and comes down as many, chunk by
// chunk (half the buffer through each tree from two chunks up), each hop a
// chunk's store and forward: the first chunk's hops, then the busiest
// link's share of the whole buffer (TreeLoad). One chunk (up to 1 MiB)
// pays every hop's latency and transfer in turn.
double TreeSeconds(int nodes, double s, const LevelCost& level) {
  const bool both = s >= kTreeSplitBytes;
  const double part = both ? s / 2 : s;
  const double chunk = std::min(part, kModelChunkBytes);
  const int hops = 2 * CeilLog2(nodes);
  return hops * level.alpha_s + (hops - 1) * chunk / level.bytes_per_s +
         TreeLoad(nodes, both) * s / level.bytes_per_s;
}

int Widest(const RingShape& shape) {
  return shape.host_sizes.empty()
             ? 1
             : *std::max_element(shape.host_sizes.begin(),
                                 shape.host_sizes.end());
}

std::optional<double> AllReduce(const RingShape& shape, Algorithm algorithm,
                                double s, const LinkModel& m) {
  const int g_world = shape.world;
  if (g_world <= 1) return 0.0;
  const LevelCost* flat = FlatLevel(shape, m);
  if (algorithm == Algorithm::kTwoLevel && !shape.two_level_usable()) {
    algorithm = Algorithm::kRing;
  }
  switch (algorithm) {
    case Algorithm::kRing:
      if (flat == nullptr) return std::nullopt;
      if (auto t = RingOnHosts(shape, 2.0 * (g_world - 1), s / g_world, m)) {
        return *t;
      }
      return 2.0 * (g_world - 1) * flat->Message(s / g_world);
    case Algorithm::kRecursiveDoubling: {
      if (flat == nullptr) return std::nullopt;
      const int p = 1 << FloorLog2(g_world);
      const int steps = FloorLog2(g_world) + (p == g_world ? 0 : 2);
      if (shape.hosts() < 2) return steps * flat->Message(s);
      // Partners by ring position: with g a power of two, the first
      // log2 g rounds stay inside the host; every later round (and the
      // fold in and out) sends g whole buffers through each host's NIC.
      const int g = shape.per_host();
      const int inside =
          g >= 2 && (g & (g - 1)) == 0 && m.local.known() ? FloorLog2(g) : 0;
      const int nic = std::max(Widest(shape), 1);
      return inside * m.local.Message(s) +
             (steps - inside) * (flat->alpha_s + nic * s / flat->bytes_per_s);
    }
    case Algorithm::kHalvingDoubling: {
      if (flat == nullptr) return std::nullopt;
      // Round k (each way) moves S / 2^(k+1) to the partner at distance
      // 2^k; the ranks beyond p fold their whole buffer in and take it
      // back. On hosts of g ranks, g a power of two and no rank folding,
      // the first log2 g rounds stay inside the host, and in every later
      // round the host's g ranks send through its NIC at once.
      const int rounds = FloorLog2(g_world);
      const bool folds = (1 << rounds) != g_world;
      const int g = shape.per_host();
      const bool on_hosts = shape.hosts() >= 2;
      const int inside = on_hosts && !folds && g >= 2 && (g & (g - 1)) == 0 &&
                                 m.local.known()
                             ? FloorLog2(g)
                             : 0;
      const int nic = on_hosts ? std::max(Widest(shape), 1) : 1;
      auto across = [&](double piece) {
        return flat->alpha_s + nic * piece / flat->bytes_per_s;
      };
      double t = 0;
      for (int k = 0; k < rounds; ++k) {
        const double piece = s / static_cast<double>(2 << k);
        t += 2.0 * (k < inside ? m.local.Message(piece) : across(piece));
      }
      if (folds) t += 2.0 * across(s);
      return t;
    }
    case Algorithm::kNaive: {
      if (flat == nullptr) return std::nullopt;
      // One hop; each rank's G-1 copies, of which a host's NIC carries
      // g (G-g) (its g ranks' copies for the other hosts).
      const int g = Widest(shape);
      const double copies =
          shape.hosts() < 2 ? g_world - 1.0
                            : static_cast<double>(g) * (g_world - g);
      return flat->alpha_s + copies * s / flat->bytes_per_s;
    }
    case Algorithm::kTree: {
      if (shape.hosts() < 2) {
        if (flat == nullptr) return std::nullopt;
        return TreeSeconds(g_world, s, *flat);
      }
      if (!m.net.known()) return std::nullopt;
      double t = TreeSeconds(shape.hosts(), s, m.net);
      const int widest = Widest(shape);
      if (widest >= 2) {
        // A host's ranks to its leader and back: the leader's inbox takes
        // g-1 buffers, and sends g-1.
        if (!m.local.known()) return std::nullopt;
        t += 2.0 * m.local.alpha_s + (widest - 1) * s / m.local.bytes_per_s;
      }
      return t;
    }
    case Algorithm::kTwoLevel: {
      if (!m.local.known() || !m.net.known()) return std::nullopt;
      const int g = shape.per_host();
      const int h = shape.hosts();
      // g - 1 steps each way of a column (S/g) inside the host; 2(H - 1)
      // steps of S/(gH) across, g rings sharing the host's NIC.
      return 2.0 * (g - 1) * m.local.Message(s / g) +
             2.0 * (h - 1) * m.net.Message(s / h);
    }
    default:
      return std::nullopt;  // the parameter server: its own hosts
  }
}

std::optional<double> Sliced(const RingShape& shape, Algorithm algorithm,
                             double s, const LinkModel& m) {
  const int g_world = shape.world;
  if (g_world <= 1) return 0.0;
  if (algorithm == Algorithm::kTwoLevel && shape.two_level_usable()) {
    if (!m.local.known() || !m.net.known()) return std::nullopt;
    const int g = shape.per_host();
    const int h = shape.hosts();
    return (g - 1) * m.local.Message(s / g) + (h - 1) * m.net.Message(s / h);
  }
  if (algorithm != Algorithm::kRing && algorithm != Algorithm::kTwoLevel) {
    return std::nullopt;
  }
  const LevelCost* flat = FlatLevel(shape, m);
  if (flat == nullptr) return std::nullopt;
  if (auto t = RingOnHosts(shape, g_world - 1.0, s / g_world, m)) return *t;
  return (g_world - 1) * flat->Message(s / g_world);
}

}  // namespace

bool RingShape::two_level_usable() const {
  return hosts() >= 2 && per_host() >= 2;
}

int RingShape::per_host() const {
  if (host_sizes.empty()) return 0;
  for (int n : host_sizes) {
    if (n != host_sizes[0]) return 0;
  }
  return host_sizes[0];
}

namespace {

std::optional<double> DataPhaseSeconds(const RingShape& shape, OpKind kind,
                                       Algorithm algorithm, double bytes,
                                       const LinkModel& model) {
  switch (kind) {
    case OpKind::kAllReduce:
      return AllReduce(shape, algorithm, bytes, model);
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
      return Sliced(shape, algorithm, bytes, model);
    case OpKind::kBroadcast: {
      if (shape.world <= 1) return 0.0;
      const LevelCost* flat = FlatLevel(shape, model);
      if (flat == nullptr) return std::nullopt;
      if (algorithm != Algorithm::kTree) {
        // The chain from the root, pipelined by chunks (of the default
        // size: the model does not see CommConfig::chunk_bytes): k chunks
        // take G-1 + k-1 hops of a chunk each. One chunk is G-1 hops of
        // the whole buffer.
        const double k = std::max(1.0, std::ceil(bytes / kModelChunkBytes));
        return (shape.world - 1 + k - 1) *
               flat->Message(bytes / k);
      }
      // broadcast.cc's tree: a binomial tree of ceil(log2 H) steps across
      // hosts, then ceil(log2 g) inside the widest host. A node sends the
      // whole buffer to each child in turn, so the root's link carries it
      // once per step: each step costs alpha and the buffer at its
      // level's rate (the chunks' pipelining not counted).
      const bool on_hosts = shape.hosts() >= 2;
      const int across = on_hosts ? CeilLog2(shape.hosts()) : 0;
      const int inside = CeilLog2(on_hosts ? Widest(shape) : shape.world);
      // Inside a host at the local level (the flat one where that is not
      // known); without hosts (a group's ring) every step at the flat
      // level, as the chain's.
      const LevelCost* net = on_hosts ? flat : nullptr;
      const LevelCost* local =
          on_hosts && model.local.known() ? &model.local : flat;
      double t = inside * (local->alpha_s + bytes / local->bytes_per_s);
      if (net != nullptr) {
        t += across * (net->alpha_s + bytes / net->bytes_per_s);
      }
      return t;
    }
    default:
      return std::nullopt;
  }
}

}  // namespace

std::optional<double> FingerprintPassSeconds(const RingShape& shape,
                                             OpKind kind, Algorithm algorithm,
                                             const LinkModel& model) {
  if (shape.world <= 1) return 0.0;
  if (kind == OpKind::kAllReduce &&
      algorithm == Algorithm::kRecursiveDoubling) {
    return 0.0;
  }
  const LevelCost* flat = FlatLevel(shape, model);
  if (flat == nullptr) return std::nullopt;
  return flat->alpha_s;
}

std::optional<double> PredictSeconds(const RingShape& shape, OpKind kind,
                                     Algorithm algorithm, double bytes,
                                     const LinkModel& model) {
  const std::optional<double> data =
      DataPhaseSeconds(shape, kind, algorithm, bytes, model);
  const std::optional<double> pass =
      FingerprintPassSeconds(shape, kind, algorithm, model);
  if (!data.has_value() || !pass.has_value()) return std::nullopt;
  return *data + *pass;
}

std::optional<ModelChoice> BestByModel(const RingShape& shape, OpKind kind,
                                       double bytes, const LinkModel& model,
                                       const std::vector<Algorithm>& candidates) {
  std::optional<ModelChoice> best;
  for (Algorithm a : candidates) {
    const std::optional<double> t = PredictSeconds(shape, kind, a, bytes, model);
    if (t.has_value() && (!best.has_value() || *t < best->seconds)) {
      best = ModelChoice{a, *t};
    }
  }
  return best;
}

std::vector<Algorithm> AutoCandidates(const RingShape& shape, OpKind kind,
                                      double bytes, int all_to_all_max_world,
                                      double doubling_max_bytes,
                                      double naive_max_bytes,
                                      double halving_max_bytes) {
  std::vector<Algorithm> candidates = {Algorithm::kRing};
  if (kind == OpKind::kBroadcast && shape.world >= 3) {
    candidates.push_back(Algorithm::kTree);
  }
  if (kind != OpKind::kAllReduce && kind != OpKind::kReduceScatter &&
      kind != OpKind::kAllGather) {
    return candidates;
  }
  if (shape.two_level_usable()) candidates.push_back(Algorithm::kTwoLevel);
  if (kind == OpKind::kAllReduce) {
    candidates.push_back(Algorithm::kTree);
    if (shape.world <= all_to_all_max_world) {
      // Recursive doubling before naive: at G = 2 the two cost the same
      // and ties go to the earlier.
      if (bytes <= doubling_max_bytes) {
        candidates.push_back(Algorithm::kRecursiveDoubling);
      }
      if (bytes <= naive_max_bytes) candidates.push_back(Algorithm::kNaive);
      const int g = shape.world;
      if (!shape.two_level_usable() && g >= 4 && (g & (g - 1)) == 0 &&
          bytes <= halving_max_bytes) {
        candidates.push_back(Algorithm::kHalvingDoubling);
      }
    }
  }
  return candidates;
}

std::optional<ModelChoice> BestByModel(const RingShape& shape, OpKind kind,
                                       double bytes, const LinkModel& model) {
  return BestByModel(shape, kind, bytes, model,
                     AutoCandidates(shape, kind, bytes));
}

std::string DescribeLevel(const LevelCost& level) {
  if (!level.known()) return "not known";
  return absl::StrFormat("alpha %.1f us, B %.3f GB/s", level.alpha_s * 1e6,
                         level.bytes_per_s / 1e9);
}

bool SameLinkModel(const std::optional<LinkModel>& a,
                   const std::optional<LinkModel>& b) {
  if (!a.has_value() || !b.has_value()) return a.has_value() == b.has_value();
  // Within a part in 10^9: the wire carries alpha in microseconds, so a
  // model read back from a membership may differ in its last bits.
  auto close = [](double x, double y) {
    return std::fabs(x - y) <= 1e-9 * std::max(std::fabs(x), std::fabs(y));
  };
  auto same = [&](const LevelCost& x, const LevelCost& y) {
    return close(x.alpha_s, y.alpha_s) && close(x.bytes_per_s, y.bytes_per_s);
  };
  return same(a->local, b->local) && same(a->net, b->net);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string DescribeLinkModel(const LinkModel& model) {
  std::string text = absl::StrCat("local: ", DescribeLevel(model.local),
                                  "; net: ", DescribeLevel(model.net));
  if (model.measured_generation != 0) {
    absl::StrAppend(&text, ", measured at generation ",
                    model.measured_generation);
  }
  return text;
}

absl::StatusOr<LinkModel> ParseLinkModel(const std::string& text) {
  LinkModel m;
  bool any = false;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(part, absl::MaxSplits('=', 1));
    LevelCost* level = kv.first == "local" ? &m.local
                       : kv.first == "net" ? &m.net
                                           : nullptr;
    std::pair<absl::string_view, absl::string_view> ab =
        absl::StrSplit(kv.second, absl::MaxSplits(':', 1));
    double alpha_us = -1, gbps = 0;
    if (level == nullptr || !absl::SimpleAtod(ab.first, &alpha_us) ||
        !absl::SimpleAtod(ab.second, &gbps) || !(alpha_us >= 0) ||
        !(gbps > 0) || std::isinf(alpha_us) || std::isinf(gbps)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "link model: '", part,
          "' is not local=ALPHA_US:GBPS or net=ALPHA_US:GBPS (alpha in "
          "microseconds, at least 0; the rate in GB/s, above 0)"));
    }
    level->alpha_s = alpha_us * 1e-6;
    level->bytes_per_s = gbps * 1e9;
    if (!std::isfinite(level->bytes_per_s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("link model: '", part, "': the rate is too large"));
    }
    any = true;
  }
  if (!any) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link model: '", text,
        "' names no level (local=ALPHA_US:GBPS,net=ALPHA_US:GBPS)"));
  }
  return m;
}

}  // namespace halka
