// Landings (core/landing.h): what an operation offers, what a
// reader may claim, and that a withdrawal leaves no writer behind; and the
// host buffer's Apply on a landed frame.
#include "core/landing.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "core/op_buffer.h"
#include "tests/testing/data_meta.h"

namespace halka {
namespace {

FrameMeta Chunk(uint64_t op_seq, int step, uint64_t offset, uint64_t count) {
  FrameMeta m =
      testing::DataChunkMeta(4, op_seq, Phase::kAllGather, step, count);
  m.segment = 1;
  m.offset = offset;
  return m;
}

TEST(LandingBoardTest, OnlySourcesThatCanLandTakeOffers) {
  LandingBoard board;
  std::vector<uint8_t> dst(400);
  EXPECT_EQ(board.Offer(2, Chunk(1, 0, 0, 100), dst.data(), 400), nullptr);
  EXPECT_FALSE(board.Armed());
  board.AddSource(2);
  board.AddSource(2);  // a second link from rank 2 while one is replaced
  board.RemoveSource(2);
  EXPECT_NE(board.Offer(2, Chunk(1, 0, 0, 100), dst.data(), 400), nullptr);
  EXPECT_EQ(board.Offer(3, Chunk(1, 0, 0, 100), dst.data(), 400), nullptr);
  // The same frame twice is refused; so is anything but a data frame.
  EXPECT_EQ(board.Offer(2, Chunk(1, 0, 0, 100), dst.data(), 400), nullptr);
  FrameMeta abort = Chunk(1, 1, 0, 100);
  abort.kind = FrameKind::kAbort;
  EXPECT_EQ(board.Offer(2, abort, dst.data(), 400), nullptr);
  EXPECT_TRUE(board.Armed());
  EXPECT_EQ(board.offered(), 1u);
  board.RemoveSource(2);
  EXPECT_EQ(board.Offer(2, Chunk(1, 1, 0, 100), dst.data(), 400), nullptr);
}

TEST(LandingBoardTest, AClaimMustMatchTheWholeHeaderAndTheSize) {
  LandingBoard board;
  board.AddSource(5);
  std::vector<uint8_t> dst(800);
  const FrameMeta want = Chunk(9, 2, 100, 100);
  std::shared_ptr<Landing> offered =
      board.Offer(5, want, dst.data() + 400, 400);
  ASSERT_NE(offered, nullptr);
  // Another sender, generation, op, step, offset, count, dtype, kind or
  // payload size: no claim.
  EXPECT_EQ(board.Claim(4, want, 400), nullptr);
  const std::vector<std::function<void(FrameMeta&)>> changes = {
      [](FrameMeta& m) { m.generation = 5; },
      [](FrameMeta& m) { m.op_seq = 10; },
      [](FrameMeta& m) { m.step = 3; },
      [](FrameMeta& m) { m.offset = 0; },
      [](FrameMeta& m) { m.count = 99; },
      [](FrameMeta& m) { m.dtype = DType::kInt32; },
      [](FrameMeta& m) { m.kind = FrameKind::kFingerprint; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    FrameMeta m = want;
    changes[i](m);
    EXPECT_EQ(board.Claim(5, m, m.count * 4), nullptr) << "change " << i;
  }
  EXPECT_EQ(board.Claim(5, want, 404), nullptr);
  // The exact frame: claimed once, and off the board.
  std::shared_ptr<Landing> claimed = board.Claim(5, want, 400);
  ASSERT_EQ(claimed, offered);
  EXPECT_EQ(claimed->data(), dst.data() + 400);
  EXPECT_EQ(claimed->bytes(), 400u);
  EXPECT_EQ(board.Claim(5, want, 400), nullptr);
  EXPECT_FALSE(board.Armed());
}

TEST(LandingBoardTest, WithdrawnLandingsAreNeitherClaimedNorWritten) {
  LandingBoard board;
  board.AddSource(1);
  std::vector<uint8_t> dst(1000, 0xEE);
  std::shared_ptr<Landing> a = board.Offer(1, Chunk(3, 0, 0, 100), dst.data(), 400);
  std::shared_ptr<Landing> b =
      board.Offer(1, Chunk(3, 1, 100, 100), dst.data() + 400, 400);
  std::shared_ptr<Landing> other =
      board.Offer(1, Chunk(4, 0, 0, 100), dst.data(), 400);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(other, nullptr);
  // `a` was claimed (a reader holds it), `b` was not.
  ASSERT_EQ(board.Claim(1, Chunk(3, 0, 0, 100), 400), a);
  const std::shared_ptr<Landing> mine[] = {a, b};
  board.Withdraw(mine);
  EXPECT_EQ(board.Claim(1, Chunk(3, 1, 100, 100), 400), nullptr);
  EXPECT_EQ(board.offered(), 1u);  // another operation's stays
  bool ran = false;
  EXPECT_FALSE(a->Write([&](uint8_t* p) {
    ran = true;
    std::memset(p, 0, 400);
  }));
  EXPECT_FALSE(ran);
  EXPECT_EQ(dst[0], 0xEE);
  EXPECT_TRUE(other->Write([](uint8_t* p) { p[0] = 1; }));
  EXPECT_EQ(dst[0], 1);
}

TEST(LandingBoardTest, AWithdrawalWaitsForTheWriteInProgressAndNoneAfter) {
  LandingBoard board;
  board.AddSource(1);
  std::vector<uint8_t> dst(400, 0);
  std::shared_ptr<Landing> l = board.Offer(1, Chunk(3, 0, 0, 100), dst.data(), 400);
  ASSERT_NE(board.Claim(1, Chunk(3, 0, 0, 100), 400), nullptr);
  absl::Notification inside;
  std::atomic<bool> write_done{false};
  std::thread reader([&] {
    l->Write([&](uint8_t* p) {
      inside.Notify();
      // A slow piece: the withdrawal must wait for it, not overtake it.
      absl::SleepFor(absl::Milliseconds(100));
      std::memset(p, 7, 400);
      write_done.store(true);
    });
  });
  inside.WaitForNotification();
  const std::shared_ptr<Landing> mine[] = {l};
  board.Withdraw(mine);
  EXPECT_TRUE(write_done.load()) << "Withdraw returned during a write";
  EXPECT_FALSE(l->Write([](uint8_t* p) { p[0] = 9; }));
  reader.join();
  EXPECT_EQ(dst[0], 7);
}

TEST(HostOpBufferTest, ALandedFrameCostsNothingAndAMisplacedOneFails) {
  std::vector<float> data(8, 1.0f);
  HostOpBuffer buf(data.data());
  ASSERT_TRUE(buf.Begin(DType::kFloat32, ReduceOp::kSum, 8).ok());
  uint8_t* at = buf.LandingView(4, 4);
  EXPECT_EQ(at, reinterpret_cast<uint8_t*>(data.data() + 4));
  const float landed[4] = {5, 6, 7, 8};
  std::memcpy(at, landed, sizeof(landed));
  InFrame f;
  f.landed = true;
  f.pieces.push_back(absl::MakeConstSpan(at, 16));
  EXPECT_TRUE(buf.Apply(/*reduce=*/false, 4, 4, f).ok());
  EXPECT_EQ(data[4], 5.0f);
  EXPECT_EQ(data[7], 8.0f);
  // Anywhere else, or reduced: INTERNAL, and the buffer is untouched.
  EXPECT_EQ(buf.Apply(false, 0, 4, f).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(buf.Apply(true, 4, 4, f).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(data[0], 1.0f);
  EXPECT_EQ(data[4], 5.0f);
}

}  // namespace
}  // namespace halka
