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

namespace halka {

class ShmCache {
 public:
  ShmCache() = default;
  ~ShmCache();
  ShmCache(const ShmCache&) = delete;
  ShmCache& operator=(const ShmCache&) = delete;

  // One mapped object; unmapped when the last holder lets go.
  struct Mapping {
    Mapping(uint8_t* b, uint64_t n) : base(b), size(n) {}
    ~Mapping();
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    uint8_t* const base;
    const uint64_t size;
  };

  // Maps `name` (which the client created with exactly `size` bytes); hold
  // the result for as long as the memory is used. A client that re-created
  // an object under the same name gets the new one. Errors:
  // INVALID_ARGUMENT (not a halka object, size mismatch), NOT_FOUND
  // (cannot be opened), RESOURCE_EXHAUSTED (cannot be mapped).
  absl::StatusOr<std::shared_ptr<const Mapping>> Map(const std::string& name,
                                                     uint64_t size);

 private:
  struct Entry {
    std::string name;
    uint64_t size;
    uint64_t inode;
    std::shared_ptr<const Mapping> mapping;
  };
  static bool StillSame(const Entry& e);

  absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace halka

#endif  // HALKA_WORKER_SHM_CACHE_H_
