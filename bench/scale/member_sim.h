// Simulated members of one job, over the real gRPC API of a rendezvous:
// each member Joins, heartbeats at once after its Join returns and then
// every interval (as halka-worker does), and optionally Watches. One
// process drives thousands of members with gRPC's callback client API and
// one driver thread (no thread per member).
//
// Used by bench/scale/scale_bench (the table in docs/performance.md) and by
// tests/integration/rendezvous_scale_test.
#ifndef HALKA_BENCH_SCALE_MEMBER_SIM_H_
#define HALKA_BENCH_SCALE_MEMBER_SIM_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace halka::scale {

struct SimOptions {
  std::string rendezvous;  // host:port (loopback)
  std::string job_id = "scale";
  int members = 64;
  int watchers = 32;  // the first `watchers` members also Watch
  // Joins are sent evenly over this span; the last member waits a further
  // `last_join_delay` (a pod that starts late).
  absl::Duration join_spread = absl::ZeroDuration();
  absl::Duration last_join_delay = absl::ZeroDuration();
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Heartbeat this long after the last Join was answered.
  absl::Duration steady = absl::Seconds(5);
  absl::Duration join_timeout = absl::Seconds(120);
  // Members per gRPC connection (the rendezvous admits 8 Watches per
  // connection; real workers have one each).
  int members_per_channel = 8;
  // Heartbeats on connections of their own (one per `members_per_channel`
  // members), apart from the Join replies and Watch updates.
  bool heartbeat_channels = false;
  // Join replies with the ring deflated and Watch updates as deltas (as
  // halka-worker asks); false: whole memberships (the wire before).
  bool compact = true;
  // At the end one member Leaves; measure until every watcher saw it.
  bool change_at_end = true;
  pid_t rendezvous_pid = 0;  // > 0: sample its threads, CPU, RSS
  std::string rendezvous_log;  // non-empty: its size when the Joins end
};

struct ProcessSample {
  double cpu_seconds = 0;  // user + system
  long rss_kib = 0;        // VmHWM (peak)
  int threads = 0;
};
// Errors: NOT_FOUND when the process is gone.
absl::StatusOr<ProcessSample> SampleProcess(pid_t pid);

struct SimResult {
  int joined = 0;
  int join_errors = 0;
  std::string first_join_error;
  absl::Duration join_time;        // first Join sent -> last answer
  absl::Duration after_last_join;  // last Join sent -> last answer
  uint64_t min_join_generation = 0;
  uint64_t max_join_generation = 0;
  int heartbeats = 0;
  int heartbeat_errors = 0;  // any status but OK (FAILED_PRECONDITION too)
  std::string first_heartbeat_error;
  int false_deaths = 0;  // members told they were lost (before the Leave)
  double heartbeat_p50_ms = 0;
  double heartbeat_p99_ms = 0;
  // Beats sent two intervals or more after the last Join was answered (the
  // formation burst over: every member's first beat) and before the Leave
  // (whose membership goes to every watcher and every member's next beat).
  double steady_p50_ms = 0;
  double steady_p99_ms = 0;
  // p99 of the beats sent in each second since the first Join.
  std::vector<double> p99_by_second_ms;
  uint64_t steady_generation = 0;  // the newest any heartbeat saw, pre-Leave
  int watchers_open = 0;  // watch streams open before the Leave
  int watchers_saw_change = 0;
  absl::Duration change_reached_all = absl::InfiniteDuration();
  // The rendezvous (when rendezvous_pid > 0): CPU used and log written up
  // to the last Join answer, and its peak thread count.
  double joins_cpu_seconds = 0;
  long joins_log_bytes = 0;
  int peak_threads = 0;
  // Bytes received: all Join replies, and all Watch messages after the
  // Leave (the change as every watcher got it).
  int64_t join_reply_bytes = 0;
  int64_t change_watch_bytes = 0;
  ProcessSample at_end;
  double sim_cpu_seconds = 0;  // this process (the simulated members)
};

// Runs the simulation; every wait is bounded by the options' durations.
SimResult RunSim(const SimOptions& options);

// A halka-rendezvous child process on 127.0.0.1 with a free port, its
// stderr (the log) in `log_path`. Stop() kills it by its id.
class RendezvousProcess {
 public:
  static absl::StatusOr<RendezvousProcess> Start(
      const std::string& binary, const std::vector<std::string>& flags,
      const std::string& log_path);
  RendezvousProcess(RendezvousProcess&& other) noexcept;
  RendezvousProcess& operator=(RendezvousProcess&&) = delete;
  ~RendezvousProcess() { Stop(); }
  void Stop();
  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }

 private:
  RendezvousProcess() = default;
  pid_t pid_ = 0;
  std::string address_;
};

}  // namespace halka::scale

#endif  // HALKA_BENCH_SCALE_MEMBER_SIM_H_
