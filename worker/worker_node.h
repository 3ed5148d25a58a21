// One halka worker: its lifecycle (serve, join, shut down) and how a call
// runs (numbering, re-runs after a membership change, parameter-server
// lookup). The parts live next to it: worker_service (the SDK-facing
// gRPC adapter), rendezvous_link (join, heartbeats, watch, reports),
// ring_book (rings per generation; numbering.h has the numbering rule),
// shm_cache, worker_metrics. docs/thread_model.md has the threads and
// the lock order.
#ifndef HALKA_WORKER_WORKER_NODE_H_
#define HALKA_WORKER_WORKER_NODE_H_

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "halka/v1/worker.pb.h"
#include "common/http_server.h"
#include "core/communicator.h"
#include "worker/numbering.h"
#include "worker/rendezvous_link.h"
#include "worker/ring_book.h"
#include "worker/shm_reaper.h"
#include "transport/tcp/wire_link.h"
#include "worker/worker_options.h"

namespace halka {

class InProcessWorker;
class PeerService;
class WorkerService;
class DeviceContext;
class OpBuffer;

class WorkerNode {
 public:
  // Starts the server, then joins (blocking until the job forms or
  // join_timeout passes). Errors: UNAVAILABLE (cannot listen or reach the
  // rendezvous), DEADLINE_EXCEEDED (the job did not form; names who is
  // missing), and the rendezvous's join errors.
  static absl::StatusOr<std::unique_ptr<WorkerNode>> Start(WorkerOptions options);

  // Two phases, for callers that must learn the address before joining
  // (LocalCluster): Create binds and serves; Join joins.
  static absl::StatusOr<std::unique_ptr<WorkerNode>> Create(
      WorkerOptions options);
  absl::Status Join();

  ~WorkerNode();

  // Leaves the job (best effort, bounded) and stops serving; well under a
  // second. leave=false skips the Leave, as if the process had died.
  void Shutdown(bool leave = true);
  void Wait();

  // A call as it reaches the worker. Every call the worker receives is
  // numbered in arrival order: it runs, or is refused, in that order and
  // takes one operation number either way, so that one rank's refused or
  // abandoned call cannot split the ring's numbering.
  struct Arrival {
    uint64_t ticket = 0;
    absl::Time at;
    uint64_t epoch = 0;  // the ring book's epoch at arrival
  };
  Arrival Arrive();

  // Runs one collective on `data` (host memory). Thread-safe; operations
  // are serialised in arrival order. The deadline (the spec's timeout_ms,
  // or options().op_timeout) counts from the arrival. Errors: those of
  // ValidateOpSpec, then the failure contract of Communicator.
  absl::StatusOr<OpResult> Execute(const v1::OpSpec& spec, void* data);
  absl::StatusOr<OpResult> Execute(const v1::OpSpec& spec, void* data,
                                   const Arrival& arrival);
  // The same on a client's CUDA tensor. FAILED_PRECONDITION without a GPU.
  absl::StatusOr<OpResult> ExecuteOnDevice(const v1::OpSpec& spec,
                                           const v1::DeviceTensor& tensor,
                                           const Arrival& arrival);
  // A call that ends before it reaches the ring (a refused request, an
  // upload that failed or was abandoned): in its turn it takes its number
  // and tells the peers, whose copies of the call then fail at once naming
  // this rank and `status`; a call made before this worker re-joined its
  // ring (IsStaleCall) takes none. Returns `status`.
  // `spec`: the call's request when it was read (its caller's order, see
  // OpSpec.call_index), else null.
  absl::Status Refuse(const Arrival& arrival, absl::Status status,
                      const v1::OpSpec* spec = nullptr);

  // What GetTimeline answers. FAILED_PRECONDITION before it joined.
  absl::StatusOr<v1::Timeline> Timeline() const;

  // What GetInfo answers: this worker's rank, ring and newest membership.
  // FAILED_PRECONDITION before it joined.
  absl::StatusOr<v1::InfoReply> Describe() const;
  // Forwards a ring-health query to the rendezvous (the job defaults to
  // this worker's).
  grpc::Status GetRingHealth(v1::RingHealthRequest req, v1::RingHealth* reply);

  const std::string& address() const { return address_; }
  // The wire listener's port (0: no wire links).
  int wire_port() const { return wire_listener_ ? wire_listener_->port() : 0; }
  int rank() const;
  int world_size() const;
  Communicator* communicator();
  // Its options; options().security is set (captured by Create).
  const WorkerOptions& options() const { return options_; }
  // What this worker's peer links did (its own, also when workers share a
  // process): the paths they took, landed frames, evicted connections,
  // missed wake-ups. /metrics exports them.
  const LinkCounters& link_counters() const { return *counters_; }
  // The peers this worker's wire links could not reach lately (links to
  // them stay on gRPC for a minute).
  WireFallbacks& wire_fallbacks() { return *wire_fallbacks_; }
  // This worker's log lines: "[worker ID rank R]" (its own, also when
  // workers share a process).
  const Logger& log() const { return log_; }
  int open_peer_streams() const;
  // "host:port" of /metrics; "" when off.
  std::string metrics_address() const;
  // The Prometheus text this worker serves at /metrics.
  std::string MetricsText();

 private:
  explicit WorkerNode(WorkerOptions options);
  // Create's parts: the wire listener (with wire_links) and the peer
  // service; the CUDA device, when one is asked for or compiled in.
  absl::Status ServePeerLinks();
  absl::Status OpenDevice();

  // A newer membership (from Join, Watch or a heartbeat): records it and
  // aborts the running operation when it cannot finish (a member was lost)
  // or has not started moving data (it is then run again on the new ring).
  void OnMembership(const v1::Membership& m);
  // Fetches the membership at once when a peer already opened links of a
  // newer generation than the newest update this worker received.
  void CatchUp();
  void OnLinkFailed(uint64_t generation, int peer, const absl::Status& status);
  // The collective `spec` on `comm` (the job's or a group's).
  absl::StatusOr<OpResult> RunOn(Communicator* comm, const v1::OpSpec& spec,
                                 OpBuffer& buffer, absl::Time deadline);
  absl::StatusOr<OpResult> Run(const v1::OpSpec& spec, OpBuffer& buffer,
                               const Arrival& arrival);
  // A SEND or RECV: takes its turn and the current ring, then runs
  // outside the turn (beside later calls) and the collectives' numbering.
  absl::StatusOr<OpResult> RunPeer(const v1::OpSpec& spec, OpBuffer& buffer,
                                   const Arrival& arrival)
      ABSL_LOCKS_EXCLUDED(run_mu_);
  // A collective of a group (OpSpec.group_ranks) on the group's ring in
  // the job's current ring: beside the job's collectives, numbered by the
  // group. With `refused` not OK (and a null buffer), the call is refused
  // and gives its number in the group up (SkipOp). Errors name the group.
  absl::StatusOr<OpResult> RunGroup(const v1::OpSpec& spec, OpBuffer* buffer,
                                    const Arrival& arrival,
                                    absl::Status refused = absl::OkStatus())
      ABSL_LOCKS_EXCLUDED(run_mu_);
  absl::StatusOr<OpResult> RunGroup(const v1::OpSpec& spec, OpBuffer& buffer,
                                    const Arrival& arrival)
      ABSL_LOCKS_EXCLUDED(run_mu_) {
    return RunGroup(spec, &buffer, arrival);
  }
  // The ring a call that takes no number of the job's runs on: the current
  // one at once, passing its turn (PassTurn), or, when none is ready, in
  // its turn the one the next collective would run on. With `needed`
  // false it only passes its turn (and returns null). A call stale on that
  // ring (`issued` before this worker re-joined it) is refused (ABORTED).
  absl::StatusOr<std::shared_ptr<Ring>> RingBeside(const Arrival& arrival,
                                                   bool needed,
                                                   absl::Time issued)
      ABSL_LOCKS_EXCLUDED(run_mu_);
  absl::StatusOr<OpResult> RunInTurn(const v1::OpSpec& spec, OpBuffer& buffer,
                                     const Arrival& arrival)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // Waits until `ticket` is the next call to run.
  void AwaitTurn(uint64_t ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // The running call's turn is over: the next ticket's comes (and those of
  // the send/recv calls that passed theirs, see PassTurn).
  void NextTurn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // Moves turn_ past the tickets that passed their turn.
  void AbsorbPassed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // A send or recv that runs without waiting for its turn gives its ticket
  // up, so that the calls after it do not wait for it (not under run_mu_).
  void PassTurn(uint64_t ticket) ABSL_LOCKS_EXCLUDED(run_mu_);
  // Takes the next number for a call that does not reach the ring (on a
  // ring that still adopts, the peers' number, learnt by `deadline`), on
  // the ring of the newest membership: the one the peers run that call on.
  // Returns the number taken (seq 0: none) and the generation of the ring
  // whose numbering it came from. `issued`: when its caller issued it
  // (IssuedAt); a call stale on that ring (made before this worker
  // re-joined it) takes no number: it belongs to none of the ring's
  // operations, and the one its peers run next pairs with this worker's
  // next call.
  struct Taken {
    uint64_t seq = 0;
    uint64_t generation = 0;
  };
  Taken SkipNumber(const absl::Status& status, const Arrival& arrival,
                   absl::Time deadline, absl::Time issued)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // In the call's turn, before it is numbered: its place in its caller's
  // order (numbering.h PlaceInCallerOrder). Gives up the numbers of the
  // caller's calls that never arrived; ABORTED for a call that arrived
  // after a later one (it must take no number).
  absl::Status TakeCallerPlace(const v1::OpSpec* spec, const Arrival& arrival,
                               absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // Records the caller's place once its call took number `seq` (0: none
  // known) on `generation`'s ring.
  void NoteCallerPlace(const v1::OpSpec* spec, Taken taken)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // A call as the ring book sees it: `seq` where this worker keeps the
  // numbering, and the generation of its ring when that ring holds one.
  CallInfo NewCall(uint64_t seq, const Arrival& arrival, absl::Time issued);
  void RecordCall(uint64_t seq, const absl::Status& status);
  // Looks up the job's parameter-server shards (waiting for them, bounded
  // by `deadline`) and hands them to the ring.
  absl::Status EnsureServers(absl::Time deadline);
  v1::WorkerTelemetry CollectTelemetry();

  WorkerOptions options_;
  Logger log_;
  const uint64_t incarnation_;
  // Shared with the book's transports and inboxes, the peer service and
  // the wire listener; declared after log_, which the fallbacks log to.
  const std::shared_ptr<LinkCounters> counters_;
  const std::shared_ptr<WireFallbacks> wire_fallbacks_;
  std::string address_;
  // Before peer_service_ and server_: destroyed after them (their streams
  // hold its tokens). Null: no wire links.
  std::unique_ptr<WireListener> wire_listener_;
  std::unique_ptr<PeerService> peer_service_;
  std::unique_ptr<WorkerService> api_service_;
  std::shared_ptr<InProcessWorker> in_process_;  // closed by Shutdown
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<DeviceContext> device_;  // null: host tensors only
  std::unique_ptr<RingBook> book_;
  std::unique_ptr<RendezvousLink> link_;
  std::unique_ptr<ShmReaper> shm_reaper_;  // null: not sweeping

  // One operation at a time, across generations. Taken before the book's
  // and the link's locks, never under them.
  absl::Mutex run_mu_;
  // The caller's calls are numbered one by one, failed or not, so that
  // every rank numbers the i-th call alike (0: adopt the ring's number).
  uint64_t next_seq_ ABSL_GUARDED_BY(run_mu_) = 1;
  // Calls take tickets as they arrive and run when their ticket's turn
  // comes (each call before them is bounded by its own deadline).
  std::atomic<uint64_t> tickets_{0};
  uint64_t turn_ ABSL_GUARDED_BY(run_mu_) = 1;
  // Tickets of sends and recvs that ran beside the running call instead of
  // in their turn (PassTurn); turn_ skips them as it reaches them. Taken
  // under run_mu_ or alone, never the other way round.
  absl::Mutex passed_mu_ ABSL_ACQUIRED_AFTER(run_mu_);
  std::set<uint64_t> passed_ ABSL_GUARDED_BY(passed_mu_);
  uint64_t running_seq_ ABSL_GUARDED_BY(run_mu_) = 0;  // the running call's
  // The number the running call took where this worker knew it before the
  // ring ran (0: none, or adopted from the peers), and that ring's
  // generation: the caller's place once the call ends.
  Taken taken_ ABSL_GUARDED_BY(run_mu_);
  CallerPlace caller_ ABSL_GUARDED_BY(run_mu_);
  // The last call's number and outcome, for telemetry (a leaf lock).
  absl::Mutex calls_mu_ ABSL_ACQUIRED_AFTER(run_mu_);
  uint64_t calls_received_ ABSL_GUARDED_BY(calls_mu_) = 0;
  uint64_t last_call_seq_ ABSL_GUARDED_BY(calls_mu_) = 0;
  bool last_call_recorded_ ABSL_GUARDED_BY(calls_mu_) = false;
  bool last_call_ok_ ABSL_GUARDED_BY(calls_mu_) = true;
  std::string last_call_error_ ABSL_GUARDED_BY(calls_mu_);
  absl::Mutex servers_mu_ ABSL_ACQUIRED_AFTER(run_mu_);
  bool have_servers_ ABSL_GUARDED_BY(servers_mu_) = false;

  // Running operations that a change in which members only left spared
  // (OnMembership): each is aborted after kLeaverGrace if it still runs
  // on that ring (a receive from a leaver that never sent, an operation
  // whose leaver's links never broke on this rank). One thread, started
  // at the first such change, joined by Shutdown.
  static constexpr absl::Duration kLeaverGrace = absl::Seconds(3);
  struct SparedOp {
    absl::Time at;
    std::weak_ptr<Ring> ring;
    absl::Status status;
  };
  void SpareRunningOp(std::shared_ptr<Ring> ring, absl::Status status);
  void AbortSparedOps();
  absl::Mutex spared_mu_;
  std::vector<SparedOp> spared_ ABSL_GUARDED_BY(spared_mu_);
  bool spared_stop_ ABSL_GUARDED_BY(spared_mu_) = false;
  std::thread spared_thread_;

  // Membership.probe_links: the newest generation whose ring links the
  // rendezvous asked this worker to probe (worker/link_probe.h), and the
  // last one probed. One thread, started at the first ask, joined by
  // Shutdown: it waits for that generation's ring (built at the caller's
  // first call after a change), probes beside the caller's calls, and
  // hands the result to the rendezvous link.
  void RequestProbe(uint64_t generation);
  void ProbeLoop();
  // Join's wait, when the ring formed at generation `formed` asks for
  // probes: until the rendezvous publishes the measured model (a newer
  // generation, same members) or says the probe is over, at most
  // kProbeJoinWait (its probe_wait after the first report, and the probe
  // itself), so that no call runs on a ring that is replaced at once
  // (a group collective or a receive in flight across the change would
  // fail). True when a newer generation came.
  bool AwaitMeasuredModel(uint64_t formed);
  static constexpr absl::Duration kProbeJoinWait = absl::Seconds(45);
  absl::Mutex probe_mu_;
  uint64_t probe_wanted_ ABSL_GUARDED_BY(probe_mu_) = 0;
  uint64_t probe_done_ ABSL_GUARDED_BY(probe_mu_) = 0;
  bool probe_stop_ ABSL_GUARDED_BY(probe_mu_) = false;
  std::thread probe_thread_;

  bool shut_down_ = false;
};

}  // namespace halka

#endif  // HALKA_WORKER_WORKER_NODE_H_
