// Has this process run? A rank that is stopped (SIGSTOP), starved of CPU or
// swapped out cannot tell from its own waits: its clock keeps running while
// it does not, and a wait that spans the stop reads as time spent waiting
// for a peer. The stall monitor is one thread per process that ticks every
// few milliseconds; a tick that comes much later than asked means the
// process did not run in between. Waits subtract the stalled time they
// overlap (OpContext::Await), so a rank's own stall is never booked as its
// predecessor's wait, and the telemetry reports the stall as the rank's own.
//
// Process-wide on purpose (Get), unlike a worker's link counters, wire
// fallbacks, shm spin and security (each WorkerNode's own): it measures
// whether the process was scheduled, which every worker the process holds
// (LocalCluster, a trainer embedding one) shares alike, and it holds no
// setting a worker could change for another.
//
// Thread-safety: thread-safe. The thread starts on first use and runs for
// the life of the process (it holds no resources but itself).
#ifndef HALKA_CORE_STALL_MONITOR_H_
#define HALKA_CORE_STALL_MONITOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <limits>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace halka {

class StallMonitor {
 public:
  // The process-wide monitor (started on the first call).
  static StallMonitor& Get();

  // Stalled time overlapping [from, to], including a stall that is only
  // now ending (the calling thread ran before the monitor's thread did).
  absl::Duration StalledBetween(absl::Time from, absl::Time to);

  // Ticks asked for, and the lateness that counts as a stall: a gap of
  // more than kTick + kSlack between ticks is a stall of (gap - kTick).
  static constexpr absl::Duration kTick = absl::Milliseconds(5);
  static constexpr absl::Duration kSlack = absl::Milliseconds(25);

 private:
  StallMonitor() = default;
  void Run();
  struct Interval {
    absl::Time from, to;
  };
  absl::Mutex mu_;
  absl::Time last_tick_ ABSL_GUARDED_BY(mu_);
  // For StalledBetween's look without the lock (it runs at every wait of
  // every operation in the process): last_tick_ and the newest stall's end,
  // in Unix nanoseconds, stored by Run, the stall's end before the tick.
  std::atomic<int64_t> last_tick_ns_{0};
  std::atomic<int64_t> newest_stall_end_ns_{std::numeric_limits<int64_t>::min()};
  std::deque<Interval> stalls_ ABSL_GUARDED_BY(mu_);  // bounded, oldest first
};

}  // namespace halka

#endif  // HALKA_CORE_STALL_MONITOR_H_
