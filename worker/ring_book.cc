#include "worker/ring_book.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "codec/membership_codec.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/security.h"
#include "core/ring_plan.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/shm/shm_link.h"
#include "worker/numbering.h"

namespace halka {
namespace {

// The engine's configuration for `ring` under the worker's options.
CommConfig CommConfigFor(const WorkerOptions& o, const Ring& ring,
                         uint64_t first_op_seq) {
  CommConfig c;
  c.rank = ring.rank;
  c.world_size = ring.world;
  c.generation = ring.generation;
  c.members = ring.members;
  c.ring_order = ring.ring_order;
  c.hosts = ring.hosts;
  c.link_model = ring.link_model;
  c.chunk_bytes = o.chunk_bytes;
  c.default_timeout = o.op_timeout;
  c.max_op_bytes = o.max_op_bytes;
  c.test_reduce_delay = o.test_reduce_delay;
  c.first_op_seq = first_op_seq;
  return c;
}

// The ring membership m describes, as seen by `rank` (its links, inbox and
// communicator not made yet).
std::shared_ptr<Ring> RingOf(const v1::Membership& m, int rank, bool adopted,
                             uint64_t epoch, absl::Time built) {
  auto ring = std::make_shared<Ring>();
  ring->generation = m.generation();
  ring->rank = rank;
  ring->world = m.members_size();
  ring->adopted = adopted;
  ring->epoch = epoch;
  ring->built = built;
  for (const v1::Member& x : m.members()) {
    ring->members.push_back(PeerInfo{x.rank(), x.worker_id(), x.address()});
  }
  ring->ring_order.assign(m.ring_order().begin(), m.ring_order().end());
  for (const v1::HostGroup& h : m.hosts()) {
    ring->hosts.emplace_back(h.ranks().begin(), h.ranks().end());
  }
  if (m.has_link_model()) ring->link_model = LinkModelFromProto(m.link_model());
  return ring;
}

}  // namespace

absl::StatusOr<std::shared_ptr<SubRing>> Ring::Group(std::vector<int> ranks,
                                                     uint64_t tag) {
  const uint64_t id = GroupId(ranks, tag);
  absl::MutexLock lock(&groups_mu_);
  if (auto g = groups_.find(id); g != groups_.end()) {
    if (g->second->ranks() != ranks || g->second->tag() != tag) {
      return absl::InternalError(absl::StrCat(
          g->second->Name(), " and group [", absl::StrJoin(ranks, ","),
          "] have the same id ", id, ": a hash collision"));
    }
    return g->second;
  }
  if (groups_.size() >= kMaxGroups) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this worker's ring (generation ", generation, ") has ", kMaxGroups,
        " groups already, the most it makes"));
  }
  absl::StatusOr<std::unique_ptr<SubRing>> made =
      SubRing::Attach(comm->config(), transport.get(), inbox.get(),
                      std::move(ranks), tag);
  if (!made.ok()) return made.status();
  std::shared_ptr<SubRing> group = std::move(*made);
  groups_.emplace(id, group);
  return group;
}

std::vector<std::shared_ptr<SubRing>> Ring::GroupsNow() {
  std::vector<std::shared_ptr<SubRing>> groups;
  absl::MutexLock lock(&groups_mu_);
  for (const auto& [id, g] : groups_) groups.push_back(g);
  return groups;
}

void Ring::AbortUntouchedGroups(const absl::Status& status) {
  for (const auto& g : GroupsNow()) g->comm().AbortIfUntouched(status);
}

void Ring::AbortAll(const absl::Status& status) {
  if (comm != nullptr) comm->Abort(status);
  for (const auto& g : GroupsNow()) g->comm().Abort(status);
}

Ring::~Ring() {
  {
    absl::MutexLock lock(&groups_mu_);
    groups_.clear();  // before the links and inbox they run on
  }
  comm.reset();
  transport.reset();  // cancels the links and waits for them
}

RingBook::RingBook(const WorkerOptions& options, Logger* log,
                   LinkFailedFn on_link_failed,
                   std::shared_ptr<LinkCounters> counters,
                   std::shared_ptr<WireFallbacks> wire_fallbacks)
    : options_(options),
      log_(log),
      on_link_failed_(std::move(on_link_failed)),
      counters_(std::move(counters)),
      wire_fallbacks_(std::move(wire_fallbacks)) {}

RingBook::~RingBook() = default;

void RingBook::set_address(std::string address) {
  absl::MutexLock lock(&mu_);
  address_ = std::move(address);
}

MembershipUpdate RingBook::Update(const v1::Membership& m) {
  MembershipUpdate u;
  absl::MutexLock lock(&mu_);
  u.before = latest_.generation();
  if (m.generation() <= u.before) return u;
  u.newer = true;
  latest_ = m;
  u.running = ring_;
  std::set<std::string> alive;
  for (const v1::Member& x : m.members()) {
    if (!x.alive()) continue;
    alive.insert(absl::StrCat(x.worker_id(), "@", x.address()));
    u.member |= x.worker_id() == options_.worker_id && x.address() == address_;
  }
  if (ring_ != nullptr) {
    // Members of the running ring that left, over every change since it
    // was built (a second leaver's change lists only itself as lost).
    for (const v1::Member& x : m.lost()) {
      if (x.left()) left_.insert(absl::StrCat(x.worker_id(), "@", x.address()));
    }
    bool faulted = false;
    for (const PeerInfo& p : ring_->members) {
      const std::string id = absl::StrCat(p.worker_id, "@", p.address);
      if (alive.count(id)) continue;
      u.lost_peer = true;
      faulted |= !left_.count(id);
    }
    u.peers_only_left = u.lost_peer && !faulted;
  }
  if (!u.member && joined_ && m.job_state() != v1::JOB_STATE_FORMING) {
    u.must_rejoin = true;
    ++epoch_;
  }
  for (const v1::Member& x : m.members()) {
    if (x.worker_id() == options_.worker_id && x.address() == address_ &&
        x.since_generation() == m.generation()) {
      admitted_at_ = halka::Now();  // new in this generation
    }
  }
  return u;
}

void RingBook::MarkJoined() {
  absl::MutexLock lock(&mu_);
  joined_ = true;
}

bool RingBook::joined() const {
  absl::MutexLock lock(&mu_);
  return joined_;
}

std::shared_ptr<Ring> RingBook::Current() const {
  absl::MutexLock lock(&mu_);
  return ring_;
}

std::shared_ptr<Ring> RingBook::Ready(const CallInfo& call) const {
  absl::MutexLock lock(&mu_);
  if (stopping_ || !joined_ || ring_ == nullptr ||
      ring_->generation != latest_.generation() ||
      IsStaleCall(ring_->adopted, ring_->epoch, ring_->built, call.epoch,
                  call.issued)) {
    return nullptr;
  }
  return ring_;
}

namespace {
constexpr char kStalePayload[] = "halka.dev/stale-call";
}  // namespace

bool RefusedAsStale(const absl::Status& status) {
  return status.GetPayload(kStalePayload).has_value();
}

absl::Status RingBook::Stale(uint64_t generation) const {
  absl::Status stale = absl::AbortedError(absl::StrCat(
      "this call was made before worker ", options_.worker_id,
      " re-joined the ring of job ", options_.job_id, " (generation ",
      generation, "); the ring moved on without it: call again"));
  stale.SetPayload(kStalePayload, absl::Cord(absl::StrCat(generation)));
  return stale;
}

absl::StatusOr<std::shared_ptr<Ring>> RingBook::Acquire(const CallInfo& call) {
  std::vector<std::shared_ptr<Ring>> drop;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    // Stop() took the rings and the worker aborted them: a call that
    // arrives now must not build a fresh ring (nothing would abort it,
    // and it would run to its deadline while the worker's stop waits).
    return absl::UnavailableError(absl::StrCat(
        "worker ", options_.worker_id, " is shutting down"));
  }
  if (!joined_) {
    return absl::FailedPreconditionError("worker has not joined its job yet");
  }
  if (ring_ != nullptr && ring_->generation == latest_.generation()) {
    if (IsStaleCall(ring_->adopted, ring_->epoch, ring_->built, call.epoch,
                    call.issued)) {
      return Stale(ring_->generation);
    }
    return ring_;
  }
  return Build(call, &drop);
}

absl::StatusOr<std::shared_ptr<Ring>> RingBook::Build(
    const CallInfo& call, std::vector<std::shared_ptr<Ring>>* drop) {
  const v1::Membership& m = latest_;
  if (m.job_state() == v1::JOB_STATE_WAITING) {
    return absl::UnavailableError(absl::StrCat(
        "job ", options_.job_id, " is below its minimum of ",
        m.min_world_size(), " members (generation ", m.generation(), ": ",
        m.change(), "); operations fail until enough members (re)join"));
  }
  NumberingInput in;
  in.last_ring_generation = ring_ == nullptr ? 0 : ring_->generation;
  in.last_ring_numbered = ring_ != nullptr && call.numbered_generation != 0 &&
                          ring_->generation == call.numbered_generation;
  in.seq = call.seq;
  in.retry = call.retry;
  in.self = FindSelf(m, options_.worker_id, address_);
  if (in.self.rank < 0) {
    return absl::UnavailableError(absl::StrCat(
        "worker ", options_.worker_id, " is not in the ring of job ",
        options_.job_id, " (generation ", m.generation(), ": ", m.change(),
        "); it is joining again"));
  }
  const NumberingDecision numbering = DecideNumbering(in);
  if (numbering.refuse_retry) {
    return absl::AbortedError(absl::StrCat(
        "worker ", options_.worker_id, " re-joined the ring of job ",
        options_.job_id, " (generation ", m.generation(),
        ") while this call ran: call again"));
  }
  if (IsStaleCall(numbering.adopted, epoch_, admitted_at_, call.epoch,
                  call.issued)) {
    return Stale(m.generation());
  }
  std::shared_ptr<Ring> ring =
      RingOf(m, in.self.rank, numbering.adopted, epoch_, admitted_at_);
  const CommConfig c = CommConfigFor(options_, *ring, numbering.first_op_seq);
  auto early = early_.find(ring->generation);
  ring->inbox = early != early_.end() ? early->second : NewInbox();
  const int ranks_here = options_.machine_ranks > 0
                             ? options_.machine_ranks
                             : RanksOnHost(ring->rank, ring->world, ring->hosts);
  ring->inbox->SetSpinBeforeSleep(
      OperationSpin(options_.shm_spin, ranks_here, CpusOfThisProcess()));
  ring->inbox->SetYieldBeforeSleep(
      OperationYield(options_.shm_spin, ranks_here, CpusOfAffinity()));
  early_.erase(early_.begin(), early_.upper_bound(ring->generation));
  reported_.erase(reported_.begin(),
                  reported_.lower_bound({ring->generation, -1}));
  const uint64_t generation = ring->generation;
  ring->inbox->SetLinkFailureHook(
      [this, generation](int peer, const absl::Status& status) {
        on_link_failed_(generation, peer, status);
      });
  ring->transport = NewTransport(*ring);
  ring->comm = std::make_unique<Communicator>(c, ring->transport.get(),
                                              ring->inbox.get());
  if (!servers_.empty()) {
    std::vector<std::string> server_addresses;
    for (const PeerInfo& p : servers_) server_addresses.push_back(p.address);
    ring->transport->SetServerAddresses(server_addresses);
    ring->comm->SetServers(servers_);
  }
  if (ring_ != nullptr) {
    ring->comm->InheritTelemetry(*ring_->comm);
    log_->Info(absl::StrCat("generation ", ring_->generation, "->",
                         ring->generation, ": now rank ", ring->rank, " of ",
                         ring->world,
                         c.first_op_seq == 0
                             ? ", joining the ring's numbering"
                             : absl::StrCat(", next op #", c.first_op_seq)));
    retired_.push_back(std::move(ring_));
    // Keep the last two: peers may still finish an operation on them.
    while (retired_.size() > 2) {
      drop->push_back(std::move(retired_.front()));
      retired_.erase(retired_.begin());
    }
  }
  ring_ = ring;
  left_.clear();  // the new ring's members were all alive
  log_->SetTag(absl::StrCat("worker ", options_.worker_id, " rank ", ring->rank));
  return ring;
}

absl::StatusOr<std::shared_ptr<Inbox>> RingBook::InboxFor(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return absl::UnavailableError(absl::StrCat(
        "worker ", options_.worker_id, " is shutting down"));
  }
  const uint64_t current = ring_ != nullptr ? ring_->generation : 0;
  if (ring_ != nullptr && generation == current) return ring_->inbox;
  for (const auto& r : retired_) {
    if (r->generation == generation) return r->inbox;
  }
  if (generation < current) {
    return absl::AbortedError(absl::StrCat(
        "generation ", generation, " of job ", options_.job_id,
        " is over: this worker is at generation ", current));
  }
  if (generation > std::max(current, latest_.generation()) + 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer link for generation ", generation, " of job ", options_.job_id,
        ", which is at generation ", latest_.generation()));
  }
  std::shared_ptr<Inbox>& inbox = early_[generation];
  if (inbox == nullptr) {
    inbox = NewInbox();
    // A peer runs a newer generation: an operation of this one that is
    // still comparing fingerprints waits for that peer in vain. Stop it
    // (it re-runs on the new ring); one past that point finishes here.
    if (ring_ != nullptr) {
      const absl::Status newer = absl::AbortedError(absl::StrCat(
          "a peer already runs generation ", generation, " of job ",
          options_.job_id));
      ring_->comm->AbortIfUntouched(newer);
      // The same for its groups' (they fail at once; their callers call
      // again, on the new ring).
      ring_->AbortUntouchedGroups(newer);
    }
  }
  return inbox;
}

std::unique_ptr<GrpcTransport> RingBook::NewTransport(const Ring& ring) const {
  std::vector<std::string> addresses;
  for (const PeerInfo& p : ring.members) addresses.push_back(p.address);
  GrpcTransport::LinkSetup links;
  links.shm_ring_bytes =
      LinkRingPolicy(options_.shm_links, options_.chunk_bytes,
                     RingPath(ring.world, ring.ring_order).succ(ring.rank));
  links.wire_links = options_.wire_links;
  links.wire_congestion = options_.wire_congestion;
  // Captured by WorkerNode::Create: this worker's, not the process's now.
  links.security = options_.security.has_value() ? *options_.security
                                                 : GetSecurityConfig();
  links.counters = counters_;
  links.wire_fallbacks = wire_fallbacks_;
  return std::make_unique<GrpcTransport>(options_.job_id, ring.generation,
                                         ring.rank, std::move(addresses),
                                         ring.inbox.get(), std::move(links));
}

int RanksOnHost(int rank, int world, const std::vector<std::vector<int>>& hosts) {
  for (const std::vector<int>& h : hosts) {
    if (std::find(h.begin(), h.end(), rank) != h.end()) {
      return static_cast<int>(h.size());
    }
  }
  return world;
}

absl::Duration OperationSpin(absl::Duration shm_spin, int ranks_here,
                             int cpus) {
  if (shm_spin != kShmSpinAuto) return std::max(shm_spin, absl::ZeroDuration());
  return ranks_here <= std::max(cpus, 1) ? kShmAutoSpin : absl::ZeroDuration();
}

absl::Duration OperationYield(absl::Duration shm_spin, int ranks_here,
                              int cpus) {
  if (shm_spin != kShmSpinAuto) return absl::ZeroDuration();
  return ranks_here > std::max(cpus, 1) ? kShmAutoYield : absl::ZeroDuration();
}

std::optional<int> CpusOfQuota(absl::string_view cpu_max) {
  std::vector<absl::string_view> words =
      absl::StrSplit(cpu_max, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  int64_t quota = 0;
  int64_t period = 0;
  if (words.size() != 2 || !absl::SimpleAtoi(words[0], &quota) ||
      !absl::SimpleAtoi(words[1], &period) || quota <= 0 || period <= 0) {
    return std::nullopt;  // "max", v1's "-1" or not a quota
  }
  return static_cast<int>(std::clamp<int64_t>(
      quota / period, 1, std::numeric_limits<int>::max()));
}

namespace {

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  return text;
}

// The lowest quota at `dir` and its parents up to `root` (inclusive),
// reading each level's quota with `at`.
std::optional<int> LowestOnTheWayUp(
    const std::string& root, std::string dir,
    const std::function<std::optional<int>(const std::string&)>& at) {
  std::optional<int> lowest;
  while (true) {
    std::optional<int> here = at(dir);
    if (here.has_value() && (!lowest.has_value() || *here < *lowest)) {
      lowest = here;
    }
    if (dir.size() <= root.size()) return lowest;
    dir = dir.substr(0, dir.rfind('/'));
  }
}

}  // namespace

std::optional<int> CgroupCpuLimit(const std::string& cgroup_fs,
                                  absl::string_view proc_self_cgroup) {
  // Lines "<id>:<controllers>:<path>": v2's is "0::<path>", v1's cpu
  // controller's names "cpu" among its controllers.
  for (absl::string_view line :
       absl::StrSplit(proc_self_cgroup, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3 || f[2].empty() || f[2][0] != '/') continue;
    std::string path(f[2] == "/" ? "" : f[2]);
    if (f[0] == "0" && f[1].empty()) {
      std::optional<int> v2 = LowestOnTheWayUp(
          cgroup_fs, cgroup_fs + path, [](const std::string& dir) {
            std::optional<std::string> t = ReadSmallFile(dir + "/cpu.max");
            return t.has_value() ? CpusOfQuota(*t) : std::nullopt;
          });
      if (v2.has_value()) return v2;
      continue;
    }
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c != "cpu") continue;
      // The hierarchy's mount is named by its controllers as listed here
      // ("cpu,cpuacct"); distributions also link /cpu to it.
      for (const std::string& mount :
           {absl::StrCat("/", f[1]), std::string("/cpu")}) {
        const std::string root = cgroup_fs + mount;
        std::optional<int> v1 = LowestOnTheWayUp(
            root, root + path, [](const std::string& dir) {
              std::optional<std::string> q =
                  ReadSmallFile(dir + "/cpu.cfs_quota_us");
              std::optional<std::string> p =
                  ReadSmallFile(dir + "/cpu.cfs_period_us");
              if (!q.has_value() || !p.has_value()) return std::optional<int>();
              return CpusOfQuota(absl::StrCat(*q, " ", *p));
            });
        if (v1.has_value()) return v1;
      }
    }
  }
  return std::nullopt;
}

int CpusOfAffinity() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int n =
      sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  return std::max(n, 1);
}

int CpusOfThisProcess() {
  int n = CpusOfAffinity();
  std::optional<std::string> self = ReadSmallFile("/proc/self/cgroup");
  if (self.has_value()) {
    std::optional<int> limit = CgroupCpuLimit("/sys/fs/cgroup", *self);
    if (limit.has_value()) n = std::min(n, *limit);
  }
  return std::max(n, 1);
}

std::shared_ptr<Inbox> RingBook::NewInbox() const {
  auto inbox = std::make_shared<Inbox>(1 << 16, counters_);
  inbox->SetByteBudget(Inbox::ByteBudget{options_.max_queued_bytes_per_peer,
                                         options_.max_queued_bytes});
  return inbox;
}

std::optional<LinkReport> RingBook::OnLinkFailed(uint64_t generation, int peer,
                                                 const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || ring_ == nullptr || ring_->generation != generation ||
      latest_.generation() != generation || peer < 0 ||
      peer >= ring_->world || peer == ring_->rank) {
    return std::nullopt;
  }
  if (!reported_.insert({generation, peer}).second) return std::nullopt;
  return LinkReport{generation,
                    ring_->members[static_cast<size_t>(peer)].worker_id,
                    std::string(status.message())};
}

v1::Membership RingBook::Latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

uint64_t RingBook::latest_generation() const {
  absl::MutexLock lock(&mu_);
  return latest_.generation();
}

uint64_t RingBook::newest_early_generation() const {
  absl::MutexLock lock(&mu_);
  return early_.empty() ? 0 : early_.rbegin()->first;
}

std::optional<v1::Membership> RingBook::Claimable() const {
  absl::MutexLock lock(&mu_);
  if (ring_ == nullptr || ring_->generation != latest_.generation() ||
      latest_.job_state() == v1::JOB_STATE_WAITING) {
    return std::nullopt;
  }
  return latest_;
}

uint64_t RingBook::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

bool RingBook::AwaitNewerGeneration(uint64_t failed_on, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto newer = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || latest_.generation() > failed_on;
  };
  mu_.AwaitWithDeadline(absl::Condition(&newer), deadline);
  return !stopping_ && latest_.generation() > failed_on &&
         latest_.job_state() != v1::JOB_STATE_WAITING;
}

void RingBook::SetServers(const std::vector<PeerInfo>& servers) {
  std::shared_ptr<Ring> ring;
  {
    absl::MutexLock lock(&mu_);
    servers_ = servers;
    ring = ring_;
  }
  if (ring == nullptr) return;
  std::vector<std::string> addresses;
  for (const PeerInfo& p : servers) addresses.push_back(p.address);
  ring->transport->SetServerAddresses(addresses);
  ring->comm->SetServers(servers);
}

std::vector<std::shared_ptr<Ring>> RingBook::Stop() {
  std::vector<std::shared_ptr<Ring>> rings;
  std::map<uint64_t, std::shared_ptr<Inbox>> early;
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  rings = std::move(retired_);
  retired_.clear();
  if (ring_ != nullptr) rings.push_back(std::move(ring_));
  early.swap(early_);  // destroyed after the lock is released
  return rings;
}

}  // namespace halka
