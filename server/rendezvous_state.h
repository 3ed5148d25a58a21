// The rendezvous's membership logic as a pure state machine: no threads, no
// clock of its own (every call takes `now`), no gRPC. The service wraps it
// in a mutex and waits on it.
//
// A job has a world size range [min, max] (min == max: a fixed job). It
// forms when max workers have joined, or, for an elastic job, when at least
// min have joined and nobody else joined for `elastic_settle`. Ranks asked
// for by workers (StatefulSet ordinals) are honoured, the rest are filled
// in join order, and the generation becomes 1. Ranks are the users'; the
// ring's path is the host order (host_ring.h): each host's ranks adjacent,
// published with every view (MembershipView::ring_order).
//
// Every membership change bumps the generation by one:
//  - a member is lost (missed heartbeat deadline, Leave, a restart under
//    the same worker id, a confirmed broken-link report). When at least min
//    members remain, the survivors re-form at once with ranks 0..G-1
//    (survivors keep their rank where it still fits); below min the job is
//    waiting and keeps the lost members as placeholders (alive=false);
//  - newcomers are admitted (up to max): at once while the job is below
//    min or the ring would be full, otherwise once joins settle. The
//    workers switch generations between operations, never in the middle
//    of one.
//
// Liveness: a member is lost when it has not heartbeated for the heartbeat
// timeout, counted from the later of its last heartbeat and the grace the
// rendezvous granted it: when it entered the ring (a member blocked in
// Join cannot heartbeat), when its Join reply reached it (thousands of
// replies take a while to send), and when a blackout ended (the whole job silent
// for more than half the timeout means this rendezvous was cut off; the
// first heartbeat after it gives every member a full timeout from then).
// Thread-safety: none; the caller serialises.
#ifndef HALKA_SERVER_RENDEZVOUS_STATE_H_
#define HALKA_SERVER_RENDEZVOUS_STATE_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "halka/types.h"
#include "core/cost_model.h"
#include "core/host_ring.h"

namespace halka {

// The reason Lose records for a member that called Leave (Member.left).
inline constexpr char kLeftReason[] = "left";

struct RendezvousOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // Elastic jobs: how long joins must pause before a ring of fewer than
  // max members forms or grows (batches restarts into one change).
  absl::Duration elastic_settle = absl::Seconds(1);
  int max_jobs = 4096;
  int max_world_size = 4096;
  // The Join answers of a forming ring go out in waves: at most this many
  // answered members that have not yet sent their first heartbeat (0: all
  // at once). A member's answer, its first beat and its Watch open cost
  // both sides a few hundred microseconds each; N of them in one burst
  // queue every beat of that second behind the burst (p99 300 ms at 1,024
  // members on 2 cores), while waves keep it to one window's worth.
  int join_answer_window = 64;
  // A member answered this long ago without a beat stops holding its
  // place in the window (old workers beat only after one interval).
  absl::Duration join_answer_ack_wait = absl::Milliseconds(100);
  // The link model every job's memberships carry (Membership.link_model;
  // --link_model): auto ranks by it on every rank. Unset: none.
  std::optional<LinkModel> link_model;
  // --link_model=probe (no link_model): every generation whose members the
  // job's model was not measured with asks its members to probe their
  // ring links (MembershipView::probe_links); once every live member
  // reported (ReportLinkProbe), or probe_wait after the first report, the
  // medians become the job's measured model, published as the next
  // generation with the same members and ranks.
  bool probe_links = false;
  absl::Duration probe_wait = absl::Seconds(30);
  // Non-zero: a model measured this long ago is measured again while the
  // members stay (--link_probe_every): Sweep moves the generation on with
  // probe_links set, and the reports publish the next one.
  absl::Duration probe_every = absl::ZeroDuration();
};

// One member's probe of its ring links (halka.v1.LinkProbe).
struct LinkProbeReport {
  uint64_t generation = 0;
  LevelCost local;
  int local_edges = 0;
  LevelCost net;
  int net_edges = 0;
  std::string error;  // "": the probe ran
};

struct JoinArgs {
  std::string job_id;
  std::string worker_id;
  std::string address;
  std::string device;
  int world_size = 0;      // a fixed job; ignored when max_world_size > 0
  int min_world_size = 0;  // elastic: both set
  int max_world_size = 0;
  int requested_rank = -1;  // -1: any
  uint64_t incarnation = 0; // 0: unknown (a retried join is idempotent)
  std::string host;         // the host it runs on; "": unknown
};

// A job's membership state: halka::JobState (halka/types.h; values match
// halka.v1.JobState, the service converts by value). While kWaiting the
// lost members stay as placeholders.

// What a worker learns when its job forms, and what health reports.
struct MemberView {
  int rank = -1;
  std::string worker_id;
  std::string address;
  std::string device;
  bool alive = true;
  absl::Duration heartbeat_age;
  std::string telemetry;  // opaque to the state (serialised by the service)
  uint64_t since_generation = 0;
  std::string host;       // "": unknown
  bool left = false;      // in MembershipView::lost: left by its own Leave
};

// One generation of a job.
struct MembershipView {
  JobState state = JobState::kUnspecified;
  uint64_t generation = 0;
  int world_size = 0;      // members of the current ring
  int min_world_size = 0;
  int max_world_size = 0;
  std::vector<MemberView> members;  // ring order; kWaiting: placeholders
  std::string change;               // why the generation last changed
  std::vector<MemberView> lost;     // lost in the last change
  // The ring's path (host_ring.h): ring_order[p] is the rank at ring
  // position p (empty: rank order); the hosts in ring order (empty: no
  // member named one). Empty while forming.
  std::vector<int> ring_order;
  std::vector<HostGroup> hosts;
  // RendezvousOptions::link_model, or the job's measured model
  // (RendezvousOptions::probe_links).
  std::optional<LinkModel> link_model;
  // The members are asked to probe their links (RendezvousOptions::
  // probe_links) on this generation's ring.
  bool probe_links = false;
};

struct Assignment {
  int rank = -1;
  MembershipView view;
};

struct HeartbeatResult {
  uint64_t generation = 0;
  std::vector<int> dead_ranks;
};

// A worker's claim of its ring, sent after the rendezvous restarted.
struct RingClaim {
  uint64_t generation = 0;
  int min_world_size = 0;
  int max_world_size = 0;
  std::vector<MemberView> members;  // ring order
  // The link model the claimed generation ran with (Membership.link_model).
  std::optional<LinkModel> link_model;
  // The claimed generation asked its members to probe (Membership.
  // probe_links): its model is the one measured before its members.
  bool probe_links = false;
};

class RendezvousState {
 public:
  explicit RendezvousState(RendezvousOptions options = {});

  // Registers a worker. Errors: INVALID_ARGUMENT (empty ids/address,
  // sizes out of range, requested rank outside the world, a host over 256
  // bytes),
  // FAILED_PRECONDITION (sizes disagree with the job's, rank taken before
  // the job formed, job full), ALREADY_EXISTS (the same worker id is alive
  // at another address), RESOURCE_EXHAUSTED (too many jobs). Joining again
  // with the same id and incarnation is idempotent.
  absl::Status Join(const JoinArgs& args, absl::Time now);

  // The worker's assignment once it is a member of the job's running ring;
  // nullopt while it waits (to form, to be admitted, for min members).
  std::optional<Assignment> GetAssignment(const std::string& job_id,
                                          const std::string& worker_id) const;
  // The same in two parts, so that a service answering many blocked Joins
  // builds the view once per generation: the worker's rank in the running
  // ring (-1 while it waits; O(1)), and the view every member is told
  // (nullopt while no ring runs).
  int AssignedRank(const std::string& job_id,
                   const std::string& worker_id) const;
  std::optional<MembershipView> AssignmentView(const std::string& job_id) const;
  bool HasJob(const std::string& job_id) const { return jobs_.count(job_id); }
  // Which creation of the job this is (0: none): a job forgotten and
  // created again under the same id restarts its generations, so a cache
  // keyed by generation must also key by this.
  uint64_t JobEpoch(const std::string& job_id) const {
    auto it = jobs_.find(job_id);
    return it == jobs_.end() ? 0 : it->second.epoch;
  }

  // The worker's Join reply has reached it (the call completed): its
  // heartbeat timeout counts from `now` at the earliest. No-op for a worker
  // that is not a live member.
  void JoinReturned(const std::string& job_id, const std::string& worker_id,
                    absl::Time now);

  // Withdraws a pending (not yet admitted) join, e.g. after the joiner
  // gave up waiting.
  void WithdrawPending(const std::string& job_id, const std::string& worker_id);

  // "job J: 2 of 4 joined (w0 at a0, w1 at a1); 2 missing". Names the
  // members only while there are at most `max_listed` of them ("job J: 600
  // of 1024 joined; 424 missing"), so a log line per Join stays short.
  std::string DescribeForming(const std::string& job_id,
                              size_t max_listed = SIZE_MAX) const;

  // The first heartbeat from a job that was silent as a whole for more
  // than half the heartbeat timeout ends a blackout: every live member
  // gets a full timeout from `now`.
  // Errors: NOT_FOUND (job or worker unknown), FAILED_PRECONDITION
  // (the worker was lost or left: it must join again).
  absl::StatusOr<HeartbeatResult> Heartbeat(const std::string& job_id,
                                            const std::string& worker_id,
                                            const std::string& telemetry,
                                            absl::Time now);

  // Re-creates a job the rendezvous forgot (it restarted) from a member's
  // claim, at the claimed generation (the next one when the claimed ring
  // ran with another link model than options().link_model), every claimed
  // member alive as of `now`. No-op when the job exists. Errors:
  // INVALID_ARGUMENT (a claim that is not a ring), RESOURCE_EXHAUSTED.
  // A member of `job_id` holds `held`, a generation newer than the job's
  // (the job was restored from a claim older than the ring the previous
  // rendezvous last published): the job moves past both, to held + 1, so
  // that every member, whichever ring it holds, gets the next membership.
  // True when it moved (publish it).
  bool CatchUp(const std::string& job_id, const std::string& worker_id,
               uint64_t held);

  absl::Status Restore(const std::string& job_id, const RingClaim& claim,
                       absl::Time now);

  // A member's probe of its ring links (RendezvousOptions::probe_links).
  // Ignored (returns "") unless it is a live member, the report is of the
  // current generation, and that generation asked for probes. Once every
  // live member has reported, the job's model becomes, per level, the
  // median of the members' values that measured it, and the generation
  // moves on (same members and ranks) to publish it: returns the change
  // line then (publish it), else "". Sweep does the same probe_wait after
  // the first report with what has come. Probes that measured no link
  // publish the next generation too (probe_links off, the model as it
  // was), so that members waiting for the end of the probe go on.
  std::string ReportLinkProbe(const std::string& job_id,
                              const std::string& worker_id,
                              const LinkProbeReport& report, absl::Time now);

  // Errors: NOT_FOUND.
  absl::Status Leave(const std::string& job_id, const std::string& worker_id,
                     absl::Time now);

  // Declares a member of the current generation lost (e.g. a broken link
  // that a probe confirmed). Errors: NOT_FOUND; FAILED_PRECONDITION when
  // `generation` is not the current one (the report is stale).
  absl::Status DeclareLost(const std::string& job_id,
                           const std::string& worker_id, uint64_t generation,
                           const std::string& reason, absl::Time now);

  // Declares lost every member silent for longer than the timeout (counted
  // as the class comment says; one generation bump per job per sweep),
  // forms and grows elastic rings whose joins settled, and drops jobs
  // nobody is in. A late
  // member is declared lost only while another member of its job was heard
  // within half the heartbeat timeout: when the whole job is silent (this
  // rendezvous is partitioned away, or the job ended) nobody is declared
  // lost, and the job is forgotten after 10 heartbeat timeouts of silence.
  // Returns one line per change.
  std::vector<std::string> Sweep(absl::Time now);

  // Errors: NOT_FOUND.
  absl::StatusOr<MembershipView> Health(const std::string& job_id,
                                        absl::Time now) const;
  uint64_t Generation(const std::string& job_id) const;
  // The address of a member of the current ring ("" if none).
  std::string AddressOf(const std::string& job_id,
                        const std::string& worker_id) const;

  // Parameter-server shards of a job, which may register before or after
  // the workers. Errors: INVALID_ARGUMENT, FAILED_PRECONDITION (shard
  // count differs from an earlier registration), RESOURCE_EXHAUSTED.
  absl::Status RegisterServer(const std::string& job_id,
                              const std::string& server_id,
                              const std::string& address, int shard,
                              int shards, absl::Time now);
  // Every shard in order, or NOT_FOUND saying which are missing.
  absl::StatusOr<std::vector<MemberView>> LookupServers(
      const std::string& job_id, absl::Time now) const;

  // What changed since the last call, one line per generation change
  // ("job J: generation 4->5: rank 2 (w2, addr) lost: ...").
  std::vector<std::string> TakeEvents() { return std::move(events_); }

  const RendezvousOptions& options() const { return options_; }
  // Every job the rendezvous knows, in id order.
  std::vector<std::string> JobIds() const {
    std::vector<std::string> ids;
    for (const auto& [id, job] : jobs_) ids.push_back(id);
    return ids;
  }

 private:
  struct Member {
    std::string worker_id;
    std::string address;
    std::string device;
    int requested_rank = -1;
    int rank = -1;
    bool alive = true;
    absl::Time last_heartbeat;
    // Grace: the timeout is not counted before this (entering the ring,
    // the end of a blackout).
    absl::Time grace_from = absl::InfinitePast();
    std::string telemetry;
    uint64_t incarnation = 0;
    uint64_t since_generation = 0;
    std::string host;
    // In Job::lost: it left by its own Leave (kLeftReason).
    bool left = false;
  };
  struct Job {
    int min = 0;
    int max = 0;
    uint64_t generation = 0;  // 0 until the ring first forms
    uint64_t epoch = 0;       // see JobEpoch
    bool active = false;      // a ring of >= min live members is running
    std::vector<Member> members;  // the current ring, by rank
    // worker id -> rank in `members` (rebuilt when the ring re-forms), so
    // that a heartbeat or Join finds its member in O(1).
    std::unordered_map<std::string, int> rank_of;
    int live = 0;  // members with alive == true
    std::vector<Member> pending;  // joined, waiting for admission
    std::unordered_set<std::string> pending_ids;  // their worker ids
    std::vector<Member> lost;     // lost in the last change
    std::string change;
    absl::Time last_join;
    // The newest heartbeat from any member of the ring (InfinitePast
    // before the first): a gap of more than half the timeout is a blackout.
    absl::Time last_heard = absl::InfinitePast();
    // RendezvousOptions::probe_links: the measured model, the members it
    // was measured with (ProbeKey), this generation's reports by worker
    // id, and when the first of them came.
    std::optional<LinkModel> measured;
    std::string measured_for;
    std::map<std::string, LinkProbeReport> probes;
    uint64_t probes_generation = 0;
    absl::Time first_probe = absl::InfiniteFuture();
    absl::Time measured_at = absl::InfinitePast();  // when FinishProbe ran
  };
  bool elastic(const Job& job) const { return job.min < job.max; }
  static int Live(const Job& job) { return job.live; }
  // The live or lost member of the ring with this id; nullptr if none.
  static Member* Find(Job& job, const std::string& worker_id);
  static const Member* Find(const Job& job, const std::string& worker_id);
  // Rebuilds rank_of and live from members.
  static void Index(Job& job);
  // Marks `who` (worker ids in job.members) lost for `reasons`, bumps the
  // generation and re-forms or parks the ring. Returns the change line.
  std::string Lose(const std::string& job_id, Job& job,
                   const std::vector<std::pair<std::string, std::string>>& who,
                   absl::Time now);
  // Forms, re-forms or grows the ring when the rules allow; "" when
  // nothing changed, else the change line.
  std::string Advance(const std::string& job_id, Job& job, absl::Time now);
  // Ranks 0..G-1 for the live members plus admitted newcomers; the
  // newcomers get grace from `now` (their Join returns now).
  void Reform(Job& job, absl::Time now);
  static MemberView View(const Member& m, absl::Time now);
  // How long `m` counts as silent: since its last heartbeat or its grace.
  static absl::Duration Silence(const Member& m, absl::Time now) {
    return now - std::max(m.last_heartbeat, m.grace_from);
  }
  MembershipView ViewOf(const Job& job, absl::Time now) const;
  // The members and hosts of the ring, as one string: a model measured
  // with them holds until they change.
  static std::string ProbeKey(const Job& job);
  // Whether the current generation asks its members to probe.
  bool ProbePending(const Job& job) const;
  // The model the job's memberships carry: the operator's, else the
  // measured one (probe_links), else none.
  std::optional<LinkModel> ModelOf(const Job& job) const;
  // Makes the reports so far the job's model and publishes it as the next
  // generation (see ReportLinkProbe); returns the change line.
  std::string FinishProbe(const std::string& job_id, Job& job, absl::Time now);
  // Sweep's part: finishes a probe probe_wait after its first report, and
  // asks again for a model older than probe_every.
  void SweepProbe(const std::string& job_id, Job& job, absl::Time now,
                  bool heard);

  struct Server {
    std::string server_id;
    std::string address;
    absl::Time registered;
  };
  struct ServerSet {
    int shards = 0;
    std::map<int, Server> by_shard;
  };

  RendezvousOptions options_;
  std::map<std::string, Job> jobs_;
  std::map<std::string, ServerSet> servers_;  // by job id
  std::vector<std::string> events_;
  uint64_t epochs_ = 0;  // jobs created so far
};

// "rank 2 (worker-2, 198.18.0.3:7000)".
std::string DescribeMember(const MemberView& m);

}  // namespace halka

#endif  // HALKA_SERVER_RENDEZVOUS_STATE_H_
