// Shared-memory objects a client process creates for a worker to map (its
// tensors and its staging buffer), and how a worker tells whether their
// creator is still alive.
//
// The creator names an object "/halka-held-<pid>-<salt>-<n>" and takes a
// shared flock(2) on it right after creating it. The lock belongs to the
// open file, which the creator's mapping keeps open, so it lasts until the
// creator unmaps the object or its process ends, however it ends (SIGKILL
// included: the kernel drops the lock). A worker's sweep (worker/
// shm_reaper.h) unlinks an object it can lock exclusively: no process
// holds it. This holds across PID namespaces (containers sharing /dev/shm)
// and under PID reuse, where a PID in the name would mislead; the PID is in
// the name for people. Objects named otherwise (older clients) are never
// swept.
#ifndef HALKA_COMMON_HELD_SHM_H_
#define HALKA_COMMON_HELD_SHM_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace halka {

// The file name prefix under /dev/shm (shm_open names start with '/').
inline constexpr char kHeldShmPrefix[] = "halka-held-";

// A new name "/halka-held-<pid>-<salt>-<n>", unique in this process.
std::string NewHeldShmName();

// Creates `name` (O_EXCL, mode 0600), takes the shared flock, sizes it to
// `bytes` rounded up to whole pages (at least one) and maps it. reserve:
// allocate the pages now (posix_fallocate), so that a full /dev/shm fails
// here and not as SIGBUS on a later write. A failure removes the half-made
// object. Errors: RESOURCE_EXHAUSTED naming the failing step.
struct HeldShm {
  void* data;
  size_t size;
};
absl::StatusOr<HeldShm> CreateHeldShm(const std::string& name, size_t bytes,
                                      bool reserve);

}  // namespace halka

#endif  // HALKA_COMMON_HELD_SHM_H_
