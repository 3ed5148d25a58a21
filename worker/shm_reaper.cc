#include "worker/shm_reaper.h"

#include <algorithm>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/held_shm.h"

namespace halka {
namespace {

// Minimum age of an object before a sweep may take it for abandoned.
constexpr absl::Duration kMinAge = absl::Seconds(5);
// ... and of an object under its first name (common/held_shm.h), which
// its creator locks a moment after making it.
constexpr absl::Duration kNewMinAge = absl::Minutes(10);

enum class Verdict { kHeld, kRemoved, kSkipped };

// Unlinks dir/name if no process holds it and it is old enough; the
// exclusive lock is held while unlinking, so no creator can take it then.
Verdict Reap(const std::string& dir, const std::string& name,
             absl::Duration min_age, absl::Time now) {
  const std::string path = absl::StrCat(dir, "/", name);
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Verdict::kSkipped;  // gone already, or not ours
  Verdict v = Verdict::kSkipped;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      absl::FromTimeT(st.st_ctime) + min_age > now) {
    // not a plain object, or too young to judge
  } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    v = Verdict::kHeld;
  } else {
    // Still the object that was locked (not one re-created by that name).
    struct stat now_st;
    if (lstat(path.c_str(), &now_st) == 0 && now_st.st_ino == st.st_ino &&
        now_st.st_dev == st.st_dev && unlink(path.c_str()) == 0) {
      v = Verdict::kRemoved;
    }
  }
  close(fd);  // drops the lock
  return v;
}

}  // namespace

ShmSweep SweepHeldShm(const std::string& dir, absl::Duration min_age,
                      absl::Time now) {
  ShmSweep sweep;
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
  if (d == nullptr) return sweep;
  std::vector<std::string> names;
  while (const dirent* e = readdir(d.get())) {
    if (absl::StartsWith(e->d_name, kHeldShmPrefix) ||
        absl::StartsWith(e->d_name, kNewShmPrefix)) {
      names.emplace_back(e->d_name);
    }
  }
  for (const std::string& name : names) {
    // A creator locks its object right after making it; one still unlocked
    // under its first name after kNewMinAge died before it could.
    const absl::Duration age = absl::StartsWith(name, kNewShmPrefix)
                                   ? std::max(min_age, kNewMinAge)
                                   : min_age;
    switch (Reap(dir, name, age, now)) {
      case Verdict::kHeld: ++sweep.held; break;
      case Verdict::kRemoved: sweep.removed.push_back(name); break;
      case Verdict::kSkipped: break;
    }
  }
  return sweep;
}

ShmReaper::ShmReaper(std::string dir, absl::Duration interval, const Logger& log)
    : dir_(std::move(dir)), interval_(interval), log_(log),
      thread_([this] { Loop(); }) {}

ShmReaper::~ShmReaper() {
  stop_.Notify();
  thread_.join();
}

void ShmReaper::Loop() {
  do {
    const ShmSweep s = SweepHeldShm(dir_, kMinAge, absl::Now());
    if (!s.removed.empty()) {
      log_.Info(absl::StrCat(
          "removed ", s.removed.size(), " shared-memory object(s) of client "
          "processes that are gone from ", dir_, ": ",
          absl::StrJoin(s.removed, " "), " (", s.held, " held by live ones)"));
    }
  } while (!stop_.WaitForNotificationWithTimeout(interval_));
}

}  // namespace halka
