#include "worker/shm_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/op_request.h"

namespace halka {

ShmCache::Mapping::~Mapping() { munmap(base, size); }

ShmCache::~ShmCache() = default;

absl::StatusOr<std::shared_ptr<const ShmCache::Mapping>> ShmCache::Map(
    const std::string& name, uint64_t size) {
  if (absl::Status s = ValidateShmName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->name == name && it->size == size && StillSame(*it)) {
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front().mapping;
    }
  }
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(
        "shm object ", name, " cannot be opened: ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != size) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "shm object ", name, " has ", st.st_size, " bytes, the request says ",
        size));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map shm object ", name, ": ", std::strerror(errno)));
  }
  entries_.push_front(Entry{
      name, size, static_cast<uint64_t>(st.st_ino),
      std::make_shared<const Mapping>(static_cast<uint8_t*>(base), size)});
  // Calls still using a dropped mapping keep it mapped until they end.
  while (entries_.size() > 16) entries_.pop_back();
  return entries_.front().mapping;
}

bool ShmCache::StillSame(const Entry& e) {
  const int fd = shm_open(e.name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  struct stat st;
  const bool same = fstat(fd, &st) == 0 &&
                    static_cast<uint64_t>(st.st_ino) == e.inode &&
                    static_cast<uint64_t>(st.st_size) == e.size;
  close(fd);
  return same;
}

}  // namespace halka
