// Shared-memory objects that clients hand host tensors in (Worker.Run),
// mapped once and kept: a client reuses its staging object, so the mapping
// is reused too. At most 16 mappings, least recently used dropped first.
// Thread-safe.
#ifndef HALKA_WORKER_SHM_CACHE_H_
#define HALKA_WORKER_SHM_CACHE_H_

#include <cstdint>
#include <list>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace halka {

class ShmCache {
 public:
  ShmCache() = default;
  ~ShmCache();
  ShmCache(const ShmCache&) = delete;
  ShmCache& operator=(const ShmCache&) = delete;

  // Maps `name` (which the client created with exactly `size` bytes). A
  // client that re-created an object under the same name gets the new one.
  // Errors: INVALID_ARGUMENT (not a halka object, size mismatch),
  // NOT_FOUND (cannot be opened), RESOURCE_EXHAUSTED (cannot be mapped).
  absl::StatusOr<uint8_t*> Map(const std::string& name, uint64_t size);

 private:
  struct Entry {
    std::string name;
    uint64_t size;
    uint8_t* base;
    uint64_t inode;
  };
  static bool StillSame(const Entry& e);

  absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace halka

#endif  // HALKA_WORKER_SHM_CACHE_H_
