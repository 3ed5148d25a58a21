// Places in an operation's buffer where a link's reader may write a
// received payload directly, so that the operation's thread does not copy
// it there (an all-gather chunk that only moves into place).
//
// An operation offers a landing for one frame it expects (its exact
// header: sender, generation, op, phase, step, segment, offset, count,
// dtype, and the payload's size) once nothing else can touch that range:
// the ring offers an all-gather chunk's range only after the sends of its
// segment were released (OpContext::SegmentReleased), a chain broadcast
// every chunk of a rank that is not the root (it sends nothing it has not
// received). A reader that finds
// the frame's header on the board claims the landing and reads the payload
// into it; the frame it then delivers says so (InFrame::landed), and the
// buffer's Apply has nothing left to copy. A frame with no landing, or one
// that arrived before its landing was offered, takes the usual path.
//
// Never writes into a buffer handed back: the operation withdraws every
// landing it offered before it ends, success or failure (~OpContext). A reader writes
// only while it holds the landing's lock and the landing is not revoked,
// one bounded non-blocking recv() (plain) or one bounded copy of a sealed
// payload that was opened and authenticated in the link's own staging
// buffer at a time, so a withdrawal waits for at most one such step, never
// for a peer that stalls inside a record, and no byte that failed
// authentication ever lands. The reader reads the rest of a revoked frame
// elsewhere and drops it: its operation has ended.
//
// Only sources that can land (a wire link's reader, transport/tcp/wire_link.h)
// take offers, so links through shared memory or gRPC cost nothing here;
// and only payloads of kMinLandingBytes or more are offered: below that,
// the copy costs less than the reader's extra reads for the frame's head.
// Thread-safe.
#ifndef HALKA_CORE_LANDING_H_
#define HALKA_CORE_LANDING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/frame.h"

namespace halka {

inline constexpr size_t kMinLandingBytes = 64 << 10;

// One frame's destination.
class Landing {
 public:
  Landing(uint8_t* dst, size_t bytes) : dst_(dst), bytes_(bytes) {}
  Landing(const Landing&) = delete;
  Landing& operator=(const Landing&) = delete;
  size_t bytes() const { return bytes_; }
  const uint8_t* data() const { return dst_; }
  // Runs f(dst) under the landing's lock unless it was revoked; false when
  // revoked (f did not run). f must not block.
  template <typename F>
  bool Write(F&& f) {
    absl::MutexLock lock(&mu_);
    if (revoked_) return false;
    f(dst_);
    return true;
  }
  // After it returns, no Write runs f again.
  void Revoke() {
    absl::MutexLock lock(&mu_);
    revoked_ = true;
  }

 private:
  uint8_t* const dst_;
  const size_t bytes_;
  absl::Mutex mu_;
  bool revoked_ ABSL_GUARDED_BY(mu_) = false;
};

class LandingBoard {
 public:
  // A source of `from`'s frames that can land payloads (counted: a rank
  // may have more than one link at once while a link is replaced).
  void AddSource(int from);
  void RemoveSource(int from);
  // The operation's side: the payload of the data frame `expect` from
  // `from`, `bytes` long, may be written at `dst`. nullptr (nothing
  // offered) when no source of `from` can land, or `expect` is on the board
  // already.
  std::shared_ptr<Landing> Offer(int from, const FrameMeta& expect,
                                 uint8_t* dst, size_t bytes);
  // Takes the landings off the board and revokes them: when it returns, no
  // reader writes into any of them.
  void Withdraw(absl::Span<const std::shared_ptr<Landing>> landings);
  // The reader's side: whether any landing is offered at all (one atomic
  // load; a landing offered just after may be missed, and its frame then
  // takes the usual path).
  bool Armed() const { return offered_count_.load(std::memory_order_acquire) > 0; }
  // The landing offered for this frame (a data frame whose payload is
  // `payload_bytes` long), taken off the board; nullptr if none.
  std::shared_ptr<Landing> Claim(int from, const FrameMeta& meta,
                                 size_t payload_bytes);
  size_t offered() const;  // tests

 private:
  using Key = std::tuple<int, uint64_t, uint64_t, uint8_t, int32_t, int32_t,
                         uint64_t, uint64_t, uint8_t>;
  static Key KeyOf(int from, const FrameMeta& m);
  mutable absl::Mutex mu_;
  std::map<int, int> sources_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::shared_ptr<Landing>> offered_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> offered_count_{0};  // offered_.size(), for Armed
};

}  // namespace halka

#endif  // HALKA_CORE_LANDING_H_
