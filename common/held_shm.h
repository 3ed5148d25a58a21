// Shared-memory objects a client process creates for a worker to map (its
// tensors and its staging buffer), and how a worker tells whether their
// creator is still alive.
//
// The creator makes an object under a name the sweep never looks at
// ("/halka-new-..."), takes a shared flock(2) on it, and only then renames
// it to "/halka-held-<pid>-<salt>-<n>": an object is never visible under
// its swept name without its creator's lock, however long the creator
// stalls. The lock belongs to the
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
// The name an object has until its creator holds its lock: the sweep takes
// one only once it is old and unlocked (a creator that died between
// creating and locking it).
inline constexpr char kNewShmPrefix[] = "halka-new-";

// A new name "/halka-held-<pid>-<salt>-<n>", unique in this process.
std::string NewHeldShmName();

// Creates `name` (O_EXCL, mode 0600), takes the shared flock, sizes it to
// `bytes` rounded up to whole pages (at least one) and maps it. reserve:
// allocate the pages now (posix_fallocate), so that a full /dev/shm fails
// here and not as SIGBUS on a later write. A failure removes the half-made
// object; a reserved object is also mapped populated (MAP_POPULATE: no
// page fault on its first writes). Errors: RESOURCE_EXHAUSTED naming the
// failing step.
struct HeldShm {
  void* data;
  size_t size;
};
absl::StatusOr<HeldShm> CreateHeldShm(const std::string& name, size_t bytes,
                                      bool reserve);

// Objects a client hands a worker its tensors in carry an owner page after
// their data: a magic and a capability (kShmCapabilityBytes random bytes)
// that only the creator and whoever it tells know. A worker maps such an
// object only for a request that names its capability (Worker.Run's
// shm_capability), so a caller cannot make a worker map another client's or
// another job's object by its name, which anyone on the host can list.
inline constexpr size_t kShmCapabilityBytes = 32;
inline constexpr size_t kShmOwnerPageBytes = 4096;
inline constexpr char kShmOwnerMagic[16] = "halka-owner-v1";

struct OwnedShm {
  void* data;
  size_t size;             // the data's size (whole pages); the owner page follows
  std::string capability;  // kShmCapabilityBytes raw bytes
};
// Creates `name` as CreateHeldShm does, with `bytes` of data (rounded up to
// whole pages) and the owner page after them, holding a fresh capability.
// Errors: RESOURCE_EXHAUSTED (as CreateHeldShm), INTERNAL (no randomness).
absl::StatusOr<OwnedShm> CreateOwnedShm(const std::string& name, size_t bytes);

// Unmaps what CreateOwnedShm mapped (data and owner page).
void UnmapOwnedShm(void* data, size_t size);

}  // namespace halka

#endif  // HALKA_COMMON_HELD_SHM_H_
