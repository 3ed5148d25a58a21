// The worker's side of the rendezvous: Join (and join again after being
// lost), heartbeats with telemetry, the Watch stream, broken-link reports
// and parameter-server lookups. Membership changes reach the worker by
// callback; the link holds no ring state of its own.
//
// Threads: Start() runs three: heartbeat, watch, and background (reports
// and re-joins). Callbacks run on those threads, never under the link's
// mutex, which is a leaf (it guards flags and the set of calls to cancel).
#ifndef HALKA_WORKER_RENDEZVOUS_LINK_H_
#define HALKA_WORKER_RENDEZVOUS_LINK_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "halka/v1/rendezvous.grpc.pb.h"
#include "core/communicator.h"
#include "worker/ring_book.h"
#include "worker/worker_options.h"

namespace halka {

class RendezvousLink {
 public:
  struct Callbacks {
    // A membership from Join, Watch or a heartbeat reply (any generation:
    // the callee ignores old ones).
    std::function<void(const v1::Membership&)> on_membership;
    // The rendezvous declared this worker lost (FAILED_PRECONDITION on a
    // heartbeat); the link joins again by itself.
    std::function<void(const std::string& why)> on_declared_lost;
    // What a heartbeat carries.
    std::function<v1::WorkerTelemetry()> telemetry;
    std::function<uint64_t()> known_generation;
    // The newest membership this worker holds: what the Watch stream's
    // first delta is against.
    std::function<v1::Membership()> latest;
    // The membership to claim when the rendezvous forgot the job.
    std::function<std::optional<v1::Membership>()> claimable;
  };

  // `log`: the worker's (outlives the link).
  RendezvousLink(const WorkerOptions& options, const Logger& log,
                 std::string address, uint64_t incarnation,
                 Callbacks callbacks);
  ~RendezvousLink();  // Stop()s

  // Joins (or joins again), retrying while the rendezvous is unreachable
  // or still holds this worker's previous process, until `deadline`.
  // Errors: the rendezvous's join errors, prefixed with who and where;
  // UNAVAILABLE when stopping.
  absl::Status Join(absl::Time deadline, v1::JoinReply* reply);
  // Starts the heartbeat (first beat at once), watch and background threads.
  void Start(absl::Duration heartbeat_interval);
  // Stops the threads and cancels every call in flight (bounded).
  void Stop();
  // Leaves the job (best effort, 300 ms).
  void Leave();

  // Queues a broken-link report (sent by the background thread).
  void Report(LinkReport report);
  // Asks the background thread to join again (this worker is out).
  void RequestRejoin();
  // This worker's probe of its ring links (Membership.probe_links): it
  // rides every heartbeat while its generation is the one the heartbeat
  // names, the first one at once.
  void ReportLinkProbe(v1::LinkProbe probe);

  // One heartbeat now, for a worker that saw a peer run a newer
  // generation; the newer membership, if the rendezvous has one.
  std::optional<v1::Membership> FetchMembership(uint64_t known);
  // One lookup of the job's parameter-server shards (2 s).
  absl::StatusOr<std::vector<PeerInfo>> LookupServers(std::string* message);
  // Forwards a ring-health query (5 s).
  grpc::Status GetRingHealth(const v1::RingHealthRequest& req,
                             v1::RingHealth* reply);
  bool stopped() const { return stop_.HasBeenNotified(); }
  // The host this worker names (worker/host_identity.h).
  const std::string& host() const { return host_; }

  // The outcome of this worker's last operation changed (a success after a
  // failure, or the reverse): a heartbeat goes now, not at the next
  // interval, so that the rendezvous's verdict (RingHealth.failing) is
  // current when the caller gets the result. Bounded: requests coalesce
  // into one beat, and a beat already in flight (its telemetry read
  // before the change) is followed by exactly one more. Waits until a beat
  // that carries the change was answered, at most one heartbeat interval
  // (and 1 s); returns at once before Start and after Stop.
  void BeatNow();

 private:
  void HeartbeatLoop(absl::Duration interval);
  // Waits up to `interval` (less when BeatNow asks); false when stopping.
  bool AwaitBeat(absl::Duration interval);
  // One heartbeat; what the loop does next.
  enum class Next { kWait, kAgain, kStop };
  Next Beat(absl::Duration interval);
  // After a failed beat: claims, rejoins, or retries soon.
  Next OnBeatError(const grpc::Status& s, bool claiming, uint64_t generation,
                   absl::Duration interval);
  void WatchLoop();
  void BackgroundLoop();
  void SendReport(const LinkReport& report);
  // A heartbeat of this worker that knows `generation`.
  v1::HeartbeatRequest HeartbeatAt(uint64_t generation) const;
  // Registers a call so that Stop can cancel it; false when stopping.
  bool Track(grpc::ClientContext* ctx);
  void Untrack(grpc::ClientContext* ctx);

  const WorkerOptions& options_;
  const Logger& log_;
  const std::string address_;
  const uint64_t incarnation_;
  const std::string host_;
  const Callbacks callbacks_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool rejoin_ ABSL_GUARDED_BY(mu_) = false;
  bool claim_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<LinkReport> reports_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::LinkProbe> probe_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  // BeatNow: the heartbeat thread runs (Start), the interval, the prompt
  // beats asked for so far and the newest of them a completed beat carried.
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration interval_ ABSL_GUARDED_BY(mu_);
  uint64_t beats_wanted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t beats_done_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Notification stop_;
  std::thread heartbeat_;
  std::thread watch_;
  std::thread background_;
};

}  // namespace halka

#endif  // HALKA_WORKER_RENDEZVOUS_LINK_H_
