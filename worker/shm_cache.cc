#include "worker/shm_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/held_shm.h"
#include "openssl/crypto.h"
#include "worker/op_request.h"

namespace halka {

ShmCache::Mapping::Mapping(uint8_t* b, uint64_t n, uint64_t mapped)
    : base(b), size(n), mapped_(mapped), guard_(ShmGuard::Guard(b, mapped)) {}

ShmCache::Mapping::~Mapping() {
  guard_.reset();  // before the range goes
  munmap(base, mapped_);
}

ShmCache::~ShmCache() = default;

namespace {

// The one answer for every object a caller may not map: whether it exists,
// its size and its owner stay unsaid.
absl::Status NotYours(const std::string& name) {
  return absl::PermissionDeniedError(absl::StrCat(
      "shm object ", name, " is not one this caller created (or this worker "
      "cannot see it); nothing was mapped"));
}

// Whether the open object `fd` has `size` bytes of data and an owner page
// holding `capability`; its inode in *inode.
bool Owned(int fd, uint64_t size, const std::string& capability,
           uint64_t* inode) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) != size + kShmOwnerPageBytes) {
    return false;
  }
  uint8_t owner[sizeof(kShmOwnerMagic) + kShmCapabilityBytes];
  if (pread(fd, owner, sizeof(owner), static_cast<off_t>(size)) !=
      static_cast<ssize_t>(sizeof(owner))) {
    return false;
  }
  *inode = static_cast<uint64_t>(st.st_ino);
  return CRYPTO_memcmp(owner, kShmOwnerMagic, sizeof(kShmOwnerMagic)) == 0 &&
         CRYPTO_memcmp(owner + sizeof(kShmOwnerMagic), capability.data(),
                       kShmCapabilityBytes) == 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ShmCache::Mapping>> ShmCache::Map(
    const std::string& name, uint64_t size, const std::string& capability) {
  if (absl::Status s = ValidateShmName(name); !s.ok()) return s;
  if (capability.size() != kShmCapabilityBytes ||
      size > (uint64_t{1} << 48)) {
    return NotYours(name);
  }
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->name == name && it->size == size &&
        CRYPTO_memcmp(it->capability.data(), capability.data(),
                      kShmCapabilityBytes) == 0 &&
        StillSame(*it)) {
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front().mapping;
    }
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW, 0);
  if (fd < 0) return NotYours(name);
  uint64_t inode = 0;
  if (!Owned(fd, size, capability, &inode)) {
    close(fd);
    return NotYours(name);
  }
  const uint64_t mapped = size + kShmOwnerPageBytes;
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map shm object ", name, ": ", std::strerror(errno)));
  }
  entries_.push_front(Entry{
      name, size, inode, capability,
      std::make_shared<const Mapping>(static_cast<uint8_t*>(base), size,
                                      mapped)});
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
                    static_cast<uint64_t>(st.st_size) == e.size + kShmOwnerPageBytes;
  close(fd);
  return same;
}

}  // namespace halka
