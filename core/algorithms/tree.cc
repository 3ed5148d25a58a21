// Double binary tree all-reduce: a host's ranks to its leader, two binary
// trees over the leaders (one the other's mirror, each over half of the
// buffer) up to their roots and back down, the leader to its ranks. For
// small buffers on many ranks: 2 + 2*ceil(log2 H) hops in place of the
// ring's 2(G-1).
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
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

// How many chunks a leader reduces and sends up past a chunk before it
// takes that chunk's result coming down (where it is not its tree's
// root): the trees stay pipelined, and what waits in its inbox from its
// parents stays a few chunks.
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
  auto leader_at = [&](int tree, int p) {
    return t.hosts[static_cast<size_t>(TreeNodeAt(n, tree, p))][0];
  };
  for (int tree = 0; tree < 2; ++tree) {
    const int p = TreeNodeAt(n, tree, t.host);  // the mirror is its own inverse
    if (p > 0) t.parent[tree] = leader_at(tree, (p - 1) / 2);
    for (int c : {2 * p + 1, 2 * p + 2}) {
      if (c < n) t.children[tree].push_back(leader_at(tree, c));
    }
  }
  return t;
}

namespace {

// The chunks of a buffer of `count` elements, half for each tree (tree
// 0 the first half), in the order they are walked: alternately one of
// each tree, so that both trees stay busy. A buffer of less than two
// chunks goes through tree 0 alone: its time is the hops, and a second
// tree would only double the messages.
struct TreeChunk {
  Range range;
  int tree = 0;
};
std::vector<TreeChunk> PlanTreeChunks(size_t count, size_t chunk_elems) {
  const size_t half = count < 2 * chunk_elems ? 0 : count / 2;
  const std::vector<Range> first = PlanChunks(Range{0, count - half}, chunk_elems);
  std::vector<Range> second;
  if (half > 0) second = PlanChunks(Range{count - half, half}, chunk_elems);
  std::vector<TreeChunk> chunks;
  for (size_t i = 0; i < std::max(first.size(), second.size()); ++i) {
    if (i < first.size()) chunks.push_back({first[i], 0});
    if (i < second.size()) chunks.push_back({second[i], 1});
  }
  return chunks;
}

// One all-reduce's walk of the trees on this rank.
class TreeWalk {
 public:
  TreeWalk(OpContext& op, TreeShape shape)
      : op_(op),
        t_(std::move(shape)),
        dt_(op.fp().dtype),
        es_(DTypeSize(dt_)),
        count_(static_cast<size_t>(op.fp().count)),
        chunks_(PlanTreeChunks(
            count_, std::max<size_t>(1, op.config().chunk_bytes / es_))),
        n_(static_cast<int>(chunks_.size())) {
    for (int ci = 0; ci < n_; ++ci) chunk_at_[RangeOf(ci).offset] = ci;
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
  const Range& RangeOf(int ci) const {
    return chunks_[static_cast<size_t>(ci)].range;
  }
  int TreeOf(int ci) const { return chunks_[static_cast<size_t>(ci)].tree; }

  // The chunk whose range starts at `offset` (elements); -1: none.
  int ChunkAt(uint64_t offset) const {
    auto it = chunk_at_.find(offset);
    return it == chunk_at_.end() ? -1 : it->second;
  }

  // Whether `in` is chunk ci's frame that rank `from` sends this rank in
  // this walk: one that may come before the one awaited, since a peer's
  // frames of the two trees (and a leader's results, each sent once its
  // tree's root has it) need not come in the order this rank takes them.
  bool Expected(int from, int ci, const InFrame& in) const {
    const Range& c = RangeOf(ci);
    const int tree = TreeOf(ci);
    std::vector<FrameMeta> could;
    if (t_.local != 0) {
      if (from == t_.leader) could.push_back(Down(kInHost, c));
    } else {
      if (std::count(t_.members.begin(), t_.members.end(), from) > 0) {
        could.push_back(Up(kInHost, c));
      }
      const std::vector<int>& kids = t_.children[tree];
      if (std::count(kids.begin(), kids.end(), from) > 0) {
        could.push_back(Up(kAcross, c));
      }
      if (from == t_.parent[tree]) could.push_back(Down(kAcross, c));
    }
    for (const FrameMeta& m : could) {
      if (op_.CheckData(in, from, m).ok()) return true;
    }
    return false;
  }

  // Chunk ci's frame `expect` from `from`: one that came earlier and was
  // set aside, or the next ones from `from` until it comes (those of
  // chunks of the walk not yet taken from it come first are set aside,
  // copied: a frame may hold its link's ring, which the sender needs for
  // what follows). Each (peer, chunk) once: a frame of no chunk of the
  // walk, of one already taken or set aside, fails the operation
  // (DATA_LOSS, as AwaitData), as does one whose shared memory changed
  // under the copy.
  absl::StatusOr<InFrame> AwaitChunk(int from, int ci, const FrameMeta& expect) {
    const std::pair<int, int> key(from, ci);
    if (auto it = aside_.find(key); it != aside_.end()) {
      InFrame in = std::move(it->second);
      aside_.erase(it);
      HALKA_RETURN_IF_ERROR(op_.CheckData(in, from, expect));
      taken_.insert(key);
      return in;
    }
    for (;;) {
      HALKA_ASSIGN_OR_RETURN(InFrame in, op_.Await(from));
      const absl::Status fits = op_.CheckData(in, from, expect);
      if (fits.ok()) {
        taken_.insert(key);
        return in;
      }
      const std::pair<int, int> other(from, ChunkAt(in.meta.offset));
      if (other.second < 0 || other.second == ci || taken_.count(other) > 0 ||
          aside_.count(other) > 0 || !Expected(from, other.second, in)) {
        return fits;
      }
      InFrame copy;
      copy.meta = in.meta;
      auto bytes = std::make_shared<std::vector<uint8_t>>();
      bytes->reserve(in.PayloadBytes());
      for (const auto& piece : in.pieces) {
        bytes->insert(bytes->end(), piece.begin(), piece.end());
      }
      if (in.intact && !in.intact()) {
        return absl::DataLossError(absl::StrCat(
            op_.Where(), ": the shared memory of ", op_.Who(from),
            "'s frame of chunk ", other.second,
            " changed before this rank copied it"));
      }
      copy.pieces.push_back(absl::MakeConstSpan(*bytes));
      copy.keepalive = std::move(bytes);
      aside_.emplace(other, std::move(copy));
    }
  }

  // DATA_LOSS for frames set aside that no chunk took (a peer sent a frame
  // this rank never awaited from it).
  absl::Status NothingLeftAside() const {
    if (aside_.empty()) return absl::OkStatus();
    const auto& [from, ci] = aside_.begin()->first;
    return absl::DataLossError(absl::StrCat(
        op_.Where(), ": ", aside_.size(), " frame(s) came that this rank "
        "never took, the first of chunk ", ci, " from ", op_.Who(from)));
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
        const Range& c = RangeOf(up);
        op_.SetLedger(Phase::kGather, kInHost, up, n_, -1);
        HALKA_RETURN_IF_ERROR(op_.Send(t_.leader, Up(kInHost, c),
                                       own + c.offset * es_, c.count * es_,
                                       up));
      }
      return absl::OkStatus();
    };
    for (int ci = 0; ci < n_; ++ci) {
      HALKA_RETURN_IF_ERROR(send_up_to(ci + kUpWindow - 1));
      const Range& c = RangeOf(ci);
      op_.SetLedger(Phase::kBroadcast, kInHost, ci, n_, t_.leader);
      HALKA_ASSIGN_OR_RETURN(InFrame in,
                             AwaitChunk(t_.leader, ci, Down(kInHost, c)));
      if (!op_.WaitForReleases(ci, op_.deadline())) return SendDeadline();
      HALKA_RETURN_IF_ERROR(
          op_.buffer().Apply(/*reduce=*/false, c.offset, c.count, in));
    }
    return NothingLeftAside();
  }

  // A leader: its own buffer, then its host's ranks' and its children's
  // (in the chunk's tree) partial results reduced into scratch in that
  // order, chunk by chunk, and sent up; a root's scratch is the result,
  // which goes down the same way. Only a root's result reaches any
  // buffer: every rank has the same bits.
  absl::Status RunLeader() {
    for (int m : t_.members) op_.Watch(m);
    for (int tree = 0; tree < 2; ++tree) {
      for (int c : t_.children[tree]) op_.Watch(c);
      if (t_.parent[tree] >= 0) op_.Watch(t_.parent[tree]);
    }
    op_.TrackSegments(chunks_.size());
    HALKA_ASSIGN_OR_RETURN(const uint8_t* own, op_.buffer().HostView(0, count_));
    // The scratch the result grows in is the context's: frames still
    // pointing into it when this fails are released before it goes.
    scratch_ = &op_.send_scratch();
    scratch_->assign(own, own + count_ * es_);
    std::deque<int> coming;  // chunks whose result comes from a parent
    for (int ci = 0; ci < n_; ++ci) {
      HALKA_RETURN_IF_ERROR(ReduceUp(ci));
      if (t_.parent[TreeOf(ci)] < 0) {
        HALKA_RETURN_IF_ERROR(SendDown(ci));
        continue;
      }
      coming.push_back(ci);
      // By chunk number, on every leader alike, root of that chunk's tree
      // or not: a parent takes chunk k's result once it reduced chunk k +
      // kDownLag, which its children sent before they waited for k.
      while (!coming.empty() &&
             coming.front() + static_cast<int>(kDownLag) <= ci) {
        HALKA_RETURN_IF_ERROR(TakeDown(coming.front()));
        coming.pop_front();
      }
    }
    for (; !coming.empty(); coming.pop_front()) {
      HALKA_RETURN_IF_ERROR(TakeDown(coming.front()));
    }
    HALKA_RETURN_IF_ERROR(NothingLeftAside());
    // The buffer is written only now, and nothing was sent from it.
    HALKA_RETURN_IF_ERROR(op_.buffer().WriteBack(scratch_->data(), 0, count_));
    op_.RecordReduceTotal(reduce_time_);
    return absl::OkStatus();
  }

  uint8_t* At(const Range& c) { return scratch_->data() + c.offset * es_; }

  // Chunk ci's partial result: own + host's ranks + children (of its
  // tree), then to the parent (a root divides an AVG here, once).
  absl::Status ReduceUp(int ci) {
    const Range& c = RangeOf(ci);
    const int tree = TreeOf(ci);
    auto reduce = [&](int from, int step) -> absl::Status {
      op_.SetLedger(Phase::kGather, step, ci, n_, from);
      HALKA_ASSIGN_OR_RETURN(InFrame in, AwaitChunk(from, ci, Up(step, c)));
      const absl::Time t0 = halka::Now();
      ApplyPayload(dt_, op_.fp().op, /*reduce=*/true, At(c), in);
      reduce_time_ += op_.RecordReduce(from, halka::Now() - t0);
      return absl::OkStatus();
    };
    for (int m : t_.members) HALKA_RETURN_IF_ERROR(reduce(m, kInHost));
    for (int ch : t_.children[tree]) HALKA_RETURN_IF_ERROR(reduce(ch, kAcross));
    if (t_.parent[tree] >= 0) {
      op_.SetLedger(Phase::kGather, kAcross, ci, n_, -1);
      return op_.Send(t_.parent[tree], Up(kAcross, c), At(c), c.count * es_,
                      ci);
    }
    if (op_.fp().op == ReduceOp::kAvg) {
      FinalizeAvg(dt_, At(c), c.count, op_.world());
    }
    return absl::OkStatus();
  }

  // The result's chunk ci from its tree's parent into scratch, then on
  // down.
  absl::Status TakeDown(int ci) {
    const Range& c = RangeOf(ci);
    const int parent = t_.parent[TreeOf(ci)];
    op_.SetLedger(Phase::kBroadcast, kAcross, ci, n_, parent);
    HALKA_ASSIGN_OR_RETURN(InFrame in,
                           AwaitChunk(parent, ci, Down(kAcross, c)));
    // The chunk's partial sum went up from here: the result overwrites it
    // only once that send has left (it has, as a rule: the result needed it).
    if (!op_.WaitForReleases(ci, op_.deadline())) return SendDeadline();
    ApplyPayload(dt_, op_.fp().op, /*reduce=*/false, At(c), in);
    return SendDown(ci);
  }

  // The result's chunk ci to the children of its tree (across hosts first:
  // the longer hop), then to the host's ranks.
  absl::Status SendDown(int ci) {
    const Range& c = RangeOf(ci);
    op_.SetLedger(Phase::kBroadcast, kAcross, ci, n_, -1);
    for (int ch : t_.children[TreeOf(ci)]) {
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
  const std::vector<TreeChunk> chunks_;
  const int n_;
  // Where each chunk starts (elements) -> its index.
  std::map<uint64_t, int> chunk_at_;
  // Frames that came before the one awaited from their sender (copies),
  // and the frames taken, by (sender, chunk).
  std::map<std::pair<int, int>, InFrame> aside_;
  std::set<std::pair<int, int>> taken_;
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
