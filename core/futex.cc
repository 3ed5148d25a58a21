#include "core/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/clock.h"

namespace halka {

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               absl::Duration timeout, bool shared) {
  if (timeout <= absl::ZeroDuration()) return;
  const timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word),
          shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word, bool shared) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word),
          shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr,
          0);
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

bool SpinUntilAnyMoves(absl::Span<const FutexWaiter> words,
                       absl::Duration spin) {
  if (spin <= absl::ZeroDuration()) return false;
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::nanoseconds(absl::ToInt64Nanoseconds(spin));
  for (uint32_t i = 1;; ++i) {
    for (const FutexWaiter& w : words) {
      if (w.word->load(std::memory_order_acquire) != w.expected) return true;
    }
    CpuRelax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return false;
  }
}

namespace {
// -1: not asked yet; 0: off (no kernel support, HALKA_FUTEX_WAITV=0, or a
// test); 1: on.
std::atomic<int> waitv_state{-1};
}  // namespace

void SetFutexWaitAnyEnabled(bool enabled) {
  waitv_state.store(enabled && FutexWaitAnyInKernel() ? 1 : 0);
}

bool FutexWaitAnyWorks() {
  int state = waitv_state.load(std::memory_order_relaxed);
  if (state < 0) {
    const char* env = std::getenv("HALKA_FUTEX_WAITV");
    const bool off = env != nullptr && std::string(env) == "0";
    state = !off && FutexWaitAnyInKernel() ? 1 : 0;
    waitv_state.store(state);
  }
  return state == 1;
}

// Older uapi headers (Linux 6.1's, Debian 12) name the size flag FUTEX_32
// and have no FUTEX2_PRIVATE; the values are the kernel's ABI.
#if defined(SYS_futex_waitv) && defined(FUTEX_WAITV_MAX)
#ifndef FUTEX2_SIZE_U32
#define FUTEX2_SIZE_U32 0x02
#endif
#ifndef FUTEX2_PRIVATE
#define FUTEX2_PRIVATE FUTEX_PRIVATE_FLAG
#endif
bool FutexWaitAnyInKernel() {
  static const bool works = [] {
    // No words: EINVAL where the call exists; ENOSYS where it does not (an
    // older kernel, a sandbox such as gVisor that lacks it), EPERM where a
    // seccomp filter refuses it (Docker's default profile before 23.0).
    errno = 0;
    const long r = syscall(SYS_futex_waitv, nullptr, 0, 0, nullptr,
                           CLOCK_MONOTONIC);
    return r < 0 && errno == EINVAL;
  }();
  return works;
}

bool FutexWaitAny(absl::Span<const FutexWaiter> words, absl::Time deadline) {
  if (!FutexWaitAnyInKernel() || words.empty() || words.size() > 128) {
    return false;
  }
  futex_waitv waiters[128] = {};
  for (size_t i = 0; i < words.size(); ++i) {
    waiters[i].val = words[i].expected;
    waiters[i].uaddr = reinterpret_cast<uintptr_t>(words[i].word);
    waiters[i].flags = FUTEX2_SIZE_U32 | (words[i].shared ? 0 : FUTEX2_PRIVATE);
  }
  // futex_waitv takes an absolute time on the clock it is given.
  const absl::Duration left = deadline - halka::Now();
  if (left <= absl::ZeroDuration()) return true;
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const timespec at = absl::ToTimespec(absl::DurationFromTimespec(now) + left);
  const long r = syscall(SYS_futex_waitv, waiters,
                         static_cast<unsigned>(words.size()), 0, &at,
                         CLOCK_MONOTONIC);
  // Woken (an index), a word already changed, the deadline, a signal: it
  // did what it was asked. Anything else means it cannot: say so, so that
  // the caller waits another way instead of spinning.
  return r >= 0 || errno == EAGAIN || errno == ETIMEDOUT || errno == EINTR;
}
#else
bool FutexWaitAnyInKernel() { return false; }
bool FutexWaitAny(absl::Span<const FutexWaiter>, absl::Time) { return false; }
#endif

}  // namespace halka
