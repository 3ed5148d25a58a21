// Reclaims the shared-memory objects of client processes that are gone
// (common/held_shm.h): a client killed before it unlinked its staging and
// tensor objects would otherwise leave them in /dev/shm for good.
#ifndef HALKA_WORKER_SHM_REAPER_H_
#define HALKA_WORKER_SHM_REAPER_H_

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/log.h"

namespace halka {

struct ShmSweep {
  int held = 0;                      // objects a live process holds
  std::vector<std::string> removed;  // file names unlinked
};

// One pass over `dir` (/dev/shm): unlinks every "halka-held-*" object that
// no process holds (an exclusive flock succeeds) and that was last changed
// at least `min_age` before `now` (a creator takes its lock right after
// creating the object; the age covers that instant). Objects it cannot
// open (another user's) and names of any other form are left alone.
ShmSweep SweepHeldShm(const std::string& dir, absl::Duration min_age,
                      absl::Time now);

// Sweeps at once and then every `interval` on its own thread, logging what
// it removed, until destroyed.
class ShmReaper {
 public:
  ShmReaper(std::string dir, absl::Duration interval, const Logger& log);
  ~ShmReaper();
  ShmReaper(const ShmReaper&) = delete;
  ShmReaper& operator=(const ShmReaper&) = delete;

 private:
  void Loop();

  const std::string dir_;
  const absl::Duration interval_;
  const Logger& log_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace halka

#endif  // HALKA_WORKER_SHM_REAPER_H_
