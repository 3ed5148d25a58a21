#include "worker/link_probe.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "core/cost_model.h"

namespace halka {
namespace {

// The median seconds of `reps` all-reduces of `bytes` on `comm`.
absl::StatusOr<double> TimeAllReduces(Communicator& comm, size_t bytes,
                                      int reps, absl::Duration timeout) {
  std::vector<float> buf(std::max<size_t>(bytes / sizeof(float), 1), 1.0f);
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    const absl::Time t0 = halka::Now();
    absl::StatusOr<OpResult> r =
        comm.AllReduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum,
                       timeout, Algorithm::kRecursiveDoubling);
    if (!r.ok()) return r.status();
    seconds.push_back(absl::ToDoubleSeconds(halka::Now() - t0));
  }
  return Median(std::move(seconds));
}

absl::StatusOr<LevelCost> MeasureEdge(Ring& ring, int peer,
                                   const LinkProbeOptions& o) {
  std::vector<int> pair = {std::min(ring.rank, peer), std::max(ring.rank, peer)};
  absl::StatusOr<std::shared_ptr<SubRing>> group =
      ring.Group(std::move(pair), kLinkProbeTag);
  if (!group.ok()) return group.status();
  Communicator& comm = (*group)->comm();
  absl::StatusOr<double> warm = TimeAllReduces(comm, 8, 2, o.timeout);
  if (!warm.ok()) return warm.status();
  absl::StatusOr<double> small = TimeAllReduces(comm, 8, o.small_reps, o.timeout);
  if (!small.ok()) return small.status();
  absl::StatusOr<double> big =
      TimeAllReduces(comm, o.big_bytes, o.big_reps, o.timeout);
  if (!big.ok()) return big.status();
  if (*big <= *small) {
    return absl::InternalError(absl::StrCat(
        "a message of ", o.big_bytes, " bytes took ", *big * 1e6,
        " us, no longer than one of 8 bytes (", *small * 1e6, " us)"));
  }
  return LevelCost{*small, static_cast<double>(o.big_bytes) / (*big - *small)};
}

}  // namespace

bool SameHost(const std::vector<std::vector<int>>& hosts, int a, int b) {
  for (const std::vector<int>& h : hosts) {
    const bool has_a = std::find(h.begin(), h.end(), a) != h.end();
    const bool has_b = std::find(h.begin(), h.end(), b) != h.end();
    if (has_a || has_b) return has_a && has_b;
  }
  return false;  // hosts not known: taken as between hosts
}

std::vector<ProbeEdge> PlanProbeRounds(
    const std::vector<int>& order,
    const std::vector<std::vector<int>>& hosts) {
  const int g = static_cast<int>(order.size());
  std::vector<ProbeEdge> edges;
  if (g < 2) return edges;
  const int count = g == 2 ? 1 : g;  // two ranks: one edge, not two
  int nets = 0;
  for (int i = 0; i < count; ++i) {
    nets += !SameHost(hosts, order[static_cast<size_t>(i)],
                      order[static_cast<size_t>((i + 1) % g)]);
  }
  int k = 0;  // the net edge's index among the net edges, in ring order
  for (int i = 0; i < count; ++i) {
    ProbeEdge e;
    e.a = order[static_cast<size_t>(i)];
    e.b = order[static_cast<size_t>((i + 1) % g)];
    e.local = SameHost(hosts, e.a, e.b);
    // Edges i and i+1 share a rank (local) or a host's NIC (net, the k-th
    // and the next net edge): alternate them, and give the last one of an
    // odd cycle, which meets the first, a round of its own.
    if (e.local) {
      e.round = (count % 2 == 1 && i == count - 1) ? 4 : i % 2;
    } else {
      e.round = (nets % 2 == 1 && nets > 1 && k == nets - 1) ? 5 : 2 + k % 2;
      ++k;
    }
    edges.push_back(e);
  }
  return edges;
}

v1::LinkProbe ProbeRingLinks(Ring& ring, const LinkProbeOptions& options,
                             const std::function<bool()>& cancelled) {
  v1::LinkProbe probe;
  probe.set_generation(ring.generation);
  const int g = ring.world;
  if (g < 2) {
    probe.set_error("a ring of one member has no link to probe");
    return probe;
  }
  std::vector<int> order = ring.ring_order;
  if (static_cast<int>(order.size()) != g) {
    order.resize(static_cast<size_t>(g));
    std::iota(order.begin(), order.end(), 0);
  }
  const std::vector<ProbeEdge> edges = PlanProbeRounds(order, ring.hosts);
  // Every rank passes every round that has an edge anywhere, in step (a
  // barrier of all ranks after each), so that edges that share a rank or
  // a host's NIC are never probed at once.
  std::vector<int> everyone(static_cast<size_t>(g));
  std::iota(everyone.begin(), everyone.end(), 0);
  absl::StatusOr<std::shared_ptr<SubRing>> all =
      ring.Group(std::move(everyone), kLinkProbeTag);
  std::vector<double> alpha[2], rate[2];  // [0] local, [1] net
  std::string failed;
  auto fail = [&](const std::string& what, const absl::Status& s) {
    if (failed.empty()) failed = absl::StrCat(what, ": ", s.ToString());
  };
  if (!all.ok()) fail("the probe's group of every rank", all.status());
  auto stop = [&] {
    if (!cancelled || !cancelled()) return false;
    fail("the probe", absl::CancelledError(
                          "stopped: the generation moved on, or the worker "
                          "stops"));
    return true;
  };
  bool stopped = false;
  for (int round = 0; round < kProbeRounds && all.ok() && !stopped; ++round) {
    if ((stopped = stop())) break;
    bool any = false;
    for (const ProbeEdge& e : edges) {
      if (e.round != round) continue;
      any = true;
      if (e.a != ring.rank && e.b != ring.rank) continue;
      if ((stopped = stop())) break;
      const int peer = e.a == ring.rank ? e.b : e.a;
      absl::StatusOr<LevelCost> c = MeasureEdge(ring, peer, options);
      if (!c.ok()) {
        fail(absl::StrCat("the link to rank ", peer), c.status());
        continue;
      }
      alpha[e.local ? 0 : 1].push_back(c->alpha_s);
      rate[e.local ? 0 : 1].push_back(c->bytes_per_s);
    }
    if (!any || stopped) continue;
    absl::StatusOr<OpResult> b = (*all)->comm().Barrier(options.barrier_timeout);
    if (!b.ok()) {
      fail(absl::StrCat("the barrier after round ", round), b.status());
      break;  // the others stop there too, or time out alike
    }
  }
  probe.set_local_edges(static_cast<int>(alpha[0].size()));
  probe.set_local_alpha_us(Median(alpha[0]) * 1e6);
  probe.set_local_bytes_per_s(Median(rate[0]));
  probe.set_net_edges(static_cast<int>(alpha[1].size()));
  probe.set_net_alpha_us(Median(alpha[1]) * 1e6);
  probe.set_net_bytes_per_s(Median(rate[1]));
  if (alpha[0].empty() && alpha[1].empty()) probe.set_error(failed);
  return probe;
}

}  // namespace halka
