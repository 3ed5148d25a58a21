#include "core/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

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

// The level a flat algorithm moves at: between hosts where there are two
// or more, else inside the one host; the other level where that one is
// not known (a model of one level).
const LevelCost* FlatLevel(const RingShape& shape, const LinkModel& m) {
  const LevelCost& first = shape.hosts() >= 2 ? m.net : m.local;
  const LevelCost& second = shape.hosts() >= 2 ? m.local : m.net;
  if (first.known()) return &first;
  if (second.known()) return &second;
  return nullptr;
}

// What the busiest link of a binary tree of n nodes carries, in buffers
// each way: the root of 2 nodes has one child (1), of 3 two (2); from 4
// on an inner node has a parent and two children (3).
double TreeLoad(int n) { return n <= 2 ? 1.0 : (n == 3 ? 2.0 : 3.0); }

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
      return 2.0 * (g_world - 1) * flat->Message(s / g_world);
    case Algorithm::kRecursiveDoubling: {
      if (flat == nullptr) return std::nullopt;
      const int p = 1 << FloorLog2(g_world);
      const int steps = FloorLog2(g_world) + (p == g_world ? 0 : 2);
      return steps * flat->Message(s);
    }
    case Algorithm::kNaive:
      if (flat == nullptr) return std::nullopt;
      return flat->alpha_s + (g_world - 1) * s / flat->bytes_per_s;
    case Algorithm::kTree: {
      if (shape.hosts() < 2) {
        if (flat == nullptr) return std::nullopt;
        return 2.0 * CeilLog2(g_world) * flat->alpha_s +
               TreeLoad(g_world) * s / flat->bytes_per_s;
      }
      if (!m.net.known()) return std::nullopt;
      double t = 2.0 * CeilLog2(shape.hosts()) * m.net.alpha_s +
                 TreeLoad(shape.hosts()) * s / m.net.bytes_per_s;
      const int widest =
          *std::max_element(shape.host_sizes.begin(), shape.host_sizes.end());
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

std::optional<double> PredictSeconds(const RingShape& shape, OpKind kind,
                                     Algorithm algorithm, double bytes,
                                     const LinkModel& model) {
  switch (kind) {
    case OpKind::kAllReduce:
      return AllReduce(shape, algorithm, bytes, model);
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
      return Sliced(shape, algorithm, bytes, model);
    case OpKind::kBroadcast: {
      // The chain from the root, pipelined: G-1 hops' latency and the
      // buffer once through each link (the pipeline's fill not counted).
      if (shape.world <= 1) return 0.0;
      const LevelCost* flat = FlatLevel(shape, model);
      if (flat == nullptr) return std::nullopt;
      return (shape.world - 1) * flat->alpha_s + bytes / flat->bytes_per_s;
    }
    default:
      return std::nullopt;
  }
}

std::optional<ModelChoice> BestByModel(const RingShape& shape, OpKind kind,
                                       double bytes, const LinkModel& model) {
  std::vector<Algorithm> candidates = {Algorithm::kRing};
  if (kind == OpKind::kAllReduce) {
    candidates.insert(candidates.end(),
                      {Algorithm::kRecursiveDoubling, Algorithm::kTree,
                       Algorithm::kNaive});
  }
  if ((kind == OpKind::kAllReduce || kind == OpKind::kReduceScatter ||
       kind == OpKind::kAllGather) &&
      shape.two_level_usable()) {
    candidates.push_back(Algorithm::kTwoLevel);
  }
  std::optional<ModelChoice> best;
  for (Algorithm a : candidates) {
    const std::optional<double> t = PredictSeconds(shape, kind, a, bytes, model);
    if (t.has_value() && (!best.has_value() || *t < best->seconds)) {
      best = ModelChoice{a, *t};
    }
  }
  return best;
}

std::string DescribeLevel(const LevelCost& level) {
  if (!level.known()) return "not known";
  return absl::StrFormat("alpha %.1f us, B %.3f GB/s", level.alpha_s * 1e6,
                         level.bytes_per_s / 1e9);
}

}  // namespace halka
