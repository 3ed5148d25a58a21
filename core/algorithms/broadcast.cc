// Chain and tree broadcasts. (The barrier has no file: its fingerprint pass
// is the whole operation.)
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/algorithms/algorithms.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"

namespace halka {

absl::Status ChainBroadcast(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  const Fingerprint& fp = op.fp();
  const int root = fp.root;
  if (g == 1 || fp.count == 0) return absl::OkStatus();
  const size_t es = DTypeSize(fp.dtype);
  const int succ = op.succ();
  const int pred = op.pred();
  OpBuffer& buf = op.buffer();
  const size_t chunk_elems =
      std::max<size_t>(1, op.config().chunk_bytes / es);
  const std::vector<Range> cs =
      PlanChunks(Range{0, static_cast<size_t>(fp.count)}, chunk_elems);
  // Data flows from the root around the ring (its successor, theirs, ...,
  // its predecessor); step = distance from the root in ring positions.
  const int distance = Mod(op.position() - op.path().position(root), g);
  const bool forward = succ != root;
  if (r != root) {
    // A chunk only moves into place, and nothing touches its range before
    // it arrives: its receive is posted (where the link can, its reader
    // puts it there itself).
    for (const Range& c : cs) {
      op.PostRecv(pred, op.ChunkMeta(Phase::kBroadcast, distance - 1, 0, c));
    }
  }
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    const Range& c = cs[ci];
    op.SetLedger(Phase::kBroadcast, distance, static_cast<int>(ci),
                 static_cast<int>(cs.size()), r == root ? -1 : pred);
    if (r != root) {
      HALKA_ASSIGN_OR_RETURN(
          InFrame in,
          op.AwaitData(pred,
                       op.ChunkMeta(Phase::kBroadcast, distance - 1, 0, c)));
      HALKA_RETURN_IF_ERROR(
          buf.Apply(/*reduce=*/false, c.offset, c.count, in));
    }
    if (forward) {
      HALKA_ASSIGN_OR_RETURN(const uint8_t* p,
                             buf.HostView(c.offset, c.count));
      HALKA_RETURN_IF_ERROR(
          op.Send(succ, op.ChunkMeta(Phase::kBroadcast, distance, 0, c), p,
                  c.count * es, 0));
    }
  }
  return absl::OkStatus();
}

namespace {

// A binomial tree over n nodes from node `source`, each node named by its
// distance i = (index - source) mod n: i's parent is i less its lowest set
// bit, its children i + 2^k for every 2^k below that bit (below n for the
// source), farthest first; i's subtree is [i, i + lowbit(i)), contiguous in
// the list's order, and its depth the number of set bits of i.
struct Binomial {
  int parent = -1;            // an index into the list; -1: the source
  std::vector<int> children;  // indices, farthest (largest subtree) first
  int depth = 0;
};
Binomial BinomialAt(int n, int source, int index) {
  Binomial b;
  const int i = Mod(index - source, n);
  const int low = i == 0 ? n : (i & -i);  // the subtree's span
  if (i != 0) b.parent = (source + i - (i & -i)) % n;
  int k = 1;
  while (k * 2 < low) k *= 2;
  for (; k >= 1; k /= 2) {
    if (k < low && i + k < n) b.children.push_back((source + i + k) % n);
  }
  for (int v = i; v != 0; v &= v - 1) ++b.depth;
  return b;
}

}  // namespace

BroadcastTree BroadcastTreeOf(const CommConfig& config, const RingPath& path,
                              int root) {
  // The hosts in ring order, each its ranks in ring order: config.hosts
  // where they partition the ranks, else one host of the whole ring.
  std::vector<std::vector<int>> hosts;
  if (TreeHostsUsable(config)) {
    hosts = config.hosts;
  } else {
    hosts.emplace_back();
    for (int p = 0; p < path.world(); ++p) hosts[0].push_back(path.rank_at(p));
  }
  auto where = [&](int rank) {
    for (size_t h = 0; h < hosts.size(); ++h) {
      const auto at = std::find(hosts[h].begin(), hosts[h].end(), rank);
      if (at != hosts[h].end()) {
        return std::make_pair(static_cast<int>(h),
                              static_cast<int>(at - hosts[h].begin()));
      }
    }
    return std::make_pair(-1, -1);
  };
  const auto [root_host, root_local] = where(root);
  const auto [host, local] = where(config.rank);
  BroadcastTree t;
  if (root_host < 0 || host < 0) return t;
  const int n_hosts = static_cast<int>(hosts.size());
  const std::vector<int>& mine = hosts[static_cast<size_t>(host)];
  // A host's leader: the root on the root's host, its first rank elsewhere.
  auto leader_local = [&](int h) { return h == root_host ? root_local : 0; };
  const int lead = leader_local(host);
  const Binomial in_host =
      BinomialAt(static_cast<int>(mine.size()), lead, local);
  const Binomial across = BinomialAt(n_hosts, root_host, host);
  t.depth = across.depth + in_host.depth;  // in_host.depth is 0 at the leader
  if (local == lead) {
    // The leader takes part in the hosts' tree first, then its own host's.
    auto leader_of = [&](int h) {
      return hosts[static_cast<size_t>(h)][static_cast<size_t>(leader_local(h))];
    };
    if (across.parent >= 0) t.parent = leader_of(across.parent);
    for (int h : across.children) t.children.push_back(leader_of(h));
  } else {
    t.parent = mine[static_cast<size_t>(in_host.parent)];
  }
  for (int i : in_host.children) t.children.push_back(mine[static_cast<size_t>(i)]);
  return t;
}

absl::Status TreeBroadcast(OpContext& op) {
  const int g = op.world();
  const Fingerprint& fp = op.fp();
  if (g == 1 || fp.count == 0) return absl::OkStatus();
  const size_t es = DTypeSize(fp.dtype);
  const BroadcastTree t = BroadcastTreeOf(op.config(), op.path(), fp.root);
  if (t.parent < 0 && op.rank() != fp.root) {
    return absl::InternalError(absl::StrCat(
        op.Where(), ": rank ", op.rank(),
        " has no place in the broadcast tree (the hosts name it nowhere)"));
  }
  OpBuffer& buf = op.buffer();
  const size_t chunk_elems =
      std::max<size_t>(1, op.config().chunk_bytes / es);
  const std::vector<Range> cs =
      PlanChunks(Range{0, static_cast<size_t>(fp.count)}, chunk_elems);
  // Its peers' link failures and aborts wake this rank's waits (beyond 16
  // ranks only the ring neighbours are watched by default).
  if (t.parent >= 0) op.Watch(t.parent);
  for (int child : t.children) op.Watch(child);
  // As in the chain: every chunk's receive is posted before any arrives,
  // and a chunk goes on to the children as soon as it is in place. A
  // frame's step is its sender's depth in the tree.
  if (t.parent >= 0) {
    for (const Range& c : cs) {
      op.PostRecv(t.parent,
                  op.ChunkMeta(Phase::kBroadcast, t.depth - 1, 0, c));
    }
  }
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    const Range& c = cs[ci];
    op.SetLedger(Phase::kBroadcast, t.depth, static_cast<int>(ci),
                 static_cast<int>(cs.size()), t.parent);
    if (t.parent >= 0) {
      HALKA_ASSIGN_OR_RETURN(
          InFrame in,
          op.AwaitData(t.parent,
                       op.ChunkMeta(Phase::kBroadcast, t.depth - 1, 0, c)));
      HALKA_RETURN_IF_ERROR(
          buf.Apply(/*reduce=*/false, c.offset, c.count, in));
    }
    if (t.children.empty()) continue;
    HALKA_ASSIGN_OR_RETURN(const uint8_t* p, buf.HostView(c.offset, c.count));
    for (int child : t.children) {
      HALKA_RETURN_IF_ERROR(
          op.Send(child, op.ChunkMeta(Phase::kBroadcast, t.depth, 0, c), p,
                  c.count * es, 0));
    }
  }
  return absl::OkStatus();
}

}  // namespace halka
