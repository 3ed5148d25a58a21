#include "common/held_shm.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace halka {

std::string NewHeldShmName() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  return absl::StrCat("/", kHeldShmPrefix, getpid(), "-", salt % 1000000,
                      "-", counter.fetch_add(1));
}

absl::StatusOr<HeldShm> CreateHeldShm(const std::string& name, size_t bytes,
                                      bool reserve) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = std::max(page, (bytes + page - 1) / page * page);
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot create shm object ", name, ": ", std::strerror(errno)));
  }
  // Closes and removes the half-made object.
  auto fail = [&](absl::string_view what, int err) {
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot ", what, " shm object ", name, ": ", std::strerror(err)));
  };
  if (flock(fd, LOCK_SH) != 0) return fail("lock", errno);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return fail(absl::StrCat("size (", size, " bytes)"), errno);
  }
  if (reserve) {
    if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
        err != 0) {
      return fail(absl::StrCat("reserve (", size, " bytes)"), err);
    }
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("map", errno);
  close(fd);  // the mapping keeps the file, and the lock, open
  return HeldShm{p, size};
}

}  // namespace halka
