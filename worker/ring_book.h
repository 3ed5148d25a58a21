// The ring book: which ring (members, inbox, links, engine) this worker
// runs for each membership generation, and the newest membership it knows.
//
// One Ring per generation, built on first use after a change (between
// operations, never during one); the last two retired rings are kept so
// peers can finish an operation on them; inboxes of generations a peer
// switched to first wait in `early` until this worker gets there. The
// numbering rule (numbering.h) decides how a new ring numbers its calls.
//
// Thread-safety: all methods are thread-safe. Lock order: the book's mutex
// before a Communicator's state lock (InboxFor aborts an untouched
// operation, Build carries telemetry over), never a Communicator's
// operation lock (held for a whole operation: callers read next_op_seq()
// before Acquire) and never a RendezvousLink's lock; callbacks
// (on_link_failed) run on transport threads without it.
#ifndef HALKA_WORKER_RING_BOOK_H_
#define HALKA_WORKER_RING_BOOK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "halka/v1/rendezvous.pb.h"
#include "core/communicator.h"
#include "core/sub_ring.h"
#include "worker/worker_options.h"

namespace halka {

class GrpcTransport;
class WireFallbacks;

// One generation of the ring: its members, inbox, links and engine.
struct Ring {
  uint64_t generation = 0;
  int rank = 0;
  int world = 1;
  std::vector<PeerInfo> members;
  // The ranks in ring order (Membership.ring_order; empty: rank order):
  // the engine's path (CommConfig::ring_order) and the link that gets the
  // big same-host ring (the successor's).
  std::vector<int> ring_order;
  // The hosts in ring order with their ranks (Membership.hosts):
  // CommConfig::hosts, for the two-level all-reduce.
  std::vector<std::vector<int>> hosts;
  // The job's link model (Membership.link_model): CommConfig::link_model.
  std::optional<LinkModel> link_model;
  std::shared_ptr<Inbox> inbox;
  std::unique_ptr<GrpcTransport> transport;
  std::unique_ptr<Communicator> comm;
  // This worker entered the ring new, taking the others' numbering:
  // calls made before that moment belong to no operation of this ring.
  bool adopted = false;
  uint64_t epoch = 0;  // the book's epoch when the ring was built
  absl::Time built;    // when this worker learned it was admitted
  // The ring of the group of `ranks` (job ranks, the group's order;
  // OpSpec.group_ranks) on this ring's links, made at its first call
  // here. Errors: SubRing::Attach's; RESOURCE_EXHAUSTED past kMaxGroups
  // groups on one ring.
  absl::StatusOr<std::shared_ptr<SubRing>> Group(std::vector<int> ranks,
                                                 uint64_t tag);
  // Aborts each group's running operation that has not touched its buffer
  // (Communicator::AbortIfUntouched): a peer already runs a newer ring.
  void AbortUntouchedGroups(const absl::Status& status);
  // Aborts the ring's running operation and every group's (the worker is
  // stopping): each fails with `status` and no later one starts.
  void AbortAll(const absl::Status& status);
  static constexpr size_t kMaxGroups = 4096;
  ~Ring();

 private:
  // The groups made so far (aborted outside groups_mu_).
  std::vector<std::shared_ptr<SubRing>> GroupsNow();
  absl::Mutex groups_mu_;
  std::map<uint64_t, std::shared_ptr<SubRing>> groups_
      ABSL_GUARDED_BY(groups_mu_);
};

// A broken link to report to the rendezvous.
struct LinkReport {
  uint64_t generation = 0;
  std::string suspect;  // worker id
  std::string reason;
};

// What a new membership means for the worker (RingBook::Update).
struct MembershipUpdate {
  bool newer = false;        // false: nothing changed, ignore
  uint64_t before = 0;       // the generation known until now
  bool member = false;       // this worker is an alive member
  bool lost_peer = false;    // a member of the running ring is gone
  // Every such member left by its own Leave (Member.left): its calls had
  // returned, so what it sent for the running operation is on its way.
  bool peers_only_left = false;
  bool must_rejoin = false;  // joined, not a member, not forming: rejoin
  std::shared_ptr<Ring> running;  // the ring in use (may be null)
};

// One call as the ring book sees it.
struct CallInfo {
  uint64_t seq = 1;          // the number it runs as where numbering is kept
  bool retry = false;        // it runs again after a membership change
  uint64_t epoch = ~uint64_t{0};       // the book's epoch at its arrival
  absl::Time issued = absl::InfiniteFuture();  // when its caller issued it
  // The generation of the caller's current ring if that ring holds a call
  // number, else 0 (read by the caller without the book's lock).
  uint64_t numbered_generation = 0;
};

// True for Acquire's refusal of a stale call (IsStaleCall): a call that
// belongs to no operation of the ring, so it must take no number there (a
// number given up on its behalf would be the peers' next operation, which
// this worker's next call pairs with).
bool RefusedAsStale(const absl::Status& status);

// How many ranks of the ring share `rank`'s host (of `world`, on `hosts`
// in ring order; all `world` where hosts are not known).
int RanksOnHost(int rank, int world, const std::vector<std::vector<int>>& hosts);
// How long an operation polls its same-host rings before it sleeps
// (Inbox::SetSpinBeforeSleep): the worker's shm_spin, or with kShmSpinAuto
// kShmAutoSpin where the `ranks_here` that share this machine's cores are
// no more than `cpus`, else none: a spinning rank must not take the core
// of a rank it waits for.
absl::Duration OperationSpin(absl::Duration shm_spin, int ranks_here,
                             int cpus);
// How long an operation that found nothing on its rings and wire sockets
// yields its core and looks again before it sleeps
// (Inbox::SetYieldBeforeSleep): with kShmSpinAuto, kShmAutoYield where
// the `ranks_here` outnumber `cpus` (the rank it waits for mostly shares
// its core: a yield lets that rank run at once, and costs this thread no
// wake-up), else none; none where shm_spin is set to a value.
// `cpus` here: the CPUs it may run on (CpusOfAffinity), not its cgroup's
// quota: under a quota with idle cores, a yield finds nothing else to run
// and would spin the quota away; there it sleeps at once.
absl::Duration OperationYield(absl::Duration shm_spin, int ranks_here,
                              int cpus);
// The CPUs this process may use: those it may run on (sched_getaffinity;
// 1 if unknown), fewer where its cgroup's CPU quota allows less
// (CgroupCpuLimit; a container's or pod's CPU limit).
int CpusOfThisProcess();
// The CPUs this process may run on (sched_getaffinity; 1 if unknown).
int CpusOfAffinity();
// A cgroup v2 cpu.max text ("<quota> <period>", microseconds): the whole
// CPUs the quota allows, rounded down (1 at least: a rank that spins on a
// fraction of a CPU burns the quota and gets the cgroup throttled for the
// rest of the period); nullopt for "max" (no quota) or text that is not a
// quota.
std::optional<int> CpusOfQuota(absl::string_view cpu_max);
// The smallest CPU quota on the way from the process's cgroup up to the
// root of its hierarchy, the root included (a container in its own cgroup
// namespace, or with its cgroup bind-mounted at the root, finds its quota
// there). The cgroups come from the text of /proc/self/cgroup, in its
// order: its v2 line ("0::<path>": cpu.max in each directory under
// `cgroup_fs`) and a v1 line whose controllers include "cpu"
// (cpu.cfs_quota_us and cpu.cfs_period_us under `cgroup_fs`/<controllers>,
// /cpu or /cpu,cpuacct); the first that sets a quota counts. nullopt where
// none does or nothing can be read.
std::optional<int> CgroupCpuLimit(const std::string& cgroup_fs,
                                  absl::string_view proc_self_cgroup);

class RingBook {
 public:
  using LinkFailedFn =
      std::function<void(uint64_t generation, int peer, const absl::Status&)>;
  // `on_link_failed` runs on a transport thread for every broken link of
  // a ring (never under the book's lock).
  // `log` (the worker's, outlives the book) gets the rank when it changes.
  // `counters` and `wire_fallbacks`: the worker's, shared with every ring's
  // transport and inbox (counters null: each inbox and transport counts
  // on its own; fallbacks null: each transport remembers its own).
  RingBook(const WorkerOptions& options, Logger* log,
           LinkFailedFn on_link_failed,
           std::shared_ptr<LinkCounters> counters = nullptr,
           std::shared_ptr<WireFallbacks> wire_fallbacks = nullptr);
  ~RingBook();
  // This worker's dialable address (how it finds itself in a membership),
  // known once its server listens; set before it joins.
  void set_address(std::string address);

  // Records a membership newer than the newest known one.
  MembershipUpdate Update(const v1::Membership& m);
  void MarkJoined();
  bool joined() const;

  // The ring for the newest membership, built on first use after a change.
  // Errors: FAILED_PRECONDITION (not joined yet), UNAVAILABLE (the job is
  // below its minimum, or this worker is not in the ring: it is joining
  // again), ABORTED (the call is stale, or a re-run straddled this
  // worker's re-admission: call again).
  absl::StatusOr<std::shared_ptr<Ring>> Acquire(const CallInfo& call);
  std::shared_ptr<Ring> Current() const;
  // The ring Acquire(call) would return without building one (joined, the
  // ring of the newest membership, the call not stale), else null: a call
  // that needs no new ring (send, recv) takes it without waiting for the
  // running operation.
  std::shared_ptr<Ring> Ready(const CallInfo& call) const;

  // The inbox a peer's link of `generation` delivers into (peer threads).
  // A generation ahead of this worker gets an early inbox (and the running
  // operation, if still comparing fingerprints, is aborted to re-run on
  // the new ring). Errors: ABORTED (an old generation), INVALID_ARGUMENT
  // (implausibly far ahead).
  absl::StatusOr<std::shared_ptr<Inbox>> InboxFor(uint64_t generation);

  // A broken link of `generation` to `peer`: the report to send, once per
  // (generation, peer) while that generation is current; nullopt else.
  std::optional<LinkReport> OnLinkFailed(uint64_t generation, int peer,
                                         const absl::Status& status);

  // The newest membership, and its generation.
  v1::Membership Latest() const;
  uint64_t latest_generation() const;
  // The newest generation a peer opened links for (0: none ahead).
  uint64_t newest_early_generation() const;
  // The membership to claim at a rendezvous that forgot the job: the
  // newest one, if this worker runs its ring and the job is not waiting.
  std::optional<v1::Membership> Claimable() const;
  uint64_t epoch() const;

  // Waits (bounded by `deadline`) for a generation newer than `failed_on`;
  // true when one came that a call can run again on (not waiting, not
  // stopping).
  bool AwaitNewerGeneration(uint64_t failed_on, absl::Time deadline);

  // Parameter-server shards, handed to the current ring and every later one.
  void SetServers(const std::vector<PeerInfo>& servers);

  // Stops: refuses new inboxes, reports and rings (Acquire fails
  // UNAVAILABLE, Ready answers null from here), wakes waiters, and hands
  // every ring back to be aborted and destroyed outside the lock (closes
  // their links).
  std::vector<std::shared_ptr<Ring>> Stop();

 private:
  // A new inbox with the byte budget (Inbox::ByteBudget), counting in the
  // worker's counters; Build sets its spin (OperationSpin) for its ring.
  std::shared_ptr<Inbox> NewInbox() const;
  // The ring's transport: its links with the worker's options, security,
  // counters and wire fallbacks.
  std::unique_ptr<GrpcTransport> NewTransport(const Ring& ring) const;
  absl::StatusOr<std::shared_ptr<Ring>> Build(const CallInfo& call,
                                              std::vector<std::shared_ptr<Ring>>* drop)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Stale(uint64_t generation) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const WorkerOptions& options_;
  Logger* const log_;
  const LinkFailedFn on_link_failed_;
  const std::shared_ptr<LinkCounters> counters_;
  const std::shared_ptr<WireFallbacks> wire_fallbacks_;

  mutable absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Members of ring_ that left by their own Leave (Member.left), from
  // every change since ring_ was built (MembershipUpdate::peers_only_left).
  std::set<std::string> left_ ABSL_GUARDED_BY(mu_);
  v1::Membership latest_ ABSL_GUARDED_BY(mu_);  // the newest generation
  std::shared_ptr<Ring> ring_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Ring>> retired_ ABSL_GUARDED_BY(mu_);
  // Inboxes of generations peers switched to before this worker did.
  std::map<uint64_t, std::shared_ptr<Inbox>> early_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, int>> reported_ ABSL_GUARDED_BY(mu_);
  std::vector<PeerInfo> servers_ ABSL_GUARDED_BY(mu_);
  // Bumped whenever this worker learns it is not in the newest ring.
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // When this worker learned it was admitted (new) into the newest ring.
  absl::Time admitted_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace halka

#endif  // HALKA_WORKER_RING_BOOK_H_
