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

namespace halka {

// The file name prefix under /dev/shm (shm_open names start with '/').
inline constexpr char kHeldShmPrefix[] = "halka-held-";

}  // namespace halka

#endif  // HALKA_COMMON_HELD_SHM_H_
