// The collectives, as free functions over one operation's OpContext.
//
// Internal to halka_core: the Communicator calls them, nothing else should.
// Each runs on the operation's thread after the fingerprints agree and the
// buffer's Begin succeeded. It moves data only through the context (Send,
// Await, CheckData, WaitForReleases), reports where it is with SetLedger
// and books its reduce time with RecordReduce / RecordReduceTotal. It
// returns the first error, already worded for the caller (the context's
// errors name the peer, phase and step); the Communicator then sends the
// ABORT frames and waits for the wire to release the buffer.
//
// A new collective is one more file here: a function of this shape, plus a
// case in Communicator::Run's dispatch.
#ifndef HALKA_CORE_ALGORITHMS_ALGORITHMS_H_
#define HALKA_CORE_ALGORITHMS_ALGORITHMS_H_

#include <vector>

#include "absl/status/status.h"
#include "core/comm_types.h"
#include "core/frame.h"
#include "core/op_context.h"
#include "core/ring_plan.h"

namespace halka {

// --- fingerprints.cc
// Which algorithm an operation runs; every rank resolves the same way from
// the fingerprint and the configuration alone.
Algorithm ResolveAlgorithm(const CommConfig& config, const Fingerprint& fp);
// What the job's link model (config.link_model) predicts for `fp` run with
// `algorithm` (as ResolveAlgorithm resolved it), in seconds; 0 without a
// model or a prediction.
double ModelSeconds(const CommConfig& config, const Fingerprint& fp,
                    Algorithm algorithm);
// Passes every rank's fingerprint to every rank: at once when
// op.all_to_all() (with the whole buffer riding along for an eager naive
// all-reduce, kept in op.eager()), else once around the ring (G-1 hops).
// Errors: FAILED_PRECONDITION naming two ranks that disagree, DATA_LOSS for
// an unexpected frame, and the context's wait and send errors.
absl::Status ExchangeFingerprints(OpContext& op);
// The same exchange in two halves, so that data can leave between them
// (only when op.all_to_all(): around the ring a fingerprint is forwarded on
// the data's own link, and must not queue behind it). SendFingerprints puts
// this rank's fingerprint (and an eager payload) on every link;
// AwaitFingerprints takes every other rank's and compares them.
absl::Status SendFingerprints(OpContext& op);
absl::Status AwaitFingerprints(OpContext& op);
// Between the two halves: takes the fingerprints of `ranks` ahead of the
// others (into op.early_fingerprints(), where AwaitFingerprints finds
// them) and says whether each is this rank's call, run alike. A
// disagreement is not an error here: AwaitFingerprints reports it, in the
// words every rank uses. Errors: those of the wait.
absl::StatusOr<bool> AwaitFingerprintsEarly(OpContext& op,
                                            const std::vector<int>& ranks);

// --- ring.cc
// Pipelined ring all-reduce: G-1 reduce-scatter steps, then G-1 all-gather
// steps, chunk by chunk; a chunk moves on as soon as it is reduced.
absl::Status RingAllReduce(OpContext& op);
// The all-reduce's two halves over a buffer of G equal slices (fp.count =
// G x slice), planned so that rank r owns slice r. Reduce-scatter: G-1
// steps; rank r ends with the reduction of slice r (AVG divided there), the
// other slices hold partial sums. All-gather: moves this rank's
// contribution from slice op.input_slice() to slice r, then G-1 steps; every
// rank ends with every slice. Each rank sends (G-1)/G of the buffer.
absl::Status RingReduceScatter(OpContext& op);
absl::Status RingAllGather(OpContext& op);
// Two-level all-reduce over config().hosts (H hosts of g ranks each; see
// TwoLevelUsable): a reduce-scatter inside each host (its own ring, over
// the same-host links), so that the rank at local position p holds the
// host's sum of part (p+1) mod g; then g rings across the hosts, one per
// local position, each an all-reduce of that part (2(H-1) network steps
// instead of the flat ring's 2(G-1), and every rank's link carries its
// share); then an all-gather inside each host. Every element is reduced
// in one order that every rank receives: bit-identical everywhere. AVG
// divides once, by the world, in the cross-host reduce-scatter.
// The three rings hand chunks on as they finish them: the host's
// reduce-scatter sends the cross-host ring's first step chunk by chunk,
// the cross-host ring each chunk it finishes to the host's all-gather.
// When its host's sums were reduced early (TwoLevelStartEarly), it takes
// them from the scratch copy and goes on with the cross-host ring's second
// step.
absl::Status TwoLevelAllReduce(OpContext& op);
// Whether a two-level all-reduce starts while the fingerprints are in
// flight: fingerprints all-to-all, and a link model by which copying the
// buffer once on this host (at its local B or 4 GB/s, whichever is
// faster) costs less than the network hop that agreeing first would add
// (its net alpha).
bool TwoLevelCanStartEarly(const OpContext& op);
// Between sending the fingerprints and waiting for the rest (the buffer
// begun): takes the host peers' fingerprints, and where they agree with
// this rank's, runs the host's reduce-scatter in a copy of the buffer
// (op.send_scratch()) and sends the cross-host ring's first step from
// there. The caller's buffer is only read: a disagreement found afterwards
// has touched no buffer anywhere, and nothing is reduced with a frame whose
// sender's fingerprint was not checked first. The network hop of the
// fingerprints then overlaps the data's, as for the ring (RingCanSendEarly).
absl::Status TwoLevelStartEarly(OpContext& op);
// Two-level reduce-scatter and all-gather on the same hosts: rank r's
// slice is planned as the flat ring's (PlanSegments over the world), and a
// host ring's segment k is the column of slices of local position k on
// every host. Reduce-scatter: the host ring reduce-scatters the columns
// (this rank ends with its own column summed over its host), then the
// cross-host ring of its local position reduce-scatters that column (its
// own slice summed everywhere; AVG divides there, once). All-gather: the
// cross-host ring gathers the column, then the host ring the columns.
// Each host's NIC carries (H-1)/H of the buffer, where the flat ring in
// host order carries (G-1)/G; H-1 network steps instead of G-1.
absl::Status TwoLevelReduceScatter(OpContext& op);
absl::Status TwoLevelAllGather(OpContext& op);
// Whether config.hosts allows it: at least 2 hosts, each with the same
// number (at least 2) of ranks, every rank once.
bool TwoLevelUsable(const CommConfig& config);
// Whether config.hosts holds every rank of the world exactly once, in
// hosts none of which is empty.
bool HostsPartitionRanks(const CommConfig& config);
// Whether the ring's first step may leave before the fingerprints agree:
// an all-reduce or reduce-scatter on the ring with fingerprints all-to-all.
// Its first step only reads this rank's own, unmodified chunks, so a
// disagreement found afterwards has still touched no buffer anywhere (the
// receivers compare every fingerprint before they read any data frame, and
// drop the frames of an op that failed).
bool RingCanSendEarly(const OpContext& op);
// Sends that first step (the buffer's Begin must have succeeded) and marks
// it sent, so the algorithm starts with its first wait.
absl::Status RingSendFirstStep(OpContext& op);

// --- naive.cc
// Every rank sends its buffer to every other rank and reduces all G copies
// in rank order (same bits everywhere). Eager: the copies came with the
// fingerprints.
absl::Status NaiveAllReduce(OpContext& op);

// --- doubling.cc
// Recursive-doubling all-reduce, for small buffers: with p the largest
// power of two <= G, log2 p rounds in which each of p ranks swaps its
// whole partial result with one partner, by position on the ring's path
// (a host's ranks first; position 2i+1, for i < G - p, first folds into
// position 2i and takes the result back last: 2 more steps for those). Every frame is a fingerprint frame carrying the partial result,
// checked against this rank's (CheckFingerprintPair) before it is
// reduced: the agreement needs no round of its own, and a disagreement
// fails the pair that meets it, whose ABORTs reach every rank (each watches
// its partners). Each swap reduces the lower position's partial result first
// (lo op hi on both sides): every rank ends with the same bits.
// DoublingExchange runs it all in the fingerprint phase into
// op.send_scratch(), so that nothing touches the buffer before every
// frame agreed; DoublingAllReduce then writes the result (AVG divided)
// into the buffer.
// Asked for on a larger buffer, an all-reduce runs the ring (each frame
// carries the whole buffer, and a frame holds at most 32 MiB).
inline constexpr uint64_t kDoublingMaxBytes = uint64_t{16} << 20;
absl::Status DoublingExchange(OpContext& op);
absl::Status DoublingAllReduce(OpContext& op);
// FAILED_PRECONDITION unless `theirs` (rank from's fingerprint) is this
// rank's call, run alike (fingerprints.cc).
absl::Status CheckFingerprintPair(OpContext& op, int from,
                                  const Fingerprint& theirs);

// --- halving.cc
// Halving-doubling all-reduce (Rabenseifner's), for mid-size and large
// buffers: with p the largest power of two <= G, a reduce-scatter by
// recursive halving over p blocks (round k pairs virtual rank v with
// v ^ 2^k, nearest first, so on hosts the largest halves stay inside
// them), then an all-gather by recursive doubling that retraces the
// rounds: 2 log2 p steps where the ring takes 2(G-1), each rank sending
// 2(p-1)/p of the buffer. Ranks beyond p fold their whole buffer into a
// partner first and take the whole result back (2 more steps, the whole
// buffer each, for those pairs). Each element is reduced by one rank
// (AVG divided there) and copied to the others: the same bits everywhere.
// The fingerprints agree first, as for the ring; as the ring's, its first
// send may leave while they are compared, where it reads only this rank's
// own input (HalvingCanSendEarly).
absl::Status HalvingDoublingAllReduce(OpContext& op);
// Whether this rank's first send of a halving-doubling all-reduce can leave
// before the fingerprints agree: with all-to-all fingerprints, where that
// send reads only the caller's unmodified buffer (a rank beyond the power of
// two folding in, or a rank that takes no fold-in, giving half in round 0).
// The receivers compare every fingerprint before they read a data frame,
// and drop the frames of an operation that failed.
bool HalvingCanSendEarly(const OpContext& op);
// Sends that first step (the buffer's Begin must have succeeded) and marks
// it sent, so that HalvingDoublingAllReduce goes on from there.
absl::Status HalvingSendFirstStep(OpContext& op);

// --- tree.cc
// Double binary tree all-reduce, for small buffers on many ranks: every
// rank of a host sends its buffer to the host's leader (its first rank);
// the leaders reduce up two binary trees at once, each over half of the
// buffer (a buffer of less than two chunks: tree 0 alone), chunk by
// chunk, pipelined, and the roots' results go back down
// and from each leader to its host's ranks. Tree 0 is a binary heap over
// the hosts in the order of config().hosts (ring order: host i's parent
// is host (i-1)/2); tree 1 is its mirror (host i takes host H-1-i's
// place), so a leader inner in one tree is a leaf in the other, and each
// leader's links carry at most twice the buffer each way where one tree
// carries three times. 2 + 2*ceil(log2 H) hops (H hosts) instead of the
// ring's 2(G-1). Without at least 2 usable hosts every rank is a host of
// its own: the trees are over the ring's order. Only a root's result is
// written anywhere (AVG divided there, once): every rank has the same
// bits. A leader moves each half once per child and parent in its tree,
// and the whole buffer once per host rank.
absl::Status TreeAllReduce(OpContext& op);
// Whether config.hosts gives the tree its hosts: at least 2, none empty,
// every rank exactly once (sizes may differ).
bool TreeHostsUsable(const CommConfig& config);
// This rank's place in the trees (host and local position -1: not in
// them); parent[t] and children[t] are a leader's in tree t (0 or 1).
struct TreeShape {
  std::vector<std::vector<int>> hosts;  // the tree's hosts, leader first
  int host = -1;
  int local = -1;
  int leader = -1;             // this host's leader
  std::vector<int> members;    // a leader's host ranks (not itself)
  int parent[2] = {-1, -1};    // a leader's parent leader; -1: the root
  std::vector<int> children[2];  // a leader's child leaders
};
TreeShape TreeShapeOf(const CommConfig& config, const RingPath& path);
// The tree positions of a binary heap of n nodes mirrored for tree 1: the
// node at heap position p of tree t (t = 1: node n-1-p).
inline int TreeNodeAt(int n, int tree, int p) { return tree == 0 ? p : n - 1 - p; }

// --- ps.cc
// Pushes shard k of the buffer to parameter server k, takes the reduced
// shard back. FAILED_PRECONDITION when no server is known.
absl::Status PsAllReduce(OpContext& op);

// --- broadcast.cc
// Chain broadcast root -> root+1 -> ... -> root-1, chunk by chunk. (The
// barrier has no data phase: the fingerprint pass is the barrier.)
absl::Status ChainBroadcast(OpContext& op);
// Tree broadcast (kTree), for small buffers: a binomial tree of the hosts'
// leaders from the root's host (the root leads it; elsewhere a host's
// first rank in ring order), then in every host a binomial tree from its
// leader; chunk by chunk, each chunk sent on to the children as soon as it
// arrived. ceil(log2 H) steps across hosts and ceil(log2 g) inside one,
// where the chain takes G-1; every host's NIC receives the buffer once.
// Without usable hosts (config.hosts), one binomial tree over the ring.
absl::Status TreeBroadcast(OpContext& op);
// This rank's place in the broadcast tree from `root`: its parent (-1: it
// is the root), its children in the order it sends to them, and its depth
// (steps from the root).
struct BroadcastTree {
  int parent = -1;
  std::vector<int> children;
  int depth = 0;
};
BroadcastTree BroadcastTreeOf(const CommConfig& config, const RingPath& path,
                              int root);

// --- rooted.cc
// Reduce to fp.root: direct (every other rank's whole buffer to the root,
// reduced there in rank order; kNaive) or, kRing, a ring reduce-scatter
// after which rank k sends its reduced segment k to the root. Only the
// root's buffer holds the result; the others' hold partial sums (ring) or
// are unchanged (direct).
absl::Status RootedReduce(OpContext& op);
// Gather to fp.root over a buffer of G slices: each rank's contribution
// (slice op.input_slice()) goes straight to the root's slice of that
// rank. The other ranks' buffers are not written.
absl::Status DirectGather(OpContext& op);
// Scatter from fp.root over a buffer of G slices: the root's slice k goes
// straight to rank k's slice k. The root's buffer is not written.
absl::Status DirectScatter(OpContext& op);
// All-to-all over a buffer of G slices: slice k goes to rank k, and slice k
// ends holding what rank k sent (its slice of this rank). Each rank sends
// (G-1)/G of the buffer, one hop each; what arrives waits in a host scratch
// copy until this rank's own sends are released.
absl::Status PairwiseAllToAll(OpContext& op);

}  // namespace halka

#endif  // HALKA_CORE_ALGORITHMS_ALGORITHMS_H_
