// Shared-memory objects that clients hand host tensors in (Worker.Run),
// mapped once and kept: a client reuses its staging object, so the mapping
// is reused too. The cache keeps at most 16 mappings, least recently used
// dropped first; a mapping is unmapped only when the cache and every call
// using it have let go of it. Thread-safe.
#ifndef HALKA_WORKER_SHM_CACHE_H_
#define HALKA_WORKER_SHM_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/shm_guard.h"

namespace halka {

class ShmCache {
 public:
  ShmCache() = default;
  ~ShmCache();
  ShmCache(const ShmCache&) = delete;
  ShmCache& operator=(const ShmCache&) = delete;

  // One mapped object; unmapped when the last holder lets go.
  struct Mapping {
    Mapping(uint8_t* b, uint64_t n, uint64_t mapped);
    ~Mapping();
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    // True once the object shrank under the mapping (common/shm_guard.h):
    // what was read from it since is not the client's data.
    bool broken() const { return guard_ != nullptr && guard_->broken(); }
    uint8_t* const base;
    const uint64_t size;

   private:
    const uint64_t mapped_;  // size + the owner page
    std::unique_ptr<ShmGuard> guard_;
  };

  // Maps `name`, which the client created with CreateOwnedShm
  // (common/held_shm.h) with exactly `size` bytes of data and
  // `capability` in its owner page; hold the result for as long as the
  // memory is used. A client that re-created an object under the same name
  // gets the new one. Errors: INVALID_ARGUMENT (not a halka object's
  // name), PERMISSION_DENIED (no such object, or not this caller's: the
  // same words either way, so that nothing about an object the caller does
  // not own is revealed), RESOURCE_EXHAUSTED (cannot be mapped).
  absl::StatusOr<std::shared_ptr<const Mapping>> Map(
      const std::string& name, uint64_t size, const std::string& capability);

 private:
  struct Entry {
    std::string name;
    uint64_t size;
    uint64_t inode;
    std::string capability;
    std::shared_ptr<const Mapping> mapping;
  };
  static bool StillSame(const Entry& e);

  absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace halka

#endif  // HALKA_WORKER_SHM_CACHE_H_
