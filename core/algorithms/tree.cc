// Tree all-reduce: a host's ranks to its leader, a binary tree over the
// leaders up to the root and back down, the leader to its ranks. For small
// buffers on many ranks: 2 + 2*ceil(log2 H) hops in place of the ring's
// 2(G-1).
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "core/algorithms/algorithms.h"
#include "core/payload.h"
#include "core/reduce.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"

namespace halka {

namespace {

// How many chunks a non-root leader reduces and sends up before it takes
// the oldest result coming down: the tree stays pipelined, and what waits
// in its inbox from the parent stays a few chunks.
constexpr size_t kDownLag = 4;
// How many chunks a host's other rank has sent up beyond the results it
// has taken: what waits for its leader stays bounded (the leader's inbox
// is shared by its host's ranks and children).
constexpr int kUpWindow = 8;

// Phases and steps of the tree's frames: in-host hops are step 0, hops
// between leaders step 1; up is kGather (to the root), down kBroadcast.
constexpr int kInHost = 0;
constexpr int kAcross = 1;

}  // namespace

bool TreeHostsUsable(const CommConfig& config) {
  return config.hosts.size() >= 2 && HostsPartitionRanks(config);
}

TreeShape TreeShapeOf(const CommConfig& config, const RingPath& path) {
  TreeShape t;
  if (TreeHostsUsable(config)) {
    t.hosts = config.hosts;
  } else {
    for (int p = 0; p < path.world(); ++p) t.hosts.push_back({path.rank_at(p)});
  }
  for (size_t i = 0; i < t.hosts.size() && t.host < 0; ++i) {
    const std::vector<int>& h = t.hosts[i];
    const auto at = std::find(h.begin(), h.end(), config.rank);
    if (at != h.end()) {
      t.host = static_cast<int>(i);
      t.local = static_cast<int>(at - h.begin());
    }
  }
  const int n = static_cast<int>(t.hosts.size());
  if (t.host < 0) return t;
  t.leader = t.hosts[static_cast<size_t>(t.host)][0];
  if (t.local != 0) return t;
  const std::vector<int>& mine = t.hosts[static_cast<size_t>(t.host)];
  t.members.assign(mine.begin() + 1, mine.end());
  if (t.host > 0) t.parent = t.hosts[static_cast<size_t>((t.host - 1) / 2)][0];
  for (int c : {2 * t.host + 1, 2 * t.host + 2}) {
    if (c < n) t.children.push_back(t.hosts[static_cast<size_t>(c)][0]);
  }
  return t;
}

namespace {

// One all-reduce's tree walk on this rank.
class TreeWalk {
 public:
  TreeWalk(OpContext& op, TreeShape shape)
      : op_(op),
        t_(std::move(shape)),
        dt_(op.fp().dtype),
        es_(DTypeSize(dt_)),
        count_(static_cast<size_t>(op.fp().count)),
        chunks_(PlanChunks(Range{0, count_},
                           std::max<size_t>(1, op.config().chunk_bytes / es_))),
        n_(static_cast<int>(chunks_.size())) {
    for (int m : t_.members) sources_.emplace_back(m, kInHost);
    for (int c : t_.children) sources_.emplace_back(c, kAcross);
  }

  absl::Status Run() {
    if (t_.local != 0) return RunMember();
    return RunLeader();
  }

 private:
  FrameMeta Up(int step, const Range& c) const {
    return op_.ChunkMeta(Phase::kGather, step, 0, c);
  }
  FrameMeta Down(int step, const Range& c) const {
    return op_.ChunkMeta(Phase::kBroadcast, step, 0, c);
  }

  // A host's other rank: its buffer up to the leader (segment ci per
  // chunk, at most kUpWindow chunks ahead of the results it has taken: the
  // result of chunk ci needs only every rank's chunk ci), then the result
  // down into it, chunk by chunk, each once the chunk's own send has left.
  absl::Status RunMember() {
    op_.Watch(t_.leader);
    op_.TrackSegments(chunks_.size());
    HALKA_ASSIGN_OR_RETURN(const uint8_t* own, op_.buffer().HostView(0, count_));
    int up = 0;
    auto send_up_to = [&](int last) -> absl::Status {
      for (; up <= last && up < n_; ++up) {
        const Range& c = chunks_[static_cast<size_t>(up)];
        op_.SetLedger(Phase::kGather, kInHost, up, n_, -1);
        HALKA_RETURN_IF_ERROR(op_.Send(t_.leader, Up(kInHost, c),
                                       own + c.offset * es_, c.count * es_,
                                       up));
      }
      return absl::OkStatus();
    };
    for (int ci = 0; ci < n_; ++ci) {
      HALKA_RETURN_IF_ERROR(send_up_to(ci + kUpWindow - 1));
      const Range& c = chunks_[static_cast<size_t>(ci)];
      op_.SetLedger(Phase::kBroadcast, kInHost, ci, n_, t_.leader);
      HALKA_ASSIGN_OR_RETURN(InFrame in,
                             op_.AwaitData(t_.leader, Down(kInHost, c)));
      if (!op_.WaitForReleases(ci, op_.deadline())) return SendDeadline();
      HALKA_RETURN_IF_ERROR(
          op_.buffer().Apply(/*reduce=*/false, c.offset, c.count, in));
    }
    return absl::OkStatus();
  }

  // A leader: its own buffer, then its host's ranks' and its children's
  // partial results reduced into scratch in that order, chunk by chunk, and
  // sent up; the root's scratch is the result, which goes down the same
  // way. Only the root's result reaches any buffer: every rank has the
  // same bits.
  absl::Status RunLeader() {
    for (int m : t_.members) op_.Watch(m);
    for (int c : t_.children) op_.Watch(c);
    if (t_.parent >= 0) op_.Watch(t_.parent);
    op_.TrackSegments(chunks_.size());
    HALKA_ASSIGN_OR_RETURN(const uint8_t* own, op_.buffer().HostView(0, count_));
    // The scratch the result grows in is the context's: frames still
    // pointing into it when this fails are released before it goes.
    scratch_ = &op_.send_scratch();
    scratch_->assign(own, own + count_ * es_);
    int down = 0;
    for (int ci = 0; ci < n_; ++ci) {
      HALKA_RETURN_IF_ERROR(ReduceUp(ci));
      if (t_.parent < 0) {
        HALKA_RETURN_IF_ERROR(SendDown(ci));
        continue;
      }
      for (; down + static_cast<int>(kDownLag) <= ci; ++down) {
        HALKA_RETURN_IF_ERROR(TakeDown(down));
      }
    }
    if (t_.parent >= 0) {
      for (; down < n_; ++down) HALKA_RETURN_IF_ERROR(TakeDown(down));
    }
    // The buffer is written only now, and nothing was sent from it.
    HALKA_RETURN_IF_ERROR(op_.buffer().WriteBack(scratch_->data(), 0, count_));
    op_.RecordReduceTotal(reduce_time_);
    return absl::OkStatus();
  }

  uint8_t* At(const Range& c) { return scratch_->data() + c.offset * es_; }

  // Chunk ci's partial result: own + host's ranks + children, then to the
  // parent (the root divides an AVG here, once).
  absl::Status ReduceUp(int ci) {
    const Range& c = chunks_[static_cast<size_t>(ci)];
    for (const auto& [from, step] : sources_) {
      op_.SetLedger(Phase::kGather, step, ci, n_, from);
      HALKA_ASSIGN_OR_RETURN(InFrame in, op_.AwaitData(from, Up(step, c)));
      const absl::Time t0 = halka::Now();
      ApplyPayload(dt_, op_.fp().op, /*reduce=*/true, At(c), in);
      reduce_time_ += op_.RecordReduce(from, halka::Now() - t0);
    }
    if (t_.parent >= 0) {
      op_.SetLedger(Phase::kGather, kAcross, ci, n_, -1);
      return op_.Send(t_.parent, Up(kAcross, c), At(c), c.count * es_, ci);
    }
    if (op_.fp().op == ReduceOp::kAvg) {
      FinalizeAvg(dt_, At(c), c.count, op_.world());
    }
    return absl::OkStatus();
  }

  // The result's chunk ci from the parent into scratch, then on down.
  absl::Status TakeDown(int ci) {
    const Range& c = chunks_[static_cast<size_t>(ci)];
    op_.SetLedger(Phase::kBroadcast, kAcross, ci, n_, t_.parent);
    HALKA_ASSIGN_OR_RETURN(InFrame in, op_.AwaitData(t_.parent, Down(kAcross, c)));
    // The chunk's partial sum went up from here: the result overwrites it
    // only once that send has left (it has, as a rule: the result needed it).
    if (!op_.WaitForReleases(ci, op_.deadline())) return SendDeadline();
    ApplyPayload(dt_, op_.fp().op, /*reduce=*/false, At(c), in);
    return SendDown(ci);
  }

  // The result's chunk ci to the children (across hosts first: the longer
  // hop), then to the host's ranks.
  absl::Status SendDown(int ci) {
    const Range& c = chunks_[static_cast<size_t>(ci)];
    op_.SetLedger(Phase::kBroadcast, kAcross, ci, n_, -1);
    for (int ch : t_.children) {
      HALKA_RETURN_IF_ERROR(
          op_.Send(ch, Down(kAcross, c), At(c), c.count * es_, -1));
    }
    for (int m : t_.members) {
      HALKA_RETURN_IF_ERROR(
          op_.Send(m, Down(kInHost, c), At(c), c.count * es_, -1));
    }
    return absl::OkStatus();
  }

  absl::Status SendDeadline() const {
    return absl::DeadlineExceededError(absl::StrCat(
        op_.Where(), ": deadline exceeded before the peers took this rank's "
                     "buffer"));
  }

  OpContext& op_;
  const TreeShape t_;
  const DType dt_;
  const size_t es_;
  const size_t count_;
  const std::vector<Range> chunks_;
  const int n_;
  // A leader's partial results, in reduction order: (rank, step).
  std::vector<std::pair<int, int>> sources_;
  std::vector<uint8_t>* scratch_ = nullptr;
  absl::Duration reduce_time_;
};

}  // namespace

absl::Status TreeAllReduce(OpContext& op) {
  if (op.world() == 1 || op.fp().count == 0) return absl::OkStatus();
  TreeShape shape = TreeShapeOf(op.config(), op.path());
  if (shape.host < 0) {
    return absl::InternalError(
        absl::StrCat(op.Where(), ": this rank is on none of the tree's hosts"));
  }
  return TreeWalk(op, std::move(shape)).Run();
}

}  // namespace halka
