// A one-way ring of records in a shared-memory object: the data path of a
// peer link whose two ends run on the same host (transport/grpc/grpc_transport.h
// negotiates it over the link's gRPC stream, which stays open as the
// link's liveness and error channel).
//
// The sending process creates the object (ShmRing::Create) and names it to
// the receiver, which maps it (ShmRing::Open) if it can: a receiver that
// cannot see the sender's /dev/shm (another container, another host) says
// no and the link stays on gRPC. A random token in the object's header,
// sent along with the name, proves both ends mapped the same object.
//
// Layout: a 4 KiB header (magic, capacity, token, the producer's and the
// consumer's positions, two futex words, a closed flag), then `capacity`
// bytes of records. A record is a 64-byte head (payload bytes, flags, the
// whole frame's bytes) and its payload, padded to 64 bytes, so payloads
// start 64-byte aligned. A record never wraps: one that does not fit
// before the end is preceded by a WRAP record that fills the rest, and a
// small frame that finds the ring empty past its first quarter (at most
// 256 KiB) starts at its beginning the same way (so small frames cycle
// over the same warm pages). Frames larger than
// capacity/4 travel as several records (FIRST ... LAST).
//
// Positions are byte counts since creation (never wrap in practice: 2^64).
// The producer publishes a record by storing `head` (release), bumps
// `head_seq` and wakes the consumer if it sleeps; the consumer frees
// records by storing `tail` and wakes the producer the same way. Sleepers
// use FUTEX_WAIT on the seq words with a timeout, so a lost peer never
// leaves anyone asleep for more than that timeout.
//
// Records are handed out zero-copy: the consumer's payload pointers stay
// valid until Release(id); `tail` advances over the longest released
// prefix, so records may be released in any order.
//
// The consumer never trusts the shared header: a `head` more than
// `capacity` ahead, a record length past the end, unknown flags: DATA_LOSS.
//
// Thread-safety: one producing thread at a time (callers serialise), one
// consuming thread at a time (Next: callers serialise, e.g. a link's
// reader and the operation's thread that drains the ring itself);
// Release, Close, the waits and the accessors from any thread.
#ifndef HALKA_CORE_SHM_RING_H_
#define HALKA_CORE_SHM_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "common/shm_guard.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/futex.h"

namespace halka {

class ShmRing : public std::enable_shared_from_this<ShmRing> {
 public:
  static constexpr size_t kRecordHead = 64;
  static constexpr uint32_t kFirst = 1;  // the frame's first record
  static constexpr uint32_t kLast = 2;   // the frame's last record
  static constexpr uint32_t kWrap = 4;   // filler up to the end of the ring

  // Creates, sizes and maps a new object named like a client's held
  // object (common/held_shm.h: a shared flock while mapped, so a worker's
  // sweep removes it if this process dies before Unlink). `capacity` is
  // clamped to [64 KiB, 256 MiB] and rounded up to whole pages; the pages
  // are reserved now (a full /dev/shm fails here, not as SIGBUS later).
  // Errors: RESOURCE_EXHAUSTED naming the failing call.
  static absl::StatusOr<std::shared_ptr<ShmRing>> Create(size_t capacity);
  // The largest ring Open maps (and Create makes).
  static constexpr size_t kMaxCapacity = size_t{256} << 20;
  // Maps an object another process created, if its capacity is at most
  // `max_capacity` (looked at before anything is mapped: the mapping is
  // populated, so its pages are this process's). Errors: NOT_FOUND (no
  // such object here: another /dev/shm), FAILED_PRECONDITION (not a ring,
  // another token, larger than allowed).
  static absl::StatusOr<std::shared_ptr<ShmRing>> Open(
      const std::string& name, const std::string& token_hex,
      size_t max_capacity = kMaxCapacity);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  const std::string& name() const { return name_; }
  std::string token_hex() const;
  size_t capacity() const { return capacity_; }
  // Removes the name (both ends keep their mapping). Idempotent.
  void Unlink();

  // Marks the ring closed and wakes both ends. Idempotent.
  void Close();
  bool closed() const;
  // The object shrank under this mapping (truncated or resized by another
  // process): nothing read from it since is the peer's. Next fails.
  bool broken() const { return guard_ != nullptr && guard_->broken(); }

  // --- producer ---
  // Writes the whole frame (the concatenation of `parts`, `total` bytes)
  // if the ring has room for all its records now; false otherwise (nothing
  // written).
  bool TryWrite(absl::Span<const absl::Span<const uint8_t>> parts,
                size_t total);
  // The same for one contiguous buffer.
  bool TryWrite(absl::string_view bytes);
  // Writes the next record of a frame (the bytes from `*done` on), if room
  // for it; advances *done. Returns false when there is no room now.
  bool TryWriteRecord(absl::Span<const absl::Span<const uint8_t>> parts,
                      size_t total, size_t* done);
  // Sleeps until the consumer frees space after `seq` (read with
  // SpaceSeq() before the TryWrite that found no room), Close, or
  // `timeout`.
  uint32_t SpaceSeq() const;
  void WaitForSpace(uint32_t seq, absl::Duration timeout);

  // --- consumer ---
  struct Record {
    uint64_t id = 0;  // pass to Release
    const uint8_t* data = nullptr;
    size_t bytes = 0;
    uint32_t flags = 0;  // kFirst / kLast
    uint64_t frame_bytes = 0;
  };
  // The next record, waiting up to `timeout`; nullopt when none came (or
  // the ring is closed and drained: see closed()). WRAP records are
  // skipped. Errors: DATA_LOSS (the shared header or a record is corrupt).
  absl::StatusOr<std::optional<Record>> Next(absl::Duration timeout);
  // For a consumer that sleeps outside the lock that serialises its Next
  // calls: the data sequence now (read it before the Next that found
  // nothing), and a sleep until it moves (a record, a Close) or `timeout`.
  uint32_t DataSeq() const;
  void WaitForData(uint32_t seq, absl::Duration timeout);
  // For a thread that sleeps on several rings at once (FutexWaitAny):
  // the word to wait on, and ConsumerSleeping(true) before it sleeps (so
  // the producer wakes it), false after.
  FutexWaiter DataWaiter(uint32_t seq) const;
  void ConsumerSleeping(bool sleeping);
  // Frees a record returned by Next. Idempotent per id; any thread.
  void Release(uint64_t id);
  // The producer's position now, and the consumer's (both in bytes): a
  // reader that stops drains up to a snapshot of the first, never more.
  uint64_t Published() const;
  uint64_t read_position() const { return read_; }

  // How long this ring's consumer polls it for a record before it sleeps
  // on the futex (0, the default: it sleeps at once). Each reader sets its
  // own ring's, from its own setting: a worker's --shm_spin_us for the
  // rings of its links and SDK sessions, Client::Options::shm_spin for a
  // client's; so workers sharing a process keep theirs. Polling saves the
  // wake-up (a futex call each side, a context switch) when the record
  // comes within that time, and burns a core meanwhile: it can only pay on
  // a host with idle cores (on 2 cores 20 us of it took 4 KiB at G = 4
  // from 511 to 742 us,
  // docs/performance.md). Clamped to [0, 1 ms]. Any thread.
  void set_spin_before_sleep(absl::Duration spin);
  absl::Duration spin_before_sleep() const;
  // How many times this ring's consumer has gone to sleep on its futex
  // (tests and diagnostics).
  uint64_t consumer_sleeps() const;

 private:
  struct Header;
  ShmRing(std::string name, void* base, size_t mapped, size_t capacity,
          bool owner);
  size_t MaxRecordPayload() const;
  void AdvanceTailLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(release_mu_);

  Header* header() const;
  uint8_t* data() const;
  // Writes one record head + payload at position `pos`.
  void PutRecord(uint64_t pos, uint32_t flags, uint64_t frame_bytes,
                 absl::Span<const absl::Span<const uint8_t>> parts,
                 size_t from, size_t n);
  // Writes the record holding the frame's bytes from *done on (a WRAP
  // filler first if it does not fit before the end) at `pos`; advances
  // *done and returns the position after it. Publishes nothing.
  uint64_t PlaceRecord(uint64_t pos,
                       absl::Span<const absl::Span<const uint8_t>> parts,
                       size_t total, size_t* done);
  // How far into the ring an empty ring's next frame may go back to its
  // start (TryWrite): a quarter of it, at most 256 KiB.
  size_t RewindAfter() const;
  // The position after a frame of `total` bytes whose records start at
  // `pos` (WRAP fillers included).
  uint64_t EndOfRecords(uint64_t pos, size_t total) const;
  size_t FreeBytes() const;
  void Publish(uint64_t new_head);
  // Polls for a record or a close for up to spin_before_sleep() (at most
  // `left`); true when one came.
  bool SpinForRecord(absl::Duration left) const;

  std::string name_;
  void* base_;
  size_t mapped_;
  // Another process may shrink the object under the mapping: the guard
  // turns the SIGBUS into zero pages and broken() (common/shm_guard.h).
  std::unique_ptr<ShmGuard> guard_;
  size_t capacity_;
  const bool owner_;  // created it: unlinks it at the latest when destroyed
  std::atomic<bool> unlinked_{false};
  std::atomic<int64_t> spin_ns_{0};  // set_spin_before_sleep
  std::atomic<uint64_t> consumer_sleeps_{0};

  // Producer-local.
  uint64_t head_ = 0;

  // Consumer-local.
  uint64_t read_ = 0;
  // What the consumer has freed: the producer may never be more than a
  // capacity ahead of it (a record still held would be overwritten).
  std::atomic<uint64_t> freed_{0};
  absl::Mutex release_mu_;
  struct Pending {
    uint64_t end;
    bool released;
  };
  // Records handed out and not yet freed, by id (their start), in order.
  std::deque<std::pair<uint64_t, Pending>> held_ ABSL_GUARDED_BY(release_mu_);
};

// This process's network namespace ("net:[4026531840]"), "" if unknown.
// Processes in one namespace on one host may share a ring; separate
// namespaces stand for separate hosts.
std::string NetworkNamespaceId();

// How a ring is named to the process that should map it:
// "<name> <token> <netns>".
struct ShmOffer {
  std::string name;
  std::string token_hex;
  std::string netns;
};
std::string FormatShmOffer(const ShmRing& ring);
std::optional<ShmOffer> ParseShmOffer(const std::string& value);

// The serving side's decision on an offer: the mapped ring, or why not
// (the text of the "no: ..." answer). Rings over `max_capacity` are
// refused.
absl::StatusOr<std::shared_ptr<ShmRing>> AcceptShmOffer(
    const std::string& value, size_t max_capacity = ShmRing::kMaxCapacity);

// Each ring of an SDK session (client/shm_session.h) holds one small record
// at a time: the least a ring has. A worker maps no larger one for a
// session.
inline constexpr size_t kSessionRingBytes = size_t{64} << 10;

}  // namespace halka

#endif  // HALKA_CORE_SHM_RING_H_
