// Futex calls on 32-bit words, shared between processes (a ShmRing's
// header) or private to this one (an Inbox's event count).
#ifndef HALKA_CORE_FUTEX_H_
#define HALKA_CORE_FUTEX_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "absl/types/span.h"

namespace halka {

// Sleeps while `*word == expected`, at most `timeout` (a wake-up, a signal
// or a changed word return early). `shared`: the word is in memory another
// process maps.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               absl::Duration timeout, bool shared = true);
// Wakes every thread sleeping on `word`.
void FutexWakeAll(std::atomic<uint32_t>* word, bool shared = true);

// One word of a FutexWaitAny.
struct FutexWaiter {
  std::atomic<uint32_t>* word;
  uint32_t expected;
  bool shared;
};
// Sleeps until any word differs from its expected value, a wake-up on any
// of them, or `deadline` (futex_waitv, Linux 5.16+; at most 128 words).
// False, without sleeping, where the kernel lacks it (FutexWaitAnyWorks)
// or the call fails for any other reason than those.
bool FutexWaitAny(absl::Span<const FutexWaiter> words, absl::Time deadline);
// Polls the words (no system call) until one differs from its expected
// value (true) or `spin` has passed (false).
bool SpinUntilAnyMoves(absl::Span<const FutexWaiter> words,
                       absl::Duration spin);
// The CPU's pause between two polls of a spin.
void CpuRelax();

// Whether FutexWaitAny sleeps: the kernel has futex_waitv (asked once per
// process) and it is not turned off (HALKA_FUTEX_WAITV=0 in the
// environment, or SetFutexWaitAnyEnabled(false): for A/B runs and for
// tests of the path a kernel without it takes).
bool FutexWaitAnyWorks();
bool FutexWaitAnyInKernel();
void SetFutexWaitAnyEnabled(bool enabled);

}  // namespace halka

#endif  // HALKA_CORE_FUTEX_H_
