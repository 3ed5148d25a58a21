// ShmRing: the shared-memory record ring of same-host peer links.
#include "core/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace halka {
namespace {

using Parts = std::vector<absl::Span<const uint8_t>>;

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

struct Pair {
  std::shared_ptr<ShmRing> tx, rx;
};

Pair MakePair(size_t capacity) {
  auto tx = ShmRing::Create(capacity);
  EXPECT_TRUE(tx.ok()) << tx.status();
  auto rx = ShmRing::Open((*tx)->name(), (*tx)->token_hex());
  EXPECT_TRUE(rx.ok()) << rx.status();
  return {*tx, *rx};
}

ShmRing::Record MustNext(ShmRing& rx) {
  auto r = rx.Next(absl::Seconds(10));
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->has_value()) << "no record within 10 s";
  return r->value_or(ShmRing::Record{});
}

TEST(ShmRing, FrameArrivesWholeAlignedAndUncopiedUntilReleased) {
  Pair p = MakePair(64 << 10);
  const std::vector<uint8_t> head = Pattern(13, 1), body = Pattern(5000, 2);
  const Parts parts = {absl::MakeConstSpan(head), absl::MakeConstSpan(body)};
  ASSERT_TRUE(p.tx->TryWrite(parts, head.size() + body.size()));
  const ShmRing::Record r = MustNext(*p.rx);
  ASSERT_EQ(r.bytes, 5013u);
  EXPECT_EQ(r.flags, ShmRing::kFirst | ShmRing::kLast);
  EXPECT_EQ(r.frame_bytes, 5013u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data) % 64, 0u);
  EXPECT_EQ(std::memcmp(r.data, head.data(), head.size()), 0);
  EXPECT_EQ(std::memcmp(r.data + 13, body.data(), body.size()), 0);
  // Nothing more, and the space stays taken until Release.
  auto none = p.rx->Next(absl::Milliseconds(1));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  const std::vector<uint8_t> big = Pattern(p.tx->capacity() / 4 - 64, 3);
  const Parts bp = {absl::MakeConstSpan(big)};
  int written = 0;
  while (p.tx->TryWrite(bp, big.size())) ++written;
  EXPECT_EQ(written, 3);
  // The later records are taken and freed, but the held one keeps the
  // ring's oldest space: still no room until it goes.
  for (int i = 0; i < written; ++i) p.rx->Release(MustNext(*p.rx).id);
  EXPECT_FALSE(p.tx->TryWrite(bp, big.size()))
      << "the held record must keep its space";
  p.rx->Release(r.id);
  EXPECT_TRUE(p.tx->TryWrite(bp, big.size()));
}

TEST(ShmRing, RecordsWrapAndSpaceFreesOnlyOverTheReleasedPrefix) {
  Pair p = MakePair(64 << 10);
  std::vector<std::vector<uint8_t>> sent;
  std::vector<ShmRing::Record> got;
  // Fill about three quarters, consume it all, then fill across the end
  // (a small frame held meanwhile keeps the ring from being empty, which
  // would start the second round at the ring's beginning).
  std::vector<uint8_t> small = Pattern(100, 7);
  ShmRing::Record keeper;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 6; ++i) {
      sent.push_back(Pattern(7000 + 1000 * i, 10 + sent.size()));
      ASSERT_TRUE(p.tx->TryWrite({absl::MakeConstSpan(sent.back())},
                                 sent.back().size()))
          << "round " << round << " frame " << i;
      got.push_back(MustNext(*p.rx));
      ASSERT_EQ(got.back().bytes, sent.back().size());
      EXPECT_EQ(std::memcmp(got.back().data, sent.back().data(),
                            sent.back().size()), 0);
    }
    // Release newest first: nothing frees until the oldest goes.
    const std::vector<uint8_t> probe = Pattern(30000, 99);
    for (size_t k = got.size(); k-- > 1;) p.rx->Release(got[k].id);
    EXPECT_FALSE(p.tx->TryWrite({absl::MakeConstSpan(probe)}, probe.size()))
        << "round " << round;
    if (round == 0) {
      ASSERT_TRUE(p.tx->TryWrite({absl::MakeConstSpan(small)}, small.size()));
      keeper = MustNext(*p.rx);
    }
    p.rx->Release(got[0].id);
    got.clear();
  }
  p.rx->Release(keeper.id);
}

TEST(ShmRing, AFrameThatFindsTheRingEmptyPastAQuarterStartsAtItsBeginning) {
  Pair p = MakePair(64 << 10);  // rewinds past 16 KiB
  const size_t rec = ShmRing::kRecordHead + 4096;
  auto send = [&](uint32_t seed, size_t n = 4096) {
    const std::vector<uint8_t> v = Pattern(n, seed);
    EXPECT_TRUE(p.tx->TryWrite({absl::MakeConstSpan(v)}, v.size()));
    ShmRing::Record r = MustNext(*p.rx);
    EXPECT_EQ(r.bytes, v.size());
    EXPECT_EQ(std::memcmp(r.data, v.data(), v.size()), 0);
    return r;
  };
  // Frames released one by one walk the first quarter (four of them end
  // at 16,640 bytes); the fifth finds the ring empty past it and goes back
  // to the start, after a WRAP filler the reader skips.
  const ShmRing::Record first = send(1);
  p.rx->Release(first.id);
  for (uint32_t k = 1; k < 4; ++k) {
    const ShmRing::Record r = send(1 + k);
    EXPECT_EQ(r.data, first.data + k * rec) << "frame " << k;
    p.rx->Release(r.id);
  }
  const ShmRing::Record back = send(5);
  EXPECT_EQ(back.data, first.data);
  // Not empty (back held): the next follows it, however far in.
  const ShmRing::Record next = send(6);
  EXPECT_EQ(next.data, back.data + rec);
  p.rx->Release(back.id);
  p.rx->Release(next.id);
  // Walk past the quarter again; a frame larger than half the room before
  // the position stays where it is.
  for (uint32_t k = 0; k < 2; ++k) p.rx->Release(send(7 + k).id);
  const ShmRing::Record big = send(9, 12000);  // 4 frames in: 16,640 bytes
  EXPECT_EQ(big.data, first.data + 4 * rec);
  p.rx->Release(big.id);
  EXPECT_EQ(p.rx->read_position(), p.tx->Published());
}

TEST(ShmRing, LargeFramesTravelAsSeveralRecordsInOrder) {
  Pair p = MakePair(64 << 10);
  const std::vector<uint8_t> frame = Pattern(200000, 7);  // > capacity
  const Parts parts = {absl::MakeConstSpan(frame)};
  EXPECT_FALSE(p.tx->TryWrite(parts, frame.size()));
  std::thread producer([&] {
    size_t done = 0;
    while (done < frame.size()) {
      const uint32_t seq = p.tx->SpaceSeq();
      if (!p.tx->TryWriteRecord(parts, frame.size(), &done)) {
        p.tx->WaitForSpace(seq, absl::Milliseconds(50));
      }
    }
  });
  std::vector<uint8_t> back;
  int records = 0;
  for (;;) {
    const ShmRing::Record r = MustNext(*p.rx);
    if (r.data == nullptr) break;
    EXPECT_EQ(r.frame_bytes, frame.size());
    EXPECT_EQ((r.flags & ShmRing::kFirst) != 0, records == 0);
    back.insert(back.end(), r.data, r.data + r.bytes);
    p.rx->Release(r.id);
    ++records;
    if (r.flags & ShmRing::kLast) break;
  }
  producer.join();
  EXPECT_GT(records, 10);
  EXPECT_EQ(back, frame);
}

TEST(ShmRing, OpenRefusesWhatIsNotThisRing) {
  auto tx = ShmRing::Create(64 << 10);
  ASSERT_TRUE(tx.ok());
  std::string other = (*tx)->token_hex();
  other[0] = other[0] == '0' ? '1' : '0';
  // Another token, no such object, an object that is no ring: the same
  // PERMISSION_DENIED in the same words (nothing about an object the
  // offer cannot open is revealed).
  auto wrong = ShmRing::Open((*tx)->name(), other);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied)
      << wrong.status();
  auto none = ShmRing::Open("/halka-held-0-0-none", other);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kPermissionDenied);
  auto words = [](const absl::Status& st, const std::string& name) {
    std::string m(st.message());
    m.erase(m.find(name), name.size());
    return m;
  };
  EXPECT_EQ(words(wrong.status(), (*tx)->name()),
            words(none.status(), "/halka-held-0-0-none"));
  EXPECT_EQ(ShmRing::Open("/etc/passwd", other).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Gone once unlinked: the peer must map it before the sender drops it.
  (*tx)->Unlink();
  EXPECT_EQ(ShmRing::Open((*tx)->name(), (*tx)->token_hex()).status().code(),
            absl::StatusCode::kPermissionDenied);
}

// A sender that writes nonsense into the shared header or a record is
// refused with DATA_LOSS, never read past the ring.
TEST(ShmRing, CorruptSharedStateIsDataLoss) {
  for (int mode = 0; mode < 2; ++mode) {
    Pair p = MakePair(64 << 10);
    const std::vector<uint8_t> body = Pattern(100, 5);
    ASSERT_TRUE(p.tx->TryWrite({absl::MakeConstSpan(body)}, body.size()));
    const int fd = shm_open(p.tx->name().c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    auto* raw = static_cast<uint8_t*>(
        mmap(nullptr, 4096 + 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    ASSERT_NE(raw, MAP_FAILED);
    if (mode == 0) {
      const uint64_t far = uint64_t{1} << 40;  // the producer's position
      std::memcpy(raw + 64, &far, sizeof(far));
    } else {
      const uint32_t huge = 0x7fffffff;  // the first record's length
      std::memcpy(raw + 4096, &huge, sizeof(huge));
    }
    auto r = p.rx->Next(absl::Seconds(1));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss)
        << "mode " << mode << ": " << r.status();
    munmap(raw, 4096 + 64);
  }
}

TEST(ShmRing, CloseWakesBothEndsAndTheReaderDrainsFirst) {
  Pair p = MakePair(64 << 10);
  const std::vector<uint8_t> body = Pattern(1000, 6);
  ASSERT_TRUE(p.tx->TryWrite({absl::MakeConstSpan(body)}, body.size()));
  std::atomic<bool> reader_done{false}, writer_done{false};
  std::thread reader([&] {
    const ShmRing::Record r = MustNext(*p.rx);  // written before Close
    EXPECT_EQ(r.bytes, 1000u);
    auto next = p.rx->Next(absl::Seconds(60));  // then Close wakes it
    EXPECT_TRUE(next.ok());
    EXPECT_FALSE(next->has_value());
    reader_done = true;
  });
  std::thread writer([&] {
    p.tx->WaitForSpace(p.tx->SpaceSeq(), absl::Seconds(60));
    writer_done = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  p.tx->Close();
  reader.join();
  writer.join();
  EXPECT_TRUE(reader_done && writer_done);
  EXPECT_TRUE(p.rx->closed());
}

// A reader that polls before it sleeps (ShmRing::set_spin_before_sleep):
// polls, then sleeps; never past its timeout; never sleeps when the timeout
// ends inside the poll; without polling it sleeps at once. The setting is
// the ring's own: another ring of this process, set otherwise, keeps its
// own. And with polling it still gets every record in order, and sees a
// close.
TEST(ShmRing, PollingBeforeSleepingChangesNothingButTheWait) {
  Pair p = MakePair(64 << 10);
  Pair other = MakePair(64 << 10);
  EXPECT_EQ(p.rx->spin_before_sleep(), absl::ZeroDuration());  // the default
  p.rx->set_spin_before_sleep(absl::Seconds(5));
  EXPECT_EQ(p.rx->spin_before_sleep(), absl::Milliseconds(1));
  p.rx->set_spin_before_sleep(absl::Microseconds(-3));
  EXPECT_EQ(p.rx->spin_before_sleep(), absl::ZeroDuration());

  // Without polling: asleep at once.
  uint64_t sleeps = p.rx->consumer_sleeps();
  auto none = p.rx->Next(absl::Milliseconds(5));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_GT(p.rx->consumer_sleeps(), sleeps) << "no sleep without polling";

  p.rx->set_spin_before_sleep(absl::Milliseconds(1));
  EXPECT_EQ(other.rx->spin_before_sleep(), absl::ZeroDuration());
  // A timeout inside the poll: the reader never sleeps; the other ring's,
  // which does not poll, sleeps at once.
  sleeps = p.rx->consumer_sleeps();
  const uint64_t other_sleeps = other.rx->consumer_sleeps();
  absl::Time t0 = absl::Now();
  none = p.rx->Next(absl::Microseconds(300));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_GE(absl::Now() - t0, absl::Microseconds(300));
  EXPECT_EQ(p.rx->consumer_sleeps(), sleeps) << "slept inside the poll";
  none = other.rx->Next(absl::Microseconds(300));
  ASSERT_TRUE(none.ok());
  EXPECT_GT(other.rx->consumer_sleeps(), other_sleeps)
      << "the other ring polled with this one's setting";
  // A timeout past the poll: polls, then sleeps, and keeps the timeout.
  t0 = absl::Now();
  none = p.rx->Next(absl::Milliseconds(20));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(20));
  EXPECT_GT(p.rx->consumer_sleeps(), sleeps) << "polled past the poll time";

  // Records 0..199 written with pauses from none (caught while polling) to
  // 3 ms (after the reader fell asleep).
  std::thread writer([&] {
    for (uint32_t i = 0; i < 200; ++i) {
      const std::vector<uint8_t> body = Pattern(100 + i, i);
      while (!p.tx->TryWrite({absl::MakeConstSpan(body)}, body.size())) {
        absl::SleepFor(absl::Microseconds(50));
      }
      if (i % 50 == 49) absl::SleepFor(absl::Milliseconds(3));
      else if (i % 3 == 0) absl::SleepFor(absl::Microseconds(100));
    }
  });
  for (uint32_t i = 0; i < 200; ++i) {
    const ShmRing::Record r = MustNext(*p.rx);
    const std::vector<uint8_t> want = Pattern(100 + i, i);
    ASSERT_EQ(r.bytes, want.size()) << "record " << i;
    EXPECT_EQ(std::memcmp(r.data, want.data(), want.size()), 0) << i;
    p.rx->Release(r.id);
  }
  writer.join();
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(5));
    p.tx->Close();
  });
  auto closed = p.rx->Next(absl::Seconds(60));
  closer.join();
  ASSERT_TRUE(closed.ok());
  EXPECT_FALSE(closed->has_value());
  EXPECT_TRUE(p.rx->closed());
}

// Another process, as in production: 2,000 frames of random sizes, with
// the child releasing them out of order, arrive bit for bit and in order.
TEST(ShmRing, AcrossProcessesEveryFrameArrivesInOrder) {
  // 1 MiB: every frame is one record; the child holds up to three.
  auto tx = ShmRing::Create(1 << 20);
  ASSERT_TRUE(tx.ok());
  const std::string name = (*tx)->name(), token = (*tx)->token_hex();
  constexpr int kFrames = 2000;
  auto size_of = [](int i) {
    return static_cast<size_t>(1 + (i * 7919) % 150000);
  };
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto rx = ShmRing::Open(name, token);
    if (!rx.ok()) _exit(2);
    std::vector<uint64_t> held;
    std::vector<uint8_t> frame;
    for (int i = 0; i < kFrames; ++i) {
      frame.clear();
      for (;;) {
        auto r = (*rx)->Next(absl::Seconds(20));
        if (!r.ok() || !r->has_value()) _exit(3);
        frame.insert(frame.end(), (*r)->data, (*r)->data + (*r)->bytes);
        held.push_back((*r)->id);
        if ((*r)->flags & ShmRing::kLast) break;
      }
      if (frame != Pattern(size_of(i), static_cast<uint32_t>(i))) _exit(4);
      if (held.size() >= 3) {  // newest first
        for (auto it = held.rbegin(); it != held.rend(); ++it) {
          (*rx)->Release(*it);
        }
        held.clear();
      }
    }
    _exit(0);
  }
  for (int i = 0; i < kFrames; ++i) {
    const std::vector<uint8_t> f = Pattern(size_of(i), static_cast<uint32_t>(i));
    const Parts parts = {absl::MakeConstSpan(f)};
    size_t done = 0;
    if ((*tx)->TryWrite(parts, f.size())) continue;
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (done < f.size()) {
      const uint32_t seq = (*tx)->SpaceSeq();
      if (!(*tx)->TryWriteRecord(parts, f.size(), &done)) {
        ASSERT_LT(absl::Now(), give_up) << "the child stopped taking frames";
        (*tx)->WaitForSpace(seq, absl::Milliseconds(50));
      }
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "2: open failed, 3: a frame did not arrive, 4: a frame differs";
}

}  // namespace
}  // namespace halka
