// ShmSender, the sending end of a same-host link's ring: what an operation
// that failed (LinkPath::Withdraw) leaves on the ring.
#include "transport/shm/shm_link.h"

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace halka {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// The next whole frame off the ring (its records joined), or empty when
// none comes within 10 s.
std::vector<uint8_t> NextFrame(ShmRing& rx) {
  std::vector<uint8_t> frame;
  for (;;) {
    auto r = rx.Next(absl::Seconds(10));
    if (!r.ok() || !r->has_value() || (*r)->data == nullptr) return {};
    const ShmRing::Record& rec = **r;
    frame.insert(frame.end(), rec.data, rec.data + rec.bytes);
    const bool last = (rec.flags & ShmRing::kLast) != 0;
    rx.Release(rec.id);
    if (last) return frame;
  }
}

// Six frames of operation 7, each larger than the ring, wait behind a
// reader that reads nothing; the first is part way in. Withdraw(7)
// releases all six at once; the reader then gets the first whole, from its
// copy (the caller's buffers are overwritten after the release), then the
// ABORT, then operation 8's frame, and nothing else of operation 7.
TEST(ShmSender, AFailedOperationsFramesLeaveAtOnceAndItsAbortIsNext) {
  auto tx = ShmRing::Create(64 << 10);
  ASSERT_TRUE(tx.ok()) << tx.status();
  auto rx = ShmRing::Open((*tx)->name(), (*tx)->token_hex());
  ASSERT_TRUE(rx.ok()) << rx.status();
  ShmSender sender(*tx);
  std::atomic<int> released{0};
  std::vector<std::vector<uint8_t>> buffers;
  for (uint32_t i = 0; i < 6; ++i) buffers.push_back(Pattern(150000, i + 1));
  const std::vector<uint8_t> first = buffers[0];
  auto frame = [&](const std::vector<uint8_t>& bytes, bool data,
                   uint64_t op_seq, bool borrowed) {
    OutFrame f;
    f.parts = {absl::MakeConstSpan(bytes)};
    f.data = data;
    f.op_seq = op_seq;
    if (borrowed) f.on_released = [&released] { released.fetch_add(1); };
    return f;
  };
  for (const auto& b : buffers) sender.SendOne(frame(b, true, 7, true));
  const std::vector<uint8_t> abort = Pattern(40, 70), next = Pattern(3000, 80);
  sender.SendOne(frame(abort, false, 7, false));
  sender.SendOne(frame(next, true, 8, false));
  absl::SleepFor(absl::Milliseconds(100));  // the writer is inside frame 0
  EXPECT_EQ(released.load(), 0);
  sender.Withdraw(OpId{7});
  EXPECT_EQ(released.load(), 6);
  for (auto& b : buffers) std::fill(b.begin(), b.end(), uint8_t{0xEE});
  EXPECT_EQ(NextFrame(**rx), first);
  EXPECT_EQ(NextFrame(**rx), abort);
  EXPECT_EQ(NextFrame(**rx), next);
  auto none = (*rx)->Next(absl::Milliseconds(100));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value()) << "a withdrawn frame went out";
  sender.Close();
}

}  // namespace
}  // namespace halka
