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
      m->last_tick_ns_.store(absl::ToUnixNanos(m->last_tick_));
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
      newest_stall_end_ns_.store(absl::ToUnixNanos(now),
                                 std::memory_order_release);
    }
    last_tick_ = now;
    last_tick_ns_.store(absl::ToUnixNanos(now), std::memory_order_release);
  }
}

absl::Duration StallMonitor::StalledBetween(absl::Time from, absl::Time to) {
  const absl::Time now = halka::Now();
  {
    // Without the lock, what it would find in the common case: every stall
    // ended by `from` and the monitor's thread ticking. The tick is read
    // first: a stall stored with (before) a tick read here is seen.
    const absl::Time tick = absl::FromUnixNanos(
        last_tick_ns_.load(std::memory_order_acquire));
    const int64_t newest =
        newest_stall_end_ns_.load(std::memory_order_acquire);
    if (newest <= absl::ToUnixNanos(from) && now - tick <= kTick + kSlack) {
      return absl::ZeroDuration();
    }
  }
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
