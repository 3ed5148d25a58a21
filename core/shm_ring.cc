#include "core/shm_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "openssl/crypto.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/held_shm.h"
#include "core/payload.h"

namespace halka {
namespace {

constexpr uint64_t kMagic = 0x474e5252414b4c48ULL;  // "HLKARRNG"
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kMinCapacity = size_t{64} << 10;

size_t Pad(size_t n) { return (n + 63) / 64 * 64; }

struct RecordHead {
  uint32_t bytes;
  uint32_t flags;
  uint64_t frame_bytes;
};

}  // namespace

struct ShmRing::Header {
  uint64_t magic;
  uint64_t capacity;
  uint8_t token[16];
  alignas(64) std::atomic<uint64_t> head;  // bytes published
  std::atomic<uint32_t> head_seq;
  std::atomic<uint32_t> consumer_sleeping;
  alignas(64) std::atomic<uint64_t> tail;  // bytes freed
  std::atomic<uint32_t> tail_seq;
  std::atomic<uint32_t> producer_sleeping;
  alignas(64) std::atomic<uint32_t> closed;
};
static_assert(sizeof(std::atomic<uint64_t>) == 8 &&
                  std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the ring's header needs lock-free atomics");

ShmRing::ShmRing(std::string name, void* base, size_t mapped, size_t capacity,
                 bool owner)
    : name_(std::move(name)),
      base_(base),
      mapped_(mapped),
      guard_(ShmGuard::Guard(base, mapped)),
      capacity_(capacity),
      owner_(owner) {
  static_assert(sizeof(Header) <= kHeaderBytes);
}

ShmRing::~ShmRing() {
  if (owner_) Unlink();
  guard_.reset();  // before the range goes
  munmap(base_, mapped_);
}

ShmRing::Header* ShmRing::header() const {
  return static_cast<Header*>(base_);
}
uint8_t* ShmRing::data() const {
  return static_cast<uint8_t*>(base_) + kHeaderBytes;
}

absl::StatusOr<std::shared_ptr<ShmRing>> ShmRing::Create(size_t capacity) {
  const std::string name = NewHeldShmName();
  // Whole pages, so that the object's size tells the opener the capacity.
  capacity = std::min(kMaxCapacity, std::max(kMinCapacity, capacity));
  capacity = (capacity + kHeaderBytes - 1) / kHeaderBytes * kHeaderBytes;
  // Reserved now: a full /dev/shm (a container's is 64 MiB by default)
  // must fail here, cleanly, and not as SIGBUS on a later write.
  absl::StatusOr<HeldShm> made =
      CreateHeldShm(name, kHeaderBytes + capacity, /*reserve=*/true);
  if (!made.ok()) {
    return absl::Status(made.status().code(),
                        absl::StrCat("link ring: ", made.status().message()));
  }
  void* p = made->data;
  const size_t size = made->size;
  capacity = size - kHeaderBytes;
  auto ring = std::shared_ptr<ShmRing>(new ShmRing(name, p, size, capacity,
                                                   /*owner=*/true));
  Header* h = ring->header();
  h->capacity = capacity;
  std::random_device rd;
  for (size_t i = 0; i < sizeof(h->token); i += 4) {
    const uint32_t v = rd();
    std::memcpy(h->token + i, &v, 4);
  }
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return ring;
}

absl::StatusOr<std::shared_ptr<ShmRing>> ShmRing::Open(
    const std::string& name, const std::string& token_hex,
    size_t max_capacity) {
  if (!absl::StartsWith(name, absl::StrCat("/", kHeldShmPrefix)) ||
      name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a link ring's name"));
  }
  // Whatever is wrong (no such object, another kind of object, another
  // ring, the wrong size), the same words: an offer names any object it
  // likes, and the answer must say nothing about one it does not own.
  const absl::Status not_yours = absl::PermissionDeniedError(absl::StrCat(
      "link ring ", name, " is not one this offer's token opens (or this "
      "worker cannot see it); nothing was mapped"));
  const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW, 0);
  if (fd < 0) return not_yours;
  struct stat st {};
  Header hh{};
  // The header read with pread, not mapped: an object that shrinks under
  // us cannot raise SIGBUS here.
  const bool readable =
      fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<size_t>(st.st_size) >= kHeaderBytes + kMinCapacity &&
      pread(fd, &hh, sizeof(hh), 0) == static_cast<ssize_t>(sizeof(hh));
  const size_t size = readable ? static_cast<size_t>(st.st_size) : 0;
  const bool is_ring = readable && hh.magic == kMagic &&
                       hh.capacity == size - kHeaderBytes &&
                       hh.capacity % 64 == 0 && hh.capacity <= kMaxCapacity;
  const std::string token =
      is_ring ? absl::BytesToHexString(absl::string_view(
                    reinterpret_cast<const char*>(hh.token), sizeof(hh.token)))
              : std::string();
  if (!is_ring || token.size() != token_hex.size() ||
      CRYPTO_memcmp(token.data(), token_hex.data(), token.size()) != 0) {
    close(fd);
    return not_yours;
  }
  // Only now, for the ring the caller proved it knows: its size against
  // what this worker allows.
  if (size - kHeaderBytes > std::min(max_capacity, kMaxCapacity)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        name, " holds ", size - kHeaderBytes, " bytes of records, over the ",
        std::min(max_capacity, kMaxCapacity), " allowed here"));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map link ring ", name, ": ", std::strerror(err)));
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return std::shared_ptr<ShmRing>(
      new ShmRing(name, p, size, size - kHeaderBytes, /*owner=*/false));
}

std::string ShmRing::token_hex() const {
  return absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(header()->token), sizeof(Header::token)));
}

void ShmRing::Unlink() {
  if (!unlinked_.exchange(true)) shm_unlink(name_.c_str());
}

void ShmRing::Close() {
  Header* h = header();
  if (h->closed.exchange(1) != 0) return;
  h->head_seq.fetch_add(1);
  h->tail_seq.fetch_add(1);
  FutexWakeAll(&h->head_seq);
  FutexWakeAll(&h->tail_seq);
}

bool ShmRing::closed() const { return header()->closed.load() != 0; }

uint64_t ShmRing::Published() const {
  return header()->head.load(std::memory_order_acquire);
}

size_t ShmRing::MaxRecordPayload() const { return capacity_ / 4 - 64; }

void ShmRing::PutRecord(uint64_t pos, uint32_t flags, uint64_t frame_bytes,
                        absl::Span<const absl::Span<const uint8_t>> parts,
                        size_t from, size_t n) {
  uint8_t* at = data() + pos % capacity_;
  const RecordHead rh{static_cast<uint32_t>(n), flags, frame_bytes};
  std::memcpy(at, &rh, sizeof(rh));
  if (n > 0) CopyPieceBytes(parts, from, n, at + kRecordHead);
}

void ShmRing::Publish(uint64_t new_head) {
  Header* h = header();
  h->head.store(new_head, std::memory_order_release);
  h->head_seq.fetch_add(1);
  if (h->consumer_sleeping.load() != 0) FutexWakeAll(&h->head_seq);
}

uint64_t ShmRing::PlaceRecord(uint64_t pos,
                              absl::Span<const absl::Span<const uint8_t>> parts,
                              size_t total, size_t* done) {
  const size_t n = std::min(total - *done, MaxRecordPayload());
  const size_t rec = kRecordHead + Pad(n);
  const size_t to_end = capacity_ - pos % capacity_;
  if (to_end < rec) {
    PutRecord(pos, kWrap, 0, parts, 0, 0);
    pos += to_end;
  }
  const uint32_t flags =
      (*done == 0 ? kFirst : 0) | (*done + n == total ? kLast : 0);
  PutRecord(pos, flags, total, parts, *done, n);
  *done += n;
  return pos + rec;
}

size_t ShmRing::FreeBytes() const {
  const uint64_t tail = header()->tail.load(std::memory_order_acquire);
  return capacity_ - static_cast<size_t>(head_ - tail);
}

bool ShmRing::TryWrite(absl::string_view bytes) {
  const absl::Span<const uint8_t> part(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return TryWrite(absl::MakeConstSpan(&part, 1), bytes.size());
}

bool ShmRing::TryWriteRecord(absl::Span<const absl::Span<const uint8_t>> parts,
                             size_t total, size_t* done) {
  const size_t rec =
      kRecordHead + Pad(std::min(total - *done, MaxRecordPayload()));
  const size_t to_end = capacity_ - head_ % capacity_;
  if ((to_end < rec ? to_end : 0) + rec > FreeBytes()) return false;
  head_ = PlaceRecord(head_, parts, total, done);
  Publish(head_);
  return true;
}

size_t ShmRing::RewindAfter() const {
  return std::min(capacity_ / 4, size_t{256} << 10);
}

uint64_t ShmRing::EndOfRecords(uint64_t pos, size_t total) const {
  size_t left = total;
  do {
    const size_t piece = std::min(left, MaxRecordPayload());
    const size_t rec = kRecordHead + Pad(piece);
    const size_t to_end = capacity_ - pos % capacity_;
    pos += (to_end < rec ? to_end : 0) + rec;
    left -= piece;
  } while (left > 0);
  return pos;
}

bool ShmRing::TryWrite(absl::Span<const absl::Span<const uint8_t>> parts,
                       size_t total) {
  // An empty ring (every record released) that the writer has walked at
  // least RewindAfter() into takes the frame at its start, after a WRAP
  // filler: frames that each find the ring empty (small ones) then reuse
  // its first pages, warm in both ends' caches, instead of walking all of
  // it. Until the reader skips the filler, the ring holds only the room
  // before the old position: the frame takes at most half of it, so that
  // the frames after it still fit. Readers skip the filler as any other.
  const size_t off = static_cast<size_t>(head_ % capacity_);
  if (off >= RewindAfter() && FreeBytes() == capacity_ &&
      EndOfRecords(0, total) <= off / 2) {
    PutRecord(head_, kWrap, 0, parts, 0, 0);
    head_ += capacity_ - off;
  }
  // Where the records would end, wrap fillers included.
  if (EndOfRecords(head_, total) - head_ > FreeBytes()) return false;
  size_t done = 0;
  do {
    head_ = PlaceRecord(head_, parts, total, &done);
  } while (done < total);
  Publish(head_);  // once for the whole frame
  return true;
}

uint32_t ShmRing::SpaceSeq() const { return header()->tail_seq.load(); }

void ShmRing::WaitForSpace(uint32_t seq, absl::Duration timeout) {
  Header* h = header();
  h->producer_sleeping.store(1);
  if (h->closed.load() == 0) FutexWait(&h->tail_seq, seq, timeout);
  h->producer_sleeping.store(0);
}

absl::StatusOr<std::optional<ShmRing::Record>> ShmRing::Next(
    absl::Duration timeout) {
  Header* h = header();
  // A look (timeout zero: an operation's tap drains its rings between
  // polls) reads no clock: it returns at once when nothing is there.
  const bool waits = timeout > absl::ZeroDuration();
  const absl::Time deadline =
      waits ? halka::Now() + timeout : absl::InfinitePast();
  for (;;) {
    const uint32_t seq = h->head_seq.load();
    const uint64_t head = h->head.load(std::memory_order_acquire);
    if (broken()) {
      return absl::DataLossError(absl::StrCat(
          "link ring ", name_, " shrank under its mapping (truncated or "
          "resized by another process): the link cannot be trusted"));
    }
    if (head != read_) {
      const uint64_t freed = freed_.load(std::memory_order_relaxed);
      if (head < read_ || head - freed > capacity_) {
        return absl::DataLossError(absl::StrCat(
            "link ring ", name_, ": the sender's position ", head,
            " is out of bounds (read ", read_, ", capacity ", capacity_,
            ")"));
      }
      const size_t off = static_cast<size_t>(read_ % capacity_);
      const size_t to_end = capacity_ - off;
      RecordHead rh;
      std::memcpy(&rh, data() + off, sizeof(rh));  // read once
      if (rh.flags == kWrap) {
        if (head - read_ < to_end) {
          return absl::DataLossError(absl::StrCat(
              "link ring ", name_, ": a wrap record past the sender's "
              "position"));
        }
        {
          absl::MutexLock lock(&release_mu_);
          held_.push_back({read_, Pending{read_ + to_end, true}});
          read_ += to_end;
          AdvanceTailLocked();
        }
        continue;
      }
      const size_t rec = kRecordHead + Pad(rh.bytes);
      if ((rh.flags & ~(kFirst | kLast)) != 0 || rh.bytes == 0 ||
          rh.bytes > MaxRecordPayload() || rec > to_end ||
          rec > head - read_ || rh.frame_bytes < rh.bytes) {
        return absl::DataLossError(absl::StrCat(
            "link ring ", name_, ": corrupt record at ", read_, " (",
            rh.bytes, " bytes, flags ", rh.flags, ")"));
      }
      Record r;
      r.id = read_;
      r.data = data() + off + kRecordHead;
      r.bytes = rh.bytes;
      r.flags = rh.flags;
      r.frame_bytes = rh.frame_bytes;
      {
        absl::MutexLock lock(&release_mu_);
        held_.push_back({read_, Pending{read_ + rec, false}});
      }
      read_ += rec;
      return std::optional<Record>(r);
    }
    if (h->closed.load() != 0) {
      // A record published just before the close is still delivered.
      if (h->head.load(std::memory_order_acquire) != read_) continue;
      return std::optional<Record>();
    }
    if (!waits) return std::optional<Record>();
    absl::Duration left = deadline - halka::Now();
    if (left <= absl::ZeroDuration()) return std::optional<Record>();
    if (spin_ns_.load(std::memory_order_relaxed) > 0) {
      if (SpinForRecord(left)) continue;
      left = deadline - halka::Now();  // the poll took some of it
      if (left <= absl::ZeroDuration()) return std::optional<Record>();
    }
    WaitForData(seq, left);  // `seq` was read before `head`
  }
}

uint32_t ShmRing::DataSeq() const { return header()->head_seq.load(); }

void ShmRing::WaitForData(uint32_t seq, absl::Duration timeout) {
  Header* h = header();
  // Announced before the word is compared, so that a Publish after the
  // comparison sees a sleeper and wakes it. A count, not a flag: a reader
  // and an operation's thread may both sleep on one ring (transport/shm/shm_link.h).
  ConsumerSleeping(true);
  if (h->head_seq.load() == seq && h->closed.load() == 0) {
    consumer_sleeps_.fetch_add(1, std::memory_order_relaxed);
    FutexWait(&h->head_seq, seq, timeout);
  }
  ConsumerSleeping(false);
}

FutexWaiter ShmRing::DataWaiter(uint32_t seq) const {
  return FutexWaiter{&header()->head_seq, seq, /*shared=*/true};
}

void ShmRing::ConsumerSleeping(bool sleeping) {
  if (sleeping) {
    header()->consumer_sleeping.fetch_add(1);
  } else {
    header()->consumer_sleeping.fetch_sub(1);
  }
}

void ShmRing::set_spin_before_sleep(absl::Duration spin) {
  const absl::Duration clamped =
      std::clamp(spin, absl::ZeroDuration(), absl::Milliseconds(1));
  spin_ns_.store(absl::ToInt64Nanoseconds(clamped));
}

absl::Duration ShmRing::spin_before_sleep() const {
  return absl::Nanoseconds(spin_ns_.load());
}

uint64_t ShmRing::consumer_sleeps() const { return consumer_sleeps_.load(); }

bool ShmRing::SpinForRecord(absl::Duration left) const {
  const int64_t spin = std::min(spin_ns_.load(std::memory_order_relaxed),
                                absl::ToInt64Nanoseconds(left));
  if (spin <= 0) return false;
  const Header* h = header();
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin);
  for (uint32_t i = 1;; ++i) {
    if (h->head.load(std::memory_order_acquire) != read_ ||
        h->closed.load() != 0) {
      return true;
    }
    CpuRelax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return false;
  }
}

void ShmRing::AdvanceTailLocked() {
  uint64_t tail = 0;
  bool moved = false;
  while (!held_.empty() && held_.front().second.released) {
    tail = held_.front().second.end;
    held_.pop_front();
    moved = true;
  }
  if (!moved) return;
  Header* h = header();
  freed_.store(tail, std::memory_order_relaxed);
  h->tail.store(tail, std::memory_order_release);
  h->tail_seq.fetch_add(1);
  if (h->producer_sleeping.load() != 0) FutexWakeAll(&h->tail_seq);
}

void ShmRing::Release(uint64_t id) {
  absl::MutexLock lock(&release_mu_);
  // Usually the oldest: search from the front.
  for (auto& [start, p] : held_) {
    if (start == id) {
      p.released = true;
      break;
    }
    if (start > id) break;
  }
  AdvanceTailLocked();
}

std::string NetworkNamespaceId() {
  char buf[128];
  const ssize_t n = readlink("/proc/self/ns/net", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

std::string FormatShmOffer(const ShmRing& ring) {
  return absl::StrCat(ring.name(), " ", ring.token_hex(), " ",
                      NetworkNamespaceId());
}

std::optional<ShmOffer> ParseShmOffer(const std::string& value) {
  std::vector<std::string> f = absl::StrSplit(value, ' ');
  if (f.size() != 3 || f[0].empty() || f[1].size() != 32) return std::nullopt;
  return ShmOffer{f[0], f[1], f[2]};
}

absl::StatusOr<std::shared_ptr<ShmRing>> AcceptShmOffer(
    const std::string& value, size_t max_capacity) {
  std::optional<ShmOffer> offer = ParseShmOffer(value);
  if (!offer.has_value()) {
    return absl::InvalidArgumentError("malformed shared-memory offer");
  }
  const std::string here = NetworkNamespaceId();
  if (here.empty() || offer->netns != here) {
    return absl::FailedPreconditionError(
        absl::StrCat("the peer runs in network namespace ", offer->netns,
                     ", this worker in ", here.empty() ? "?" : here));
  }
  return ShmRing::Open(offer->name, offer->token_hex, max_capacity);
}

}  // namespace halka
