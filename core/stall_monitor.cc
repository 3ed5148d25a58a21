#include "core/stall_monitor.h"

#include <algorithm>
#include <thread>

#include "common/clock.h"

namespace halka {
namespace {

constexpr size_t kMaxStalls = 4096;
constexpr absl::Duration kKeep = absl::Minutes(10);

absl::Duration Overlap(absl::Time a0, absl::Time a1, absl::Time b0,
                       absl::Time b1) {
  const absl::Time lo = std::max(a0, b0);
  const absl::Time hi = std::min(a1, b1);
  return hi > lo ? hi - lo : absl::ZeroDuration();
}

}  // namespace

StallMonitor& StallMonitor::Get() {
  static StallMonitor* monitor = [] {
    auto* m = new StallMonitor();
    {
      absl::MutexLock lock(&m->mu_);
      m->last_tick_ = halka::Now();
    }
    std::thread([m] { m->Run(); }).detach();
    return m;
  }();
  return *monitor;
}

void StallMonitor::Run() {
  for (;;) {
    absl::SleepFor(kTick);
    const absl::Time now = halka::Now();
    absl::MutexLock lock(&mu_);
    if (now - last_tick_ > kTick + kSlack) {
      stalls_.push_back({last_tick_ + kTick, now});
      while (stalls_.size() > kMaxStalls ||
             (!stalls_.empty() && stalls_.front().to < now - kKeep)) {
        stalls_.pop_front();
      }
    }
    last_tick_ = now;
  }
}

absl::Duration StallMonitor::StalledBetween(absl::Time from, absl::Time to) {
  const absl::Time now = halka::Now();
  absl::MutexLock lock(&mu_);
  absl::Duration d;
  for (const Interval& s : stalls_) d += Overlap(s.from, s.to, from, to);
  // The monitor's thread has not run since last_tick_: if that is long ago,
  // this process is just resuming from a stall the thread has not seen.
  if (now - last_tick_ > kTick + kSlack) {
    d += Overlap(last_tick_ + kTick, now, from, to);
  }
  return d;
}

}  // namespace halka
