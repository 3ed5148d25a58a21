#include "common/shm_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace halka {
namespace {

// One guarded range. `begin` is claimed by CAS (0: free); a range is live
// once `end` is set. The handler reads only atomics (async-signal-safe).
struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> broken{false};
};
Slot g_slots[ShmGuard::kMaxGuarded];
std::atomic<uint64_t> g_absorbed{0};
uintptr_t g_page = 4096;  // set before the handler is installed
struct sigaction g_previous;

void OnSigbus(int sig, siginfo_t* info, void* uctx) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  // Only a fault has an address (a signal sent by kill or raise does not).
  for (Slot& s : g_slots) {
    if (info->si_code <= 0) break;
    const uintptr_t b = s.begin.load(std::memory_order_acquire);
    const uintptr_t e = s.end.load(std::memory_order_acquire);
    if (b == 0 || e == 0 || addr < b || addr >= e) continue;
    // Zero pages over the whole range: the faulting access, and every
    // later one, completes; broken() tells the user not to trust it.
    const uintptr_t from = b & ~(g_page - 1);
    if (mmap(reinterpret_cast<void*>(from), e - from, PROT_READ | PROT_WRITE,
             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED) {
      break;  // cannot absorb it: as if unguarded
    }
    s.broken.store(true, std::memory_order_release);
    g_absorbed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Not ours: what was there before.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction != nullptr) {
      g_previous.sa_sigaction(sig, info, uctx);
      return;
    }
  } else if (g_previous.sa_handler != SIG_DFL &&
             g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);  // dies as it would have without the handler
}

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace

std::unique_ptr<ShmGuard> ShmGuard::Guard(void* base, size_t size) {
  if (base == nullptr || size == 0) return nullptr;
  InstallOnce();
  const auto b = reinterpret_cast<uintptr_t>(base);
  for (size_t i = 0; i < kMaxGuarded; ++i) {
    uintptr_t expected = 0;
    if (!g_slots[i].begin.compare_exchange_strong(expected, b)) continue;
    g_slots[i].broken.store(false, std::memory_order_relaxed);
    g_slots[i].end.store(b + size, std::memory_order_release);
    return std::unique_ptr<ShmGuard>(new ShmGuard(i));
  }
  return nullptr;
}

ShmGuard::~ShmGuard() {
  g_slots[slot_].end.store(0, std::memory_order_release);
  g_slots[slot_].begin.store(0, std::memory_order_release);
}

bool ShmGuard::broken() const {
  return g_slots[slot_].broken.load(std::memory_order_acquire);
}

uint64_t ShmGuard::Absorbed() {
  return g_absorbed.load(std::memory_order_relaxed);
}

}  // namespace halka
