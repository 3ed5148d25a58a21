// Inbox's taps (core/transport.h, InboxTap): the paths whose frames a
// waiting operation takes itself, and its sleeps on them: futex words
// (same-host rings) or sockets in poll() (wire links).
#include <sched.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <optional>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "core/transport.h"

namespace halka {
namespace {

template <typename T, typename Pred>
void EraseIf(std::vector<T>& v, Pred pred) {
  v.erase(std::remove_if(v.begin(), v.end(), pred), v.end());
}

}  // namespace

void Inbox::AddTap(std::shared_ptr<InboxTap> tap) {
  absl::MutexLock lock(&taps_mu_);
  if (tap->polled() && wake_fd_.load() < 0) {
    wake_fd_.store(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  }
  EraseIf(taps_, [](const std::shared_ptr<InboxTap>& t) {
    return t->over();
  });
  taps_.push_back(std::move(tap));
}

void Inbox::RemoveTap(const InboxTap* tap) {
  absl::MutexLock lock(&taps_mu_);
  EraseIf(taps_, [tap](const std::shared_ptr<InboxTap>& t) {
    return t.get() == tap;
  });
}

std::vector<std::shared_ptr<InboxTap>> Inbox::Taps() const {
  absl::MutexLock lock(&taps_mu_);
  return taps_;
}

size_t Inbox::taps() const {
  absl::MutexLock lock(&taps_mu_);
  return taps_.size();
}

void Inbox::LeaveTapsToReaders(bool polled_only) {
  for (const auto& t : Taps()) {
    if (t->polled() || !polled_only) t->LeaveToReader();
  }
  // A group's frames come through the job's links.
  if (Inbox* job = job_inbox_.load()) job->LeaveTapsToReaders(polled_only);
}

namespace {

// Drains the taps still there, each one's sequence read first (into seqs;
// *took: a frame was taken); a tap that is over is detached and dropped
// from taps (true when one was).
bool DrainTaps(std::vector<std::shared_ptr<InboxTap>>& taps,
               std::vector<uint32_t>& seqs, bool* took) {
  bool pruned = false;
  for (size_t i = 0; i < taps.size(); ++i) {
    if (taps[i] == nullptr) continue;
    seqs[i] = taps[i]->Seq();
    if (!taps[i]->Drain(took)) {  // over: forgotten by the caller
      taps[i]->Attach(false);
      taps[i] = nullptr;
      pruned = true;
    }
  }
  return pruned;
}

}  // namespace

bool Inbox::PollSleep(const std::vector<std::shared_ptr<InboxTap>>& taps,
                      uint32_t events, absl::Time wake_by) {
  const int wake_fd = wake_fd_.load();
  if (wake_fd < 0) return false;
  // Announced before events_ is looked at again: a Bump after that sees a
  // sleeper and makes wake_fd readable; one before it changed events_.
  poll_sleepers_.fetch_add(1);
  for (auto& t : taps) {
    if (t != nullptr) t->Sleeping(true);
  }
  std::vector<pollfd> fds;
  fds.push_back({wake_fd, POLLIN, 0});
  for (auto& t : taps) {
    if (t != nullptr) fds.push_back({t->PollFd(), POLLIN, 0});
  }
  if (events_.load() == events) {
    const absl::Duration left = wake_by - halka::Now();
    const int ms = left <= absl::ZeroDuration()
                       ? 0
                       : static_cast<int>(absl::ToInt64Milliseconds(
                             left + absl::Microseconds(999)));
    if (poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR) {
      // Cannot sleep on them (should never happen): the readers deliver.
      poll_sleepers_.fetch_sub(1);
      for (auto& t : taps) {
        if (t != nullptr) t->Sleeping(false);
      }
      return false;
    }
  }
  for (auto& t : taps) {
    if (t != nullptr) t->Sleeping(false);
  }
  poll_sleepers_.fetch_sub(1);
  if (fds[0].revents != 0) {  // emptied: a later Bump wakes the next sleep
    uint64_t n;
    (void)!read(wake_fd, &n, sizeof(n));
  }
  return true;
}

std::optional<Inbox::Event> Inbox::NextWithTaps(
    int from, uint64_t op_seq, absl::Span<const int> watch,
    absl::Time deadline, std::vector<std::shared_ptr<InboxTap>> taps,
    bool polled) {
  // This thread takes the taps' records and sleeps on their words (their
  // readers stand aside) until it returns. Should the sleep on several
  // words fail, it leaves them to their readers (nullopt: Next waits on
  // the inbox alone).
  for (auto& t : taps) t->Attach(true);
  std::vector<uint32_t> seqs(taps.size());
  std::vector<FutexWaiter> words;
  bool pruned = false;
  std::optional<Event> ev;
  // Until when this wait yields its core instead of sleeping (set when it
  // first finds nothing; again after each frame it takes).
  // On the monotonic clock: a step of the wall clock must not stretch it.
  const std::chrono::nanoseconds yield(
      absl::ToInt64Nanoseconds(yield_before_sleep()));
  std::optional<std::chrono::steady_clock::time_point> yield_until;
  bool yielded = false;  // the last look followed a yield
  for (;;) {
    const uint32_t events = events_.load();
    bool took = false;
    if (DrainTaps(taps, seqs, &took)) pruned = true;
    {
      absl::MutexLock lock(&mu_);
      if (Ready(from, op_seq, watch) || halka::Now() >= deadline) {
        ev = EventLocked(from, op_seq, watch);
        if (yielded && ev->type == Event::kFrame) {
          counters_->waits_yielded.fetch_add(1, std::memory_order_relaxed);
        }
        break;
      }
    }
    if (took) {
      yield_until.reset();
      yielded = false;
      continue;  // look again before sleeping
    }
    if (yield.count() > 0) {
      const auto now = std::chrono::steady_clock::now();
      if (!yield_until.has_value()) yield_until = now + yield;
      if (now < *yield_until && halka::Now() < deadline) {
        sched_yield();
        yielded = true;
        continue;
      }
    }
    yielded = false;
    if (polled) {
      // No missed wake-up to count here: what wakes the sleep (a socket's
      // bytes, a turn's end, a Bump) stays readable until taken.
      if (!PollSleep(taps, events,
                     std::min(deadline, halka::Now() + kLongestSleep))) {
        break;
      }
      continue;
    }
    words.clear();
    words.push_back(FutexWaiter{&events_, events, /*shared=*/false});
    for (size_t i = 0; i < taps.size(); ++i) {
      if (taps[i] != nullptr) words.push_back(taps[i]->Waiter(seqs[i]));
    }
    // --shm_spin_us: poll the words before sleeping, as a ring's reader
    // would (on a host with idle cores, to save the wake-up).
    if (SpinUntilAnyMoves(words, std::min(spin_before_sleep(),
                                          deadline - halka::Now()))) {
      continue;
    }
    // Announce the sleep before the kernel compares the words: whoever
    // changes one after that sees a sleeper and wakes it.
    sleepers_.fetch_add(1);
    for (auto& t : taps) {
      if (t != nullptr) t->Sleeping(true);
    }
    // Never longer than a reader would sleep: should a wake-up ever be
    // lost (a kernel's, a sandbox's, or ours), it costs one poll interval,
    // not the operation's deadline.
    const absl::Time wake_by = std::min(deadline, halka::Now() + kLongestSleep);
    const bool slept = FutexWaitAny(words, wake_by);
    for (auto& t : taps) {
      if (t != nullptr) t->Sleeping(false);
    }
    sleepers_.fetch_sub(1);
    if (slept && wake_by < deadline && halka::Now() >= wake_by) {
      // Woken by the clock: had a word moved meanwhile, its wake-up was
      // missed (a diagnostic; a word that moved just as the clock ran out
      // counts too).
      bool moved = events_.load() != events;
      for (size_t i = 0; i < taps.size() && !moved; ++i) {
        moved = taps[i] != nullptr && taps[i]->Seq() != seqs[i];
      }
      if (moved) counters_->missed_wakeups.fetch_add(1);
    }
    if (!slept) break;  // cannot sleep on the words: the readers deliver
  }
  for (auto& t : taps) {
    if (t != nullptr) t->Attach(false);
  }
  if (pruned) {
    absl::MutexLock lock(&taps_mu_);
    EraseIf(taps_, [](const std::shared_ptr<InboxTap>& t) {
      return t->over();
    });
  }
  return ev;
}

std::optional<Inbox::Event> Inbox::NextOnTaps(int from, uint64_t op_seq,
                                              absl::Span<const int> watch,
                                              absl::Time deadline) {
  std::vector<std::shared_ptr<InboxTap>> taps = Taps();
  // Sockets (polled taps) and words cannot be slept on together: with
  // both, the words are the operation's and the sockets their readers'.
  size_t polled = 0;
  bool aside = false;
  for (const auto& t : taps) {
    if (!t->polled()) continue;
    ++polled;
    if (t->reading_aside()) aside = true;
  }
  const bool poll = polled == taps.size() && polled > 0 && !aside &&
                    wake_fd_.load() >= 0;
  if (poll) {
    std::optional<Event> ev = NextWithTaps(from, op_seq, watch, deadline,
                                           std::move(taps), /*polled=*/true);
    if (ev.has_value()) return ev;
  } else if (polled < taps.size()) {
    const bool sockets = polled > 0;
    EraseIf(taps, [](const std::shared_ptr<InboxTap>& t) {
      return t->polled();
    });
    // Without futex_waitv this thread could only drain the rings before it
    // waits, beside readers that wake for the same records: measured, that
    // was slower than leaving the rings to their readers
    // (docs/performance.md).
    if (taps.size() <= kMaxTapsWaited && FutexWaitAnyWorks()) {
      // The rings are this wait's, the sockets their readers'.
      if (sockets) LeaveTapsToReaders(/*polled_only=*/true);
      std::optional<Event> ev = NextWithTaps(
          from, op_seq, watch, deadline, std::move(taps), /*polled=*/false);
      if (ev.has_value()) return ev;
    }
  }
  // Not waited on here (none, or they cannot be): Next leaves every tap to
  // its reader.
  return std::nullopt;
}

}  // namespace halka
