// Mapped shared memory that another process may shrink under us.
//
// A shared-memory object (a client's tensor, a peer's or a client's link
// ring) can be truncated by any process of the same user while a worker
// has it mapped; touching a page past the new end raises SIGBUS, which
// would kill the worker. A guarded range cannot: the process-wide SIGBUS
// handler finds the faulting address in a guarded range, maps zero pages
// over the whole range (the access then completes, reading zeros) and marks
// the range broken. Whoever uses the range checks broken() before it
// trusts or reports what it read, and fails cleanly, naming the object.
// A SIGBUS outside every guarded range gets the handler that was there
// before (by default: the process dies, as it would have).
//
// At most kMaxGuarded ranges at once; Guard refuses more (the mapping is
// then used unguarded and the caller should refuse it).
#ifndef HALKA_COMMON_SHM_GUARD_H_
#define HALKA_COMMON_SHM_GUARD_H_

#include <cstddef>
#include <memory>

namespace halka {

class ShmGuard {
 public:
  static constexpr size_t kMaxGuarded = 4096;
  // Guards [base, base + size) until the returned guard is destroyed
  // (destroy it before unmapping). nullptr when the table is full.
  static std::unique_ptr<ShmGuard> Guard(void* base, size_t size);
  ~ShmGuard();
  ShmGuard(const ShmGuard&) = delete;
  ShmGuard& operator=(const ShmGuard&) = delete;

  // True once an access to the range faulted (the object shrank): what
  // was read from it since is zeros, not the object's bytes.
  bool broken() const;
  // How many SIGBUS the handler has absorbed, process-wide (tests).
  static uint64_t Absorbed();

 private:
  explicit ShmGuard(size_t slot) : slot_(slot) {}
  const size_t slot_;
};

}  // namespace halka

#endif  // HALKA_COMMON_SHM_GUARD_H_
