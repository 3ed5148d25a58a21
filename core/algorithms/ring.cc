// Ring all-reduce, and its two halves as reduce-scatter and all-gather,
// pipelined by chunk.
#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "core/algorithms/algorithms.h"
#include "core/cost_model.h"
#include "core/op_buffer.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"

namespace halka {

namespace {

// A ring over some of the ranks, on part of the buffer: the flat ring is
// every rank in ring order over the whole buffer; a two-level all-reduce
// runs rings over a host's ranks and over one rank of each host.
struct RingGroup {
  std::vector<int> ranks;  // ring order: ranks[p] is at position p
  int position = 0;        // this rank's
  // The position whose segments this rank follows (see RingPlan); the
  // flat ring's reduce-scatter and all-gather follow the one before.
  int plan_position = 0;
  Range range;             // the elements it works on
  // Segment i is tracked and named in frames as seg_base + i (a ring's
  // segments must not collide with another ring's of the same operation).
  // seg_base < 0: the flat ring's own rule, segment = the rank at the
  // position (so that segment r is rank r's slice).
  int seg_base = -1;
  int avg_divisor = 0;  // AVG: the last reduce-scatter step divides by it
  // Where non-empty (one entry per position), segment i is these element
  // ranges, not the i-th of `range` split evenly: a two-level
  // reduce-scatter's or all-gather's segment inside a host is a column of
  // rank slices, one per host, that need not be adjacent in the buffer.
  // Only with seg_base >= 0 (segment i is position i's), as InHost and
  // AcrossHosts make them.
  std::vector<std::vector<Range>> segments;
};

// The segments and chunks of one ring operation, planned as for ring
// position `plan_position`: this rank finishes reducing the segment of
// position plan_position+1 and starts the all-gather with it. Steps count
// in positions; a step's segment is the rank at that position
// (RingPath::rank_at), so that segment r is rank r's slice in any order.
struct RingPlan {
  RingPlan(OpContext& op, int plan_position)
      : RingPlan(op, FlatGroup(op, plan_position)) {}
  RingPlan(OpContext& op, RingGroup group)
      : g(static_cast<int>(group.ranks.size())),
        r(group.plan_position),
        es(DTypeSize(op.fp().dtype)),
        succ(group.ranks[static_cast<size_t>(Mod(group.position + 1, g))]),
        pred(group.ranks[static_cast<size_t>(Mod(group.position - 1, g))]),
        seg_base(group.seg_base),
        avg_divisor(group.avg_divisor),
        ranks(std::move(group.ranks)) {
    const size_t chunk_elems =
        std::max<size_t>(1, op.config().chunk_bytes / es);
    chunks.resize(static_cast<size_t>(g));
    if (!group.segments.empty()) {
      for (int i = 0; i < g; ++i) {
        for (const Range& part : group.segments[static_cast<size_t>(i)]) {
          for (const Range& c : PlanChunks(part, chunk_elems)) {
            chunks[static_cast<size_t>(i)].push_back(c);
          }
        }
      }
      return;
    }
    std::vector<Range> segments = PlanSegments(group.range.count, g);
    for (Range& seg : segments) seg.offset += group.range.offset;
    for (int i = 0; i < g; ++i) {
      chunks[static_cast<size_t>(SegAt(i))] =
          PlanChunks(segments[static_cast<size_t>(SegAt(i))], chunk_elems);
    }
  }
  static RingGroup FlatGroup(const OpContext& op, int plan_position) {
    RingGroup group;
    for (int p = 0; p < op.world(); ++p) group.ranks.push_back(op.path().rank_at(p));
    group.position = op.position();
    group.plan_position = plan_position;
    group.range = Range{0, static_cast<size_t>(op.fp().count)};
    group.avg_divisor = op.world();
    return group;
  }
  // The segment of position p: in the flat ring the rank there, else p.
  int SegAt(int p) const {
    return seg_base < 0 ? ranks[static_cast<size_t>(Mod(p, g))] : Mod(p, g);
  }
  // Step t of the 2(G-1): its phase, its number within the phase, the
  // segment it sends and the one it receives.
  Phase phase_of(int t) const {
    return t < g - 1 ? Phase::kReduceScatter : Phase::kAllGather;
  }
  int step_in_phase(int t) const { return t < g - 1 ? t : t - (g - 1); }
  int send_seg(int t) const {
    return SegAt(t < g - 1 ? RsSendSegment(r, g, t)
                           : AgSendSegment(r, g, t - (g - 1)));
  }
  int recv_seg(int t) const {
    return SegAt(t < g - 1 ? RsRecvSegment(r, g, t)
                           : AgRecvSegment(r, g, t - (g - 1)));
  }
  const std::vector<Range>& chunks_of(int seg) const {
    return chunks[static_cast<size_t>(seg)];
  }
  // The segment's number in frames and in the send tracker.
  int tracked(int seg) const { return seg_base < 0 ? seg : seg_base + seg; }

  const int g;
  const int r;
  const size_t es;
  const int succ;
  const int pred;
  const int seg_base;
  const int avg_divisor;
  const std::vector<int> ranks;
  std::vector<std::vector<Range>> chunks;
};

absl::Status SendChunk(OpContext& op, const RingPlan& plan, int t, int seg,
                       const Range& c) {
  absl::StatusOr<const uint8_t*> p = op.buffer().HostView(c.offset, c.count);
  if (!p.ok()) return p.status();
  const int tracked = plan.tracked(seg);
  return op.Send(plan.succ,
                 op.ChunkMeta(plan.phase_of(t), plan.step_in_phase(t), tracked,
                              c),
                 *p, c.count * plan.es, tracked);
}

// Step `first` sends this rank's own data, segment by chunk.
absl::Status SendFirst(OpContext& op, const RingPlan& plan, int first,
                       bool ledger) {
  const int seg = plan.send_seg(first);
  const auto& cs = plan.chunks_of(seg);
  if (ledger) {
    op.SetLedger(plan.phase_of(first), plan.step_in_phase(first), 0,
                 static_cast<int>(cs.size()), -1);
  }
  for (const Range& c : cs) {
    HALKA_RETURN_IF_ERROR(SendChunk(op, plan, first, seg, c));
  }
  return absl::OkStatus();
}

// Posts the receives of all-gather steps [t, end) in order while the wire
// holds nothing of a step's segment: every send of it left in the
// reduce-scatter, and this rank does not touch it again until its chunks
// arrive. Returns the first step not posted.
int PostRecvs(OpContext& op, const RingPlan& plan, int t, int end) {
  for (; t < end; ++t) {
    const int seg = plan.recv_seg(t);
    if (!op.SegmentReleased(plan.tracked(seg))) break;
    for (const Range& c : plan.chunks_of(seg)) {
      op.PostRecv(plan.pred, op.ChunkMeta(Phase::kAllGather,
                                          plan.step_in_phase(t),
                                          plan.tracked(seg), c));
    }
  }
  return t;
}

// Called with each chunk a ring step t took (reduced, AVG divided where
// the step divides, or put in place), once it is in the buffer and has
// moved on to the next step: another ring may send it on from there.
using ChunkTaken =
    std::function<absl::Status(int t, int seg, const Range& chunk)>;

// Ring steps [first, end) of the 2(G-1) steps of an all-reduce (0..G-2
// reduce-scatter, G-1..2G-3 all-gather), pipelined by chunk: step t sends
// the segment received (and reduced) at step t-1, so a chunk moves on as
// soon as it is ready; step `first` sends this rank's own data (unless it
// already left while the fingerprints were in flight, or another ring's
// `taken` sent it).
absl::Status RingSteps(OpContext& op, int first, int end,
                       const RingPlan& plan, bool first_sent,
                       const ChunkTaken& taken = nullptr) {
  const Fingerprint& fp = op.fp();
  const int g = plan.g;
  if (g == 1 || fp.count == 0 || first >= end) return absl::OkStatus();
  OpBuffer& buf = op.buffer();
  if (!first_sent) {
    HALKA_RETURN_IF_ERROR(SendFirst(op, plan, first, /*ledger=*/true));
  }
  absl::Duration reduce_time;
  int offered = g - 1;  // the first all-gather step not offered yet
  for (int t = first; t < end; ++t) {
    const Phase phase = plan.phase_of(t);
    const int step = plan.step_in_phase(t);
    const int seg = plan.recv_seg(t);
    const bool reduce = phase == Phase::kReduceScatter;
    const bool last_rs = t == g - 2;
    const auto& cs = plan.chunks_of(seg);
    if (!reduce && !op.WaitForReleases(plan.tracked(seg), op.deadline())) {
      // Never overwrite memory the wire may still be reading.
      return absl::DeadlineExceededError(absl::StrCat(
          op.Where(), ": deadline exceeded waiting for ", op.Who(plan.succ),
          " to take segment ", seg, " before all-gather step ", step));
    }
    if (!reduce) {
      // The all-gather's chunks only move into place: where the link can,
      // its reader puts them there itself.
      offered = PostRecvs(op, plan, std::max(offered, t), end);
    }
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      const Range& c = cs[ci];
      op.SetLedger(phase, step, static_cast<int>(ci),
                   static_cast<int>(cs.size()), plan.pred);
      HALKA_ASSIGN_OR_RETURN(
          InFrame in,
          op.AwaitData(plan.pred,
                       op.ChunkMeta(phase, step, plan.tracked(seg), c)));
      const absl::Time t0 = halka::Now();
      HALKA_RETURN_IF_ERROR(buf.Apply(reduce, c.offset, c.count, in));
      if (last_rs && fp.op == ReduceOp::kAvg && plan.avg_divisor > 0) {
        // The owner divides once, before the all-gather, so every rank
        // receives the same bits.
        HALKA_RETURN_IF_ERROR(
            buf.FinalizeAvg(c.offset, c.count, plan.avg_divisor));
      }
      reduce_time += op.RecordReduce(plan.pred, halka::Now() - t0);
      if (t + 1 < end) {
        HALKA_RETURN_IF_ERROR(SendChunk(op, plan, t + 1, seg, c));
      }
      if (taken) HALKA_RETURN_IF_ERROR(taken(t, seg, c));
    }
  }
  op.RecordReduceTotal(reduce_time);
  return absl::OkStatus();
}

// The flat ring's steps [first, end), planned as for `plan_position`.
absl::Status FlatSteps(OpContext& op, int first, int end, int plan_position) {
  if (op.world() == 1 || op.fp().count == 0 || first >= end) {
    return absl::OkStatus();
  }
  return RingSteps(op, first, end, RingPlan(op, plan_position),
                   op.first_step_sent());
}

// The ring position whose all-reduce plan an operation follows (see below).
int PlanPosition(const OpContext& op) {
  return op.fp().kind == OpKind::kAllReduce
             ? op.position()
             : Mod(op.position() - 1, op.world());
}

}  // namespace

absl::Status RingAllReduce(OpContext& op) {
  return FlatSteps(op, 0, 2 * (op.world() - 1), op.position());
}

// The two halves plan segments as the rank before this one in the ring
// (position p-1) would in an all-reduce, so that rank r owns segment r:
// the all-reduce's position p-1 finishes the segment of position p, r's.
absl::Status RingReduceScatter(OpContext& op) {
  return FlatSteps(op, 0, op.world() - 1, PlanPosition(op));
}

bool RingCanSendEarly(const OpContext& op) {
  const OpKind kind = op.fp().kind;
  const bool ring_kind =
      (kind == OpKind::kAllReduce || kind == OpKind::kReduce ||
       kind == OpKind::kReduceScatter) &&
      op.algorithm() == Algorithm::kRing;
  return ring_kind && op.all_to_all() && op.world() > 1 && op.fp().count > 0;
}

absl::Status RingSendFirstStep(OpContext& op) {
  const RingPlan plan(op, PlanPosition(op));
  // The ledger stays in the fingerprint phase: this send happens while the
  // fingerprints are compared, and the wait that follows is theirs.
  HALKA_RETURN_IF_ERROR(SendFirst(op, plan, 0, /*ledger=*/false));
  op.set_first_step_sent();
  return absl::OkStatus();
}

bool HostsPartitionRanks(const CommConfig& config) {
  std::vector<bool> seen(static_cast<size_t>(config.world_size), false);
  size_t ranks = 0;
  for (const std::vector<int>& h : config.hosts) {
    if (h.empty()) return false;
    for (int r : h) {
      if (r < 0 || r >= config.world_size || seen[static_cast<size_t>(r)]) {
        return false;
      }
      seen[static_cast<size_t>(r)] = true;
      ++ranks;
    }
  }
  return ranks == static_cast<size_t>(config.world_size);
}

bool TwoLevelUsable(const CommConfig& config) {
  const auto& hosts = config.hosts;
  if (hosts.size() < 2 || hosts[0].size() < 2) return false;
  for (const std::vector<int>& h : hosts) {
    if (h.size() != hosts[0].size()) return false;
  }
  return HostsPartitionRanks(config);
}

namespace {

// Where this rank sits in config().hosts, and the rings a two-level
// collective runs: its host's ranks, and the ranks at its local position
// on every host (its cross-host ring).
struct HostPlace {
  int h = 0;       // hosts
  int g = 0;       // ranks per host
  int host = -1;   // this rank's host
  int local = -1;  // its position there
  std::vector<int> across;  // hosts[i][local], i = 0..h-1

  const std::vector<int>& mine(const OpContext& op) const {
    return op.config().hosts[static_cast<size_t>(host)];
  }
};

// Where this rank sits; unless `track` is false (an all-reduce that
// started early already did), it also sets up the operation's segment
// counters and the links its waits watch.
absl::StatusOr<HostPlace> PlaceOnHosts(OpContext& op, absl::string_view what,
                                       bool track = true) {
  const std::vector<std::vector<int>>& hosts = op.config().hosts;
  if (!TwoLevelUsable(op.config())) {
    return absl::InternalError(
        absl::StrCat(op.Where(), ": two-level ", what, " without usable hosts"));
  }
  HostPlace p;
  p.h = static_cast<int>(hosts.size());
  p.g = static_cast<int>(hosts[0].size());
  for (int i = 0; i < p.h && p.host < 0; ++i) {
    for (int j = 0; j < p.g; ++j) {
      if (hosts[static_cast<size_t>(i)][static_cast<size_t>(j)] == op.rank()) {
        p.host = i;
        p.local = j;
      }
    }
  }
  for (int i = 0; i < p.h; ++i) {
    p.across.push_back(
        hosts[static_cast<size_t>(i)][static_cast<size_t>(p.local)]);
  }
  if (!track) return p;
  // Segments 0..g-1: the host ring's; g..g+h-1: the cross-host ring's.
  op.TrackSegments(static_cast<size_t>(p.g + p.h));
  const std::vector<int>& mine = p.mine(op);
  for (int k : {Mod(p.local + 1, p.g), Mod(p.local - 1, p.g)}) {
    op.Watch(mine[static_cast<size_t>(k)]);
  }
  for (int k : {Mod(p.host + 1, p.h), Mod(p.host - 1, p.h)}) {
    op.Watch(p.across[static_cast<size_t>(k)]);
  }
  return p;
}

// The ring over this rank's host, planned as for local position
// `plan_position`, over `range` split evenly or over `segments`.
RingGroup InHost(const OpContext& op, const HostPlace& p, int plan_position) {
  RingGroup in_host;
  in_host.ranks = p.mine(op);
  in_host.position = p.local;
  in_host.plan_position = plan_position;
  in_host.range = Range{0, static_cast<size_t>(op.fp().count)};
  in_host.seg_base = 0;
  return in_host;
}

RingGroup AcrossHosts(const HostPlace& p, int plan_position, Range range,
                      int avg_divisor) {
  RingGroup cross;
  cross.ranks = p.across;
  cross.position = p.host;
  cross.plan_position = plan_position;
  cross.range = range;
  cross.seg_base = p.g;
  cross.avg_divisor = avg_divisor;
  return cross;
}

// A reduce-scatter's or all-gather's slices as two-level rings see them:
// the cross-host ring's segment i is the slice of hosts[i][local]; the
// host ring's segment k is column k, the slices of hosts[i][k] for every
// host i.
struct SliceColumns {
  std::vector<std::vector<Range>> across;   // [i] = {slice of hosts[i][local]}
  std::vector<std::vector<Range>> columns;  // [k] = slices of hosts[*][k]
};

SliceColumns ColumnsOf(const OpContext& op, const HostPlace& p) {
  const std::vector<Range> slices =
      PlanSegments(static_cast<size_t>(op.fp().count), op.world());
  const std::vector<std::vector<int>>& hosts = op.config().hosts;
  SliceColumns c;
  c.columns.resize(static_cast<size_t>(p.g));
  for (int i = 0; i < p.h; ++i) {
    const std::vector<int>& host = hosts[static_cast<size_t>(i)];
    c.across.push_back(
        {slices[static_cast<size_t>(host[static_cast<size_t>(p.local)])]});
    for (int k = 0; k < p.g; ++k) {
      c.columns[static_cast<size_t>(k)].push_back(
          slices[static_cast<size_t>(host[static_cast<size_t>(k)])]);
    }
  }
  return c;
}

// An all-gather's contribution moves from its input slice to this rank's.
absl::Status MoveInputSlice(OpContext& op) {
  const int g = op.world();
  const int r = op.rank();
  const size_t slice = static_cast<size_t>(op.fp().count) / static_cast<size_t>(g);
  const int from = op.input_slice();
  if (slice == 0 || from == r) return absl::OkStatus();
  // This rank's contribution waits in slice `from`: it goes to slice r
  // before the ring moves it (the slices are disjoint).
  HALKA_ASSIGN_OR_RETURN(
      const uint8_t* in,
      op.buffer().HostView(static_cast<size_t>(from) * slice, slice));
  return op.buffer().WriteBack(in, static_cast<size_t>(r) * slice, slice);
}

}  // namespace

namespace {

// A two-level all-reduce's three rings, pipelined by chunk across them:
// the host's reduce-scatter hands each chunk of this rank's part (the
// host's sum of part local+1) that the cross-host ring sends first to it
// as soon as it is reduced, and the cross-host ring hands each chunk it
// finishes (its own segment at its last reduce-scatter step, the others
// as its all-gather brings them) to the host's all-gather at once, instead
// of each ring waiting for the one before to end. So that the chunks match
// across the rings, the host rings cut part k as the cross-host rings cut
// it (their H segments of it, each by chunk) and list them in the order
// the hand-over goes: the reduce-scatter starts with the segment the
// cross-host ring sends first, the all-gather follows the order the
// cross-host ring finishes them in (every rank of a host has the same
// place in its cross-host ring, so its host peers' order is its own).
struct TwoLevelPlans {
  Range part;        // the part this rank's cross-host ring all-reduces
  int part_seg = 0;  // its segment in the host rings (local+1)
  RingPlan cross;
  RingPlan host_rs;  // the host's reduce-scatter (steps 0..g-2)
  RingPlan host_ag;  // the host's all-gather (steps g-1..2g-3)
  Range first_across;  // the cross-host segment this rank sends first
};

// Part k's cross-host segments (offsets in the buffer), in the order of
// the positions `order` lists.
std::vector<Range> CrossCut(const Range& part, int h,
                            const std::vector<int>& order) {
  std::vector<Range> segs = PlanSegments(part.count, h);
  std::vector<Range> out;
  for (int i : order) {
    Range seg = segs[static_cast<size_t>(Mod(i, h))];
    seg.offset += part.offset;
    out.push_back(seg);
  }
  return out;
}

TwoLevelPlans PlanTwoLevel(OpContext& op, const HostPlace& p) {
  const size_t count = static_cast<size_t>(op.fp().count);
  const std::vector<Range> parts = PlanSegments(count, p.g);
  const int k = Mod(p.local + 1, p.g);
  const Range part = parts[static_cast<size_t>(k)];
  // The cross-host ring (plan position p.host) sends segment p.host at
  // its first step, finishes segment p.host+1 at its last reduce-scatter
  // step, and its all-gather brings p.host, p.host-1, ... (ring_plan.h).
  std::vector<int> rs_order, ag_order;
  for (int i = 0; i < p.h; ++i) {
    rs_order.push_back(p.host + i);
    ag_order.push_back(p.host + 1 - i);
  }
  RingGroup rs = InHost(op, p, p.local);
  RingGroup ag = InHost(op, p, p.local);
  for (const Range& each : parts) {
    rs.segments.push_back(CrossCut(each, p.h, rs_order));
    ag.segments.push_back(CrossCut(each, p.h, ag_order));
  }
  const Range first_across = CrossCut(part, p.h, {p.host})[0];
  return TwoLevelPlans{part,
                       k,
                       RingPlan(op, AcrossHosts(p, p.host, part, op.world())),
                       RingPlan(op, std::move(rs)),
                       RingPlan(op, std::move(ag)),
                       first_across};
}

// The host's reduce-scatter, handing the chunks of the cross-host ring's
// first segment to it as they are reduced (its step 0).
absl::Status HostReduceScatter(OpContext& op, const HostPlace& p,
                               const TwoLevelPlans& plans) {
  const Range& first = plans.first_across;
  const int cross_seg = plans.cross.send_seg(0);
  return RingSteps(
      op, 0, p.g - 1, plans.host_rs, false,
      [&](int t, int, const Range& c) -> absl::Status {
        if (t != p.g - 2 || c.offset < first.offset ||
            c.offset >= first.offset + first.count) {
          return absl::OkStatus();
        }
        return SendChunk(op, plans.cross, 0, cross_seg, c);
      });
}

}  // namespace

absl::Status TwoLevelAllReduce(OpContext& op) {
  const bool early = op.host_sums_early();
  HALKA_ASSIGN_OR_RETURN(HostPlace p,
                         PlaceOnHosts(op, "all-reduce", /*track=*/!early));
  if (op.fp().count == 0) return absl::OkStatus();
  const TwoLevelPlans plans = PlanTwoLevel(op, p);
  const Range& part = plans.part;
  if (early) {
    // 1. Done while the fingerprints were in flight (TwoLevelStartEarly):
    //    the host's sums of the part wait in the scratch copy, and the
    //    cross-host ring's first step left from there.
    const size_t es = DTypeSize(op.fp().dtype);
    HALKA_RETURN_IF_ERROR(op.buffer().WriteBack(
        op.send_scratch().data() + part.offset * es, part.offset, part.count));
  } else {
    // 1. Reduce-scatter inside the host: this rank ends with the host's sum
    //    of part local+1 (no AVG division yet); the cross-host ring's first
    //    step leaves chunk by chunk as it is reduced.
    HALKA_RETURN_IF_ERROR(HostReduceScatter(op, p, plans));
  }
  // 2. That part's all-reduce across the hosts; each chunk it finishes
  //    goes on to the host's all-gather at once (its first step).
  HALKA_RETURN_IF_ERROR(RingSteps(
      op, 0, 2 * (p.h - 1), plans.cross, /*first_sent=*/true,
      [&](int t, int, const Range& c) -> absl::Status {
        if (t < p.h - 2) return absl::OkStatus();  // a partial sum
        return SendChunk(op, plans.host_ag, p.g - 1, plans.part_seg, c);
      }));
  // 3. The rest of the all-gather inside the host.
  return RingSteps(op, p.g - 1, 2 * (p.g - 1), plans.host_ag,
                   /*first_sent=*/true);
}

bool TwoLevelCanStartEarly(const OpContext& op) {
  const Fingerprint& fp = op.fp();
  if (fp.kind != OpKind::kAllReduce ||
      op.algorithm() != Algorithm::kTwoLevel || !op.all_to_all() ||
      fp.count == 0 || !TwoLevelUsable(op.config())) {
    return false;
  }
  const std::optional<LinkModel>& m = op.config().link_model;
  if (!m.has_value() || !m->local.known() || !m->net.known()) return false;
  // The copy runs at memory speed: at least the same-host links' rate
  // (each of their frames is a copy), and at least kCopyBytesPerSecond, a
  // figure below one core's memcpy of a cold buffer on any server we know
  // (this 2-core machine copies 16 MiB at 36 GB/s warm).
  constexpr double kCopyBytesPerSecond = 4e9;
  const double bytes = static_cast<double>(fp.count * DTypeSize(fp.dtype));
  return bytes / std::max(m->local.bytes_per_s, kCopyBytesPerSecond) <
         m->net.alpha_s;
}

absl::Status TwoLevelStartEarly(OpContext& op) {
  HALKA_ASSIGN_OR_RETURN(HostPlace p, PlaceOnHosts(op, "all-reduce"));
  std::vector<int> peers;
  for (int k : p.mine(op)) {
    if (k != op.rank()) peers.push_back(k);
  }
  // Nothing of a host peer is reduced before its fingerprint is checked;
  // where one disagrees, nothing starts early, and the exchange names the
  // disagreement as every rank does.
  HALKA_ASSIGN_OR_RETURN(const bool agree, AwaitFingerprintsEarly(op, peers));
  if (!agree) return absl::OkStatus();
  const Fingerprint& fp = op.fp();
  const size_t count = static_cast<size_t>(fp.count);
  const size_t bytes = count * DTypeSize(fp.dtype);
  HALKA_ASSIGN_OR_RETURN(const uint8_t* in, op.buffer().HostView(0, count));
  std::vector<uint8_t>& copy = op.send_scratch();
  copy.assign(in, in + bytes);  // (resize would zero it first)
  HostOpBuffer sums(copy.data());
  HALKA_RETURN_IF_ERROR(sums.Begin(fp.dtype, fp.op, count));
  // The host ring's reduce-scatter posts no receive: buffer() may be the
  // copy meanwhile. The operation stays in its fingerprint phase.
  op.LendBuffer(&sums);
  op.HoldLedger(true);
  const absl::Status status = HostReduceScatter(op, p, PlanTwoLevel(op, p));
  op.HoldLedger(false);
  op.LendBuffer(nullptr);
  if (status.ok()) op.set_host_sums_early();
  return status;
}

absl::Status TwoLevelReduceScatter(OpContext& op) {
  HALKA_ASSIGN_OR_RETURN(HostPlace p, PlaceOnHosts(op, "reduce-scatter"));
  if (op.fp().count == 0) return absl::OkStatus();
  SliceColumns c = ColumnsOf(op, p);
  // 1. Reduce-scatter inside the host over the columns, planned as the
  //    position before this one's, so that this rank ends with its own
  //    column (its slice and the same local position's slices on the other
  //    hosts) summed over its host.
  RingGroup in_host = InHost(op, p, Mod(p.local - 1, p.g));
  in_host.segments = std::move(c.columns);
  HALKA_RETURN_IF_ERROR(
      RingSteps(op, 0, p.g - 1, RingPlan(op, std::move(in_host)), false));
  // 2. The column's reduce-scatter across the hosts: this rank ends with
  //    its own slice summed over every rank (AVG divides here, once).
  RingGroup cross = AcrossHosts(p, Mod(p.host - 1, p.h), Range{}, op.world());
  cross.segments = std::move(c.across);
  return RingSteps(op, 0, p.h - 1, RingPlan(op, std::move(cross)), false);
}

absl::Status TwoLevelAllGather(OpContext& op) {
  HALKA_ASSIGN_OR_RETURN(HostPlace p, PlaceOnHosts(op, "all-gather"));
  if (op.fp().count == 0) return absl::OkStatus();
  HALKA_RETURN_IF_ERROR(MoveInputSlice(op));
  SliceColumns c = ColumnsOf(op, p);
  // 1. All-gather across the hosts: this rank ends with its column (the
  //    slices of its local position on every host).
  RingGroup cross = AcrossHosts(p, Mod(p.host - 1, p.h), Range{}, 0);
  cross.segments = std::move(c.across);
  HALKA_RETURN_IF_ERROR(RingSteps(op, p.h - 1, 2 * (p.h - 1),
                                  RingPlan(op, std::move(cross)), false));
  // 2. All-gather of the columns inside the host.
  RingGroup in_host = InHost(op, p, Mod(p.local - 1, p.g));
  in_host.segments = std::move(c.columns);
  return RingSteps(op, p.g - 1, 2 * (p.g - 1), RingPlan(op, std::move(in_host)),
                   false);
}

absl::Status RingAllGather(OpContext& op) {
  HALKA_RETURN_IF_ERROR(MoveInputSlice(op));
  const int g = op.world();
  return FlatSteps(op, g - 1, 2 * (g - 1), Mod(op.position() - 1, g));
}

}  // namespace halka
