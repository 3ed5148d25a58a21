// Inbox taps: the operation's thread takes a same-host link's records off
// its ring itself (transport/shm/shm_link.h ShmReceiver::tap, Inbox::AddTap)
// instead of waiting for the link's reader thread to hand them over.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "codec/frame_codec.h"
#include "core/futex.h"
#include "core/shm_ring.h"
#include "core/sub_ring.h"
#include "core/transport.h"
#include "tests/testing/data_meta.h"
#include "transport/shm/shm_link.h"

namespace halka {
namespace {

constexpr int kFrom = 1;

FrameMeta Meta(uint64_t op_seq, int step) {
  FrameMeta m = testing::DataChunkMeta(1, op_seq, Phase::kNaive, step, 4);
  m.sender_rank = kFrom;
  return m;
}

// Writes one frame (header and a 16-byte payload holding `value`).
bool WriteFrame(ShmRing& tx, const FrameMeta& m, uint32_t value) {
  const std::string head = EncodeFrameHead(m);
  std::vector<uint32_t> payload(4, value);
  const std::vector<absl::Span<const uint8_t>> parts = {
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(head.data()),
                          head.size()),
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(payload.data()),
                          payload.size() * sizeof(uint32_t))};
  return tx.TryWrite(parts, head.size() + payload.size() * sizeof(uint32_t));
}

uint32_t FirstWord(const InFrame& f) {
  uint32_t v = 0;
  if (!f.pieces.empty() && f.pieces[0].size() >= 4) {
    std::memcpy(&v, f.pieces[0].data(), 4);
  }
  return v;
}

// A link's receiving end as PeerService wires it: frames to the inbox,
// with the thread that delivered each one recorded.
struct Link {
  const int from_rank;
  std::shared_ptr<ShmRing> tx;
  std::shared_ptr<Inbox> inbox = std::make_shared<Inbox>(4);
  std::unique_ptr<ShmReceiver> rx;
  absl::Mutex mu;
  std::vector<std::thread::id> delivered_on ABSL_GUARDED_BY(mu);
  std::atomic<int> errors{0};
  std::atomic<int> rejected{0};
  std::atomic<bool> stopped{false};
  std::atomic<int> after_stop{0};

  // `from`: the rank its frames are delivered as; `shared`: an inbox other
  // links deliver to too.
  explicit Link(std::shared_ptr<Inbox> shared = nullptr, int from = kFrom)
      : from_rank(from) {
    if (shared != nullptr) inbox = std::move(shared);
    auto t = ShmRing::Create(1 << 20);
    EXPECT_TRUE(t.ok()) << t.status();
    tx = *t;
    auto r = ShmRing::Open(tx->name(), tx->token_hex());
    EXPECT_TRUE(r.ok()) << r.status();
    rx = std::make_unique<ShmReceiver>(
        *r,
        [this](absl::StatusOr<InFrame> f) -> absl::Status {
          if (stopped) ++after_stop;
          {
            absl::MutexLock lock(&mu);
            delivered_on.push_back(std::this_thread::get_id());
          }
          if (!f.ok()) {
            inbox->LinkFailed(from_rank, f.status());
            return f.status();
          }
          return inbox->Deliver(from_rank, *std::move(f));
        },
        [this](const absl::Status&) { ++rejected; },
        [this](const absl::Status& s) {
          ++errors;
          inbox->LinkFailed(kFrom, s);
        });
    inbox->AddTap(rx->tap());
  }
  ~Link() {
    stopped = true;
    rx->Stop();  // as InLink::OnDone does
    inbox->RemoveTap(rx->tap().get());
  }
  std::vector<std::thread::id> Delivered() {
    absl::MutexLock lock(&mu);
    return delivered_on;
  }
};

const std::vector<int> kWatch = {kFrom};

// A thread joined however the test ends (a failed ASSERT returns early).
class Joined {
 public:
  template <typename F>
  explicit Joined(F f) : t_(std::move(f)) {}
  ~Joined() { join(); }
  void join() {
    if (t_.joinable()) t_.join();
  }

 private:
  std::thread t_;
};

TEST(InboxTap, TheWaitingThreadTakesTheRecordsItself) {
  if (!FutexWaitAnyWorks()) {
    GTEST_SKIP() << "futex_waitv is not available here (the kernel lacks "
                    "it, or HALKA_FUTEX_WAITV=0): the link's reader delivers "
                    "(covered by the next case)";
  }
  Link link;
  // Let the reader go to sleep on its ring first.
  absl::SleepFor(absl::Milliseconds(100));
  Joined writer([&] {
    for (int i = 0; i < 50; ++i) {
      absl::SleepFor(absl::Milliseconds(2));
      ASSERT_TRUE(WriteFrame(*link.tx, Meta(7, i), 1000 + i));
    }
  });
  for (int i = 0; i < 50; ++i) {
    Inbox::Event ev = link.inbox->Next(kFrom, 7, kWatch,
                                       absl::Now() + absl::Seconds(10));
    ASSERT_EQ(ev.type, Inbox::Event::kFrame) << ev.status;
    EXPECT_EQ(ev.frame.meta.step, i);
    EXPECT_EQ(FirstWord(ev.frame), 1000u + i);
  }
  writer.join();
  const std::vector<std::thread::id> on = link.Delivered();
  ASSERT_EQ(on.size(), 50u);
  int mine = 0;
  for (const auto& id : on) mine += id == std::this_thread::get_id();
  // The reader may take a record in the instant before the first wait
  // attaches; every other one is taken by the waiting thread.
  EXPECT_GE(mine, 49) << "the waiting thread took only " << mine
                      << " of 50 records: the reader handed them over";
}

// An operation that runs behind its peer: each record is written while the
// operation is not waiting (it reduces, returns to its caller), and its
// next wait finds it. The link's reader stands aside between the waits
// (ShmReceiver), so the waiting thread takes them and no reader wakes for
// them; a record with no wait after it still reaches the inbox through the
// reader, once its slice ends.
TEST(InboxTap, TheReaderStandsAsideForRecordsWrittenBetweenAnOperationsWaits) {
  if (!FutexWaitAnyWorks()) {
    GTEST_SKIP() << "futex_waitv is not available here: the link's reader "
                    "delivers every record (WithoutFutexWaitv... covers it)";
  }
  Link link;
  // One slice for the whole run (the default 5 ms would give the reader a
  // record at each slice's end on a slow machine).
  link.rx->set_stand_aside(absl::Seconds(1));
  absl::SleepFor(absl::Milliseconds(100));  // the reader sleeps on its ring
  constexpr int kOps = 200;
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(WriteFrame(*link.tx, Meta(4, i), 500 + i));
    // Busy for a moment, not waiting: a reader asleep on the ring would be
    // woken by the record now and hand it over.
    absl::SleepFor(absl::Microseconds(200));
    Inbox::Event ev = link.inbox->Next(kFrom, 4, kWatch,
                                       absl::Now() + absl::Seconds(10));
    ASSERT_EQ(ev.type, Inbox::Event::kFrame) << ev.status;
    ASSERT_EQ(ev.frame.meta.step, i);
    ASSERT_EQ(FirstWord(ev.frame), 500u + i);
  }
  std::vector<std::thread::id> on = link.Delivered();
  ASSERT_EQ(on.size(), static_cast<size_t>(kOps));
  int mine = 0;
  for (const auto& id : on) mine += id == std::this_thread::get_id();
  // The reader takes the records written before it first saw an attach
  // (the first one or two), and one more only if this loop outlasts the
  // slice.
  EXPECT_GE(mine, kOps - 5)
      << "the waiting thread took only " << mine << " of " << kOps
      << " records: the reader woke for the others";
  EXPECT_GE(link.rx->stand_asides(), 1u);
  // No operation follows this one: the reader delivers it after its slice.
  ASSERT_TRUE(WriteFrame(*link.tx, Meta(4, kOps), 1));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (link.Delivered().size() < kOps + 1 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  on = link.Delivered();
  ASSERT_EQ(on.size(), static_cast<size_t>(kOps + 1))
      << "a record with no wait after it never reached the inbox";
  EXPECT_NE(on.back(), std::this_thread::get_id());
}

// Puts the link's reader in a long stand-aside, as after an operation's
// wait, and writes `frame` there: it stays in the ring (nobody is woken for
// it) until something calls the reader back.
void WriteWhileTheReaderStandsAside(Link& link, const FrameMeta& frame) {
  link.rx->set_stand_aside(absl::Seconds(60));
  const uint64_t before = link.rx->stand_asides();
  // An operation's wait (attach, detach), then a record the reader takes
  // (if it was asleep on the ring) or that waits with it (if it already
  // stood aside): either way it ends up standing aside.
  link.rx->tap()->Attach(true);
  link.rx->tap()->Attach(false);
  ASSERT_TRUE(WriteFrame(*link.tx, Meta(2, 0), 1));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (link.rx->stand_asides() == before && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_GT(link.rx->stand_asides(), before) << "the reader never stood aside";
  const size_t had = link.Delivered().size();
  ASSERT_TRUE(WriteFrame(*link.tx, frame, 2));
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_EQ(link.Delivered().size(), had)
      << "a record written while the reader stood aside woke it";
}

// A wait that does not take the ring's records (NextPeer: point-to-point
// messages) calls the standing-aside reader back at once instead of
// waiting out its slice.
TEST(InboxTap, APeerWaitCallsTheStandingAsideReaderBack) {
  if (!FutexWaitAnyWorks()) {
    GTEST_SKIP() << "futex_waitv is not available here: the reader never "
                    "stands aside";
  }
  Link link;
  FrameMeta m = Meta(1, 0);
  m.kind = FrameKind::kPeer;
  m.dtype = DType::kUInt8;
  m.offset = 0;
  m.count = 16;  // WriteFrame's payload
  m.message_bytes = 16;
  WriteWhileTheReaderStandsAside(link, m);
  if (HasFatalFailure()) return;
  const absl::Time start = absl::Now();
  Inbox::Event ev = link.inbox->NextPeer(kFrom, start + absl::Seconds(20));
  ASSERT_EQ(ev.type, Inbox::Event::kFrame) << ev.status;
  EXPECT_EQ(FirstWord(ev.frame), 2u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(15))
      << "the reader was not called back: it waited out its slice";
  EXPECT_NE(link.Delivered().back(), std::this_thread::get_id());
}

// A group's wait (core/sub_ring.h): the group's frames come through the
// job's links, whose rings the group's inbox does not tap; its wait calls
// the job inbox's readers back.
TEST(InboxTap, AGroupsWaitCallsTheJobsStandingAsideReaderBack) {
  if (!FutexWaitAnyWorks()) {
    GTEST_SKIP() << "futex_waitv is not available here: the reader never "
                    "stands aside";
  }
  Link link;
  auto group = std::make_shared<Inbox>(2);
  const std::vector<int> ranks = {0, kFrom};  // job rank kFrom: group rank 1
  const uint64_t id = GroupId(ranks);
  ASSERT_TRUE(link.inbox->AttachGroup(id, ranks, group).ok());
  FrameMeta m = Meta(3, 0);
  m.group = id;
  WriteWhileTheReaderStandsAside(link, m);
  if (HasFatalFailure()) return;
  const absl::Time start = absl::Now();
  Inbox::Event ev = group->Next(1, 3, {}, start + absl::Seconds(20));
  ASSERT_EQ(ev.type, Inbox::Event::kFrame) << ev.status;
  EXPECT_EQ(FirstWord(ev.frame), 2u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(15))
      << "the job's reader was not called back: it waited out its slice";
  link.inbox->DetachGroup(id);
}

// Turns futex_waitv off for one test and restores what it was.
class WithoutFutexWaitv {
 public:
  WithoutFutexWaitv() : was_(FutexWaitAnyWorks()) {
    SetFutexWaitAnyEnabled(false);
  }
  ~WithoutFutexWaitv() { SetFutexWaitAnyEnabled(was_); }

 private:
  const bool was_;
};

TEST(InboxTap, WithoutFutexWaitvTheReaderDeliversAndNothingIsLost) {
  WithoutFutexWaitv off;
  {
    Link link;
    Joined writer([&] {
      for (int i = 0; i < 200; ++i) {
        if (i % 10 == 0) absl::SleepFor(absl::Milliseconds(1));
        ASSERT_TRUE(WriteFrame(*link.tx, Meta(3, i), i));
      }
    });
    for (int i = 0; i < 200; ++i) {
      Inbox::Event ev = link.inbox->Next(kFrom, 3, kWatch,
                                         absl::Now() + absl::Seconds(10));
      ASSERT_EQ(ev.type, Inbox::Event::kFrame) << ev.status;
      ASSERT_EQ(ev.frame.meta.step, i);
      ASSERT_EQ(FirstWord(ev.frame), static_cast<uint32_t>(i));
    }
    writer.join();
    // Every frame came through the link's reader, none by this thread.
    const std::vector<std::thread::id> on = link.Delivered();
    ASSERT_EQ(on.size(), 200u);
    for (const auto& id : on) EXPECT_NE(id, std::this_thread::get_id());
  }
}

TEST(InboxTap, AWaitOnTheTapWakesForInterruptsLinkFailuresAndOtherPaths) {
  Link link;
  // An interrupt from another thread ends a wait long before its deadline.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  Joined t1([&] {
    absl::SleepFor(absl::Milliseconds(50));
    link.inbox->Interrupt(absl::AbortedError("membership changed"));
  });
  Inbox::Event ev = link.inbox->Next(kFrom, 1, kWatch, deadline);
  t1.join();
  EXPECT_EQ(ev.type, Inbox::Event::kInterrupted);
  EXPECT_LT(absl::Now(), deadline - absl::Seconds(10))
      << "the interrupt did not wake the wait";
  link.inbox->ClearInterrupt();
  // A frame through Deliver (another link's path, e.g. gRPC) wakes it too.
  Joined t2([&] {
    absl::SleepFor(absl::Milliseconds(50));
    InFrame f;
    f.meta = Meta(1, 0);
    f.meta.sender_rank = 2;
    ASSERT_TRUE(link.inbox->Deliver(2, std::move(f)).ok());
  });
  ev = link.inbox->Next(2, 1, kWatch, deadline);
  t2.join();
  EXPECT_EQ(ev.type, Inbox::Event::kFrame);
  EXPECT_LT(absl::Now(), deadline - absl::Seconds(10));
  // And a failure of a watched link.
  Joined t3([&] {
    absl::SleepFor(absl::Milliseconds(50));
    link.inbox->LinkFailed(kFrom, absl::UnavailableError("peer gone"));
  });
  ev = link.inbox->Next(kFrom, 1, kWatch, deadline);
  t3.join();
  EXPECT_EQ(ev.type, Inbox::Event::kLinkFailed);
  EXPECT_EQ(ev.peer, kFrom);
  EXPECT_LT(absl::Now(), deadline - absl::Seconds(10));
}

TEST(InboxTap, ACorruptRecordTakenByTheWaitingThreadFailsTheLinkOnce) {
  Link link;
  // A record whose bytes are no frame: DecodeFrame's error goes to the
  // link (LinkFailed) and the wait reports it.
  const std::string junk(40, '\x7f');
  ASSERT_TRUE(link.tx->TryWrite(junk));
  Inbox::Event ev = link.inbox->Next(kFrom, 1, kWatch,
                                     absl::Now() + absl::Seconds(10));
  EXPECT_EQ(ev.type, Inbox::Event::kLinkFailed);
  EXPECT_EQ(ev.status.code(), absl::StatusCode::kDataLoss) << ev.status;
  // The ring is closed after the error: later records are not delivered.
  EXPECT_TRUE(link.tx->closed());
  ASSERT_EQ(link.Delivered().size(), 1u);
  EXPECT_EQ(link.rejected.load(), 1) << "the link is ended once";
  EXPECT_EQ(link.errors.load(), 0) << "the ring itself was sound";
  // The tap is over: a wait now only times out.
  EXPECT_TRUE(link.rx->tap()->over());
  link.inbox->ClearLinkFailures();
  ev = link.inbox->Next(kFrom, 1, kWatch, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(ev.type, Inbox::Event::kTimeout);
}

TEST(InboxTap, TheNewestOperationSeenIncludesFramesStillOnAParkedRing) {
  Link link;
  // As while an operation waits: the reader stands aside.
  link.rx->tap()->Attach(true);
  absl::SleepFor(absl::Milliseconds(100));  // the reader parks
  ASSERT_TRUE(WriteFrame(*link.tx, Meta(12, 0), 1));
  // A peer at operation 12: the caller skips ahead to it (Communicator),
  // whoever is to take the frame off the ring.
  EXPECT_EQ(link.inbox->MaxOpSeqSeen(), 12u);
  link.rx->tap()->Attach(false);
}

TEST(InboxTap, StopDuringAWaitDeliversWhatWasWrittenAndNothingAfter) {
  auto link = std::make_unique<Link>();
  ASSERT_TRUE(WriteFrame(*link->tx, Meta(5, 0), 42));
  std::atomic<bool> done{false};
  Inbox::Event late;
  Joined waiter([&] {
    // Frame 0, then a wait for a frame that never comes.
    Inbox::Event first = link->inbox->Next(kFrom, 5, kWatch,
                                           absl::Now() + absl::Seconds(10));
    EXPECT_EQ(first.type, Inbox::Event::kFrame);
    EXPECT_EQ(FirstWord(first.frame), 42u);
    late = link->inbox->Next(kFrom, 5, kWatch,
                             absl::Now() + absl::Milliseconds(500));
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  std::shared_ptr<Inbox> inbox = link->inbox;
  std::shared_ptr<ShmRing> tx = link->tx;
  link->stopped = true;
  link->rx->Stop();  // as InLink::OnDone does, while the waiter sleeps
  const int after = link->after_stop.load();
  // Written after Stop: never delivered, by either thread.
  WriteFrame(*tx, Meta(5, 1), 43);
  waiter.join();
  EXPECT_TRUE(done);
  EXPECT_EQ(late.type, Inbox::Event::kTimeout);
  EXPECT_EQ(link->after_stop.load(), after);
  EXPECT_EQ(link->Delivered().size(), 1u);
  link.reset();
  EXPECT_EQ(inbox->taps(), 0u);
}

TEST(InboxTap, ManyFramesFromAWriterThreadArriveInOrderWhileTheWaiterDrains) {
  Link link;
  constexpr int kFrames = 5000;
  Joined writer([&] {
    for (int i = 0; i < kFrames;) {
      if (WriteFrame(*link.tx, Meta(9, i), 7 * i)) {
        ++i;
      } else {
        std::this_thread::yield();  // the ring is full: the waiter frees it
      }
    }
  });
  for (int i = 0; i < kFrames; ++i) {
    Inbox::Event ev = link.inbox->Next(kFrom, 9, kWatch,
                                       absl::Now() + absl::Seconds(20));
    ASSERT_EQ(ev.type, Inbox::Event::kFrame) << i << ": " << ev.status;
    ASSERT_EQ(ev.frame.meta.step, i);
    ASSERT_EQ(FirstWord(ev.frame), static_cast<uint32_t>(7 * i));
  }
  writer.join();
}

// Three peers' rings into one inbox, writers racing the waiter: every
// frame arrives once and in order per peer, and no wait outlives the
// deadline. (Missed wake-ups cost one 50 ms sleep each, not a hang; the
// count is printed, not asserted: a record that lands just as a sleep runs
// out counts as one.)
// `spin`: how long the waiter polls the words before it sleeps.
// `yield`: how long it yields its core between looks before it sleeps.
void RaceThreePeers(absl::Duration spin = absl::ZeroDuration(),
                    absl::Duration yield = absl::ZeroDuration()) {
  auto inbox = std::make_shared<Inbox>(4);
  inbox->SetSpinBeforeSleep(spin);
  inbox->SetYieldBeforeSleep(yield);
  std::vector<std::unique_ptr<Link>> links;
  for (int from = 1; from <= 3; ++from) {
    links.push_back(std::make_unique<Link>(inbox, from));
  }
  constexpr int kFrames = 3000;
  std::vector<std::unique_ptr<Joined>> writers;
  for (int k = 0; k < 3; ++k) {
    writers.push_back(std::make_unique<Joined>([&, k] {
      std::mt19937 rng(k);
      for (int i = 0; i < kFrames;) {
        if (WriteFrame(*links[k]->tx, Meta(4, i), (k + 1) * 100000 + i)) {
          ++i;
          // Bursts, pauses and everything between.
          const uint32_t r = rng() % 64;
          if (r == 0) absl::SleepFor(absl::Microseconds(rng() % 2000));
          if (r < 8) std::this_thread::yield();
        } else {
          std::this_thread::yield();
        }
      }
    }));
  }
  const std::vector<int> watch = {1, 2, 3};
  std::vector<int> next(4, 0);
  for (int n = 0; n < 3 * kFrames; ++n) {
    const int from = 1 + n % 3;
    Inbox::Event ev =
        inbox->Next(from, 4, watch, absl::Now() + absl::Seconds(30));
    ASSERT_EQ(ev.type, Inbox::Event::kFrame) << "from " << from << ", frame "
                                             << next[from] << ": " << ev.status;
    ASSERT_EQ(ev.frame.meta.step, next[from]) << "from " << from;
    ASSERT_EQ(FirstWord(ev.frame),
              static_cast<uint32_t>(from * 100000 + next[from]));
    ++next[from];
  }
  writers.clear();
  EXPECT_EQ(next[1] + next[2] + next[3], 3 * kFrames);
  std::printf("sleeps the clock ended with a word moved: %llu\n",
              static_cast<unsigned long long>(
                  inbox->counters()->missed_wakeups.load()));
}

TEST(InboxTap, ThreePeersRacingOneWaiterLoseNothing) { RaceThreePeers(); }

// Ranks outnumbering the cores: the waiting thread yields its core between
// looks before it sleeps. The same races, nothing lost.
TEST(InboxTap, ThreePeersRacingAWaiterThatYieldsFirstLoseNothing) {
  RaceThreePeers(absl::ZeroDuration(), absl::Microseconds(100));
}

// A frame that comes while the waiter yields is taken without a sleep
// (counted in waits_yielded); without the yield, never so.
TEST(InboxTap, AFrameThatComesWhileTheWaiterYieldsNeedsNoWakeUp) {
  if (!FutexWaitAnyWorks()) {
    GTEST_SKIP() << "futex_waitv is not available here (the kernel lacks "
                    "it, or HALKA_FUTEX_WAITV=0): the ring's reader "
                    "delivers, and a wait on delivered frames does not "
                    "yield";
  }
  for (const bool yields : {false, true}) {
    auto inbox = std::make_shared<Inbox>(4);
    if (yields) inbox->SetYieldBeforeSleep(absl::Seconds(1));  // 1 ms
    EXPECT_EQ(inbox->yield_before_sleep(),
              yields ? absl::Milliseconds(1) : absl::ZeroDuration());
    Link link(inbox);
    constexpr int kFrames = 200;
    std::atomic<int> taken{0};
    Joined writer([&] {
      for (int i = 0; i < kFrames; ++i) {
        // Once the waiter looks for frame i, 100 us later (well inside
        // the 1 ms of yielding, unless this thread is kept off the CPU).
        const absl::Time until = absl::Now() + absl::Seconds(20);
        while (taken.load() < i && absl::Now() < until) {
          std::this_thread::yield();
        }
        absl::SleepFor(absl::Microseconds(100));
        ASSERT_TRUE(WriteFrame(*link.tx, Meta(5, i), 3 * i));
      }
    });
    for (int i = 0; i < kFrames; ++i) {
      Inbox::Event ev = inbox->Next(kFrom, 5, kWatch,
                                    absl::Now() + absl::Seconds(20));
      ASSERT_EQ(ev.type, Inbox::Event::kFrame) << i << ": " << ev.status;
      ASSERT_EQ(ev.frame.meta.step, i);
      ASSERT_EQ(FirstWord(ev.frame), static_cast<uint32_t>(3 * i));
      taken.fetch_add(1);
    }
    writer.join();
    const uint64_t yielded = inbox->counters()->waits_yielded.load();
    if (yields) {
      // Most of them: a loaded machine may keep the writer off the CPU
      // past the millisecond now and then.
      EXPECT_GE(yielded, static_cast<uint64_t>(kFrames / 2));
    } else {
      EXPECT_EQ(yielded, 0u);
    }
    std::printf("yielding %d: %llu of %d waits served while yielding\n",
                yields, static_cast<unsigned long long>(yielded), kFrames);
  }
}

// --shm_spin_us: the waiting thread polls the words before it sleeps.
TEST(InboxTap, ThreePeersRacingAWaiterThatPollsFirstLoseNothing) {
  RaceThreePeers(absl::Microseconds(100));
}

// The setting and the counters are the inbox's own (its worker's): another
// inbox of this process, set otherwise, changes neither.
TEST(InboxTap, SpinAndCountersBelongToTheInbox) {
  auto shared = std::make_shared<LinkCounters>();
  Inbox a(4, shared);
  Inbox b(4);
  a.SetSpinBeforeSleep(absl::Microseconds(100));
  b.SetSpinBeforeSleep(absl::Seconds(5));  // clamped to 1 ms
  EXPECT_EQ(a.spin_before_sleep(), absl::Microseconds(100));
  EXPECT_EQ(b.spin_before_sleep(), absl::Milliseconds(1));
  b.SetSpinBeforeSleep(absl::Microseconds(-3));
  EXPECT_EQ(b.spin_before_sleep(), absl::ZeroDuration());
  EXPECT_EQ(a.spin_before_sleep(), absl::Microseconds(100));
  EXPECT_EQ(a.counters(), shared);
  ASSERT_NE(b.counters(), nullptr);
  EXPECT_NE(b.counters(), shared);
}

// Found by bad_calls_test: an abort of a failed operation taken off the
// ring after the next operation began was kept (with its ring record)
// until the one after, and a ring frees space only over a prefix of
// released records, so the link stopped once the ring wrapped.
TEST(InboxTap, FramesOfOperationsAlreadyLetGoHoldNoRingSpace) {
  Link link;  // a 1 MiB ring: 2,000 frames of ~1 KiB wrap it twice
  link.inbox->DropBefore(10);
  std::atomic<int> written{0};
  Joined writer([&] {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    for (int i = 0; i < 2000 && absl::Now() < until;) {
      FrameMeta m = Meta(9, i);  // an operation before 10: let go of
      m.count = 256;
      const std::string head = EncodeFrameHead(m);
      std::vector<uint32_t> payload(256, i);
      const std::vector<absl::Span<const uint8_t>> parts = {
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(head.data()),
                              head.size()),
          absl::MakeConstSpan(
              reinterpret_cast<const uint8_t*>(payload.data()), 1024)};
      if (link.tx->TryWrite(parts, head.size() + 1024)) {
        ++i;
        written = i;
      } else {
        absl::SleepFor(absl::Microseconds(200));
      }
    }
    // Then an abort of operation 10.
    FrameMeta a = Meta(10, 0);
    a.kind = FrameKind::kAbort;
    a.origin_rank = kFrom;
    a.abort_code = absl::StatusCode::kAborted;
    a.message = "gave up";
    a.count = 0;
    const std::string abort_head = EncodeFrameHead(a);
    EXPECT_TRUE(link.tx->TryWrite(abort_head));
  });
  // This rank waits on rank 2 only: rank 1's frames are never asked for.
  Inbox::Event ev = link.inbox->Next(2, 10, kWatch,
                                     absl::Now() + absl::Seconds(20));
  writer.join();
  EXPECT_EQ(written.load(), 2000)
      << "the ring stayed full: frames of an old operation kept its space";
  ASSERT_EQ(ev.type, Inbox::Event::kAbort) << ev.status;
  EXPECT_EQ(ev.frame.meta.message, "gave up");
  // The abort is kept by its header alone, not by its ring record.
  EXPECT_EQ(ev.frame.keepalive, nullptr);
  EXPECT_TRUE(ev.frame.pieces.empty());
}

}  // namespace
}  // namespace halka
