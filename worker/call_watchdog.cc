#include "worker/call_watchdog.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "common/clock.h"

namespace halka {

CallWatchdog::CallWatchdog() : thread_([this] { Loop(); }) {}

CallWatchdog::~CallWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void CallWatchdog::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    absl::Time next = absl::InfiniteFuture();
    const absl::Time now = halka::Now();
    for (auto& [id, e] : entries_) {
      if (e.fired) continue;
      if (e.deadline <= now) {
        e.fired = true;
        e.ctx->TryCancel();
      } else {
        next = std::min(next, e.deadline);
      }
    }
    // Woken early when an entry is added (its deadline may be sooner).
    const uint64_t seen = next_id_;
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || next_id_ != seen;
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), next);
  }
}

CallWatchdog::Armed::Armed(CallWatchdog& dog, grpc::ServerContext* ctx,
                           absl::Time deadline)
    : dog_(dog), id_([&] {
        absl::MutexLock lock(&dog.mu_);
        const uint64_t id = dog.next_id_++;
        dog.entries_[id] = Entry{ctx, deadline};
        return id;
      }()) {}

CallWatchdog::Armed::~Armed() {
  absl::MutexLock lock(&dog_.mu_);
  dog_.entries_.erase(id_);
}

bool CallWatchdog::Armed::fired() const {
  absl::MutexLock lock(&dog_.mu_);
  auto it = dog_.entries_.find(id_);
  return it != dog_.entries_.end() && it->second.fired;
}

}  // namespace halka
