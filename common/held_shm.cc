#include "common/held_shm.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>  // renameat2
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

namespace {

// Where shm_open's names live (glibc's choice on Linux).
constexpr char kShmDir[] = "/dev/shm";

// Creates, locks, sizes and maps a new object under `name`, `data_bytes`
// (whole pages, at least one) plus `tail` bytes. It is made under a name
// the sweep ignores and renamed once locked (common/held_shm.h).
absl::StatusOr<HeldShm> MakeLocked(const std::string& name, size_t bytes,
                                   size_t tail, bool reserve) {
  static std::atomic<uint64_t> counter{0};
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = std::max(page, (bytes + page - 1) / page * page);
  const size_t total = size + tail;
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a shared-memory object name"));
  }
  const std::string temp = absl::StrCat("/", kNewShmPrefix, getpid(), "-",
                                        counter.fetch_add(1), "-", name.substr(1));
  const int fd = shm_open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot create shm object ", name, ": ", std::strerror(errno)));
  }
  bool renamed = false;
  // Closes and removes the half-made object.
  auto fail = [&](absl::string_view what, int err) {
    close(fd);
    shm_unlink((renamed ? name : temp).c_str());
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot ", what, " shm object ", name, ": ", std::strerror(err)));
  };
  if (flock(fd, LOCK_SH) != 0) return fail("lock", errno);
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    return fail(absl::StrCat("size (", total, " bytes)"), errno);
  }
  if (reserve) {
    if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(total));
        err != 0) {
      return fail(absl::StrCat("reserve (", total, " bytes)"), err);
    }
  }
  // RENAME_NOREPLACE: never over another object of that name.
  if (renameat2(AT_FDCWD, absl::StrCat(kShmDir, temp).c_str(), AT_FDCWD,
                absl::StrCat(kShmDir, name).c_str(), RENAME_NOREPLACE) != 0) {
    return fail("name", errno);
  }
  renamed = true;
  // Reserved objects (link rings) are mapped populated: their pages are
  // written from the first frame on, and a minor fault costs about 14 us
  // on a VM (a 4 KiB frame's copy into a fresh page of the ring took
  // longer than the rest of its all-reduce).
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                 reserve ? MAP_SHARED | MAP_POPULATE : MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("map", errno);
  close(fd);  // the mapping keeps the file, and the lock, open
  return HeldShm{p, size};
}

}  // namespace

absl::StatusOr<HeldShm> CreateHeldShm(const std::string& name, size_t bytes,
                                      bool reserve) {
  return MakeLocked(name, bytes, 0, reserve);
}

absl::StatusOr<OwnedShm> CreateOwnedShm(const std::string& name, size_t bytes) {
  std::string capability(kShmCapabilityBytes, '\0');
  if (getrandom(capability.data(), capability.size(), 0) !=
      static_cast<ssize_t>(capability.size())) {
    return absl::InternalError(absl::StrCat(
        "no randomness for a shm capability: ", std::strerror(errno)));
  }
  absl::StatusOr<HeldShm> made =
      MakeLocked(name, bytes, kShmOwnerPageBytes, /*reserve=*/false);
  if (!made.ok()) return made.status();
  uint8_t* owner = static_cast<uint8_t*>(made->data) + made->size;
  std::memcpy(owner, kShmOwnerMagic, sizeof(kShmOwnerMagic));
  std::memcpy(owner + sizeof(kShmOwnerMagic), capability.data(),
              capability.size());
  return OwnedShm{made->data, made->size, std::move(capability)};
}

void UnmapOwnedShm(void* data, size_t size) {
  munmap(data, size + kShmOwnerPageBytes);
}

}  // namespace halka
