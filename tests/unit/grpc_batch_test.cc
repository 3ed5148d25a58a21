// The gRPC stream's held writes and frame batches (GrpcTransport against a
// PeerService on loopback): held frames do not leave before their release;
// where the serving side agreed to batches, frames held together leave in
// one message; against a side that did not, one frame per message, as
// before. Every frame checked, in order.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/data_meta.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/grpc/peer_service.h"

namespace halka {
namespace {

constexpr uint64_t kGeneration = 1;

// A worker's serving end for rank 1, its frames in one inbox.
struct Served {
  std::shared_ptr<Inbox> inbox = std::make_shared<Inbox>(2);
  std::unique_ptr<PeerService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  explicit Served(bool batches) {
    AcceptSetup accept;
    accept.frame_batches = batches;
    service = std::make_unique<PeerService>(
        "job",
        [this](uint64_t g) -> absl::StatusOr<std::shared_ptr<Inbox>> {
          if (g != kGeneration) return absl::AbortedError("not this ring");
          return inbox;
        },
        accept);
    grpc::ServerBuilder builder;
    ConfigureServerBuilder(builder);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
  }
  ~Served() {
    if (server) server->Shutdown();
  }
};

// Rank 0's side, linked to `to`.
struct Dialled {
  Inbox inbox{2};
  std::shared_ptr<LinkCounters> counters = std::make_shared<LinkCounters>();
  std::unique_ptr<GrpcTransport> transport;
  std::vector<std::vector<float>> payloads;  // kept until the test ends

  explicit Dialled(const Served& to) {
    LinkSetup links;
    links.counters = counters;
    transport = std::make_unique<GrpcTransport>(
        "job", kGeneration, /*rank=*/0,
        std::vector<std::string>{"127.0.0.1:1",
                                 absl::StrCat("127.0.0.1:", to.port)},
        &inbox, links);
  }
  uint64_t batched() const { return counters->grpc_frames_batched.load(); }

  // A data frame of `count` floats for operation `op_seq`, step `step`,
  // every element op_seq * 1000 + step.
  absl::Status Send(uint64_t op_seq, int step, size_t count) {
    payloads.emplace_back(count, static_cast<float>(op_seq * 1000 + step));
    const std::vector<float>& p = payloads.back();
    FrameMeta m = testing::DataChunkMeta(kGeneration, op_seq,
                                         Phase::kReduceScatter, step, count);
    m.sender_rank = 0;
    return transport->Send(
        1, m,
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(p.data()),
                            p.size() * sizeof(float)),
        [] {});
  }
};

// The next frame of `op_seq` from rank 0 is step `step` of `count` floats,
// every one of them op_seq * 1000 + step.
void ExpectFrame(Inbox& inbox, uint64_t op_seq, int step, size_t count) {
  Inbox::Event ev = inbox.Next(0, op_seq, {}, absl::Now() + absl::Seconds(20));
  ASSERT_EQ(ev.type, Inbox::Event::kFrame)
      << "op " << op_seq << " step " << step << ": " << ev.status;
  EXPECT_EQ(ev.frame.meta.step, step) << "op " << op_seq;
  ASSERT_EQ(ev.frame.meta.count, count) << "op " << op_seq;
  std::vector<float> got(count);
  size_t at = 0;
  for (const auto& piece : ev.frame.pieces) {
    ASSERT_LE(at + piece.size(), count * sizeof(float));
    std::memcpy(reinterpret_cast<uint8_t*>(got.data()) + at, piece.data(),
                piece.size());
    at += piece.size();
  }
  ASSERT_EQ(at, count * sizeof(float));
  EXPECT_EQ(got, std::vector<float>(count, static_cast<float>(
                                               op_seq * 1000 + step)))
      << "op " << op_seq << " step " << step;
}

// Operation `op_seq`: a small frame and two more (one of 300 KiB), held,
// then released; all three arrive in order. Returns how many frames left
// behind another in one message.
uint64_t HeldThree(Dialled& d, Served& s, uint64_t op_seq) {
  const uint64_t before = d.batched();
  {
    HeldWrites held(d.transport.get());
    EXPECT_TRUE(d.Send(op_seq, 0, 16).ok());
    EXPECT_TRUE(d.Send(op_seq, 1, 300 << 8).ok());
    EXPECT_TRUE(d.Send(op_seq, 2, 5).ok());
  }
  ExpectFrame(*s.inbox, op_seq, 0, 16);
  ExpectFrame(*s.inbox, op_seq, 1, 300 << 8);
  ExpectFrame(*s.inbox, op_seq, 2, 5);
  return d.batched() - before;
}

TEST(GrpcBatches, HeldFramesLeaveOnlyAtTheirRelease) {
  Served s(/*batches=*/true);
  ASSERT_NE(s.server, nullptr);
  Dialled d(s);
  ASSERT_TRUE(d.Send(1, 0, 4).ok());  // opens the link
  ExpectFrame(*s.inbox, 1, 0, 4);
  for (uint64_t op = 2; op <= 4; ++op) {
    d.transport->HoldWrites();
    d.transport->HoldWrites();  // nested: only the outer release starts
    ASSERT_TRUE(d.Send(op, 0, 8).ok());
    d.transport->ReleaseWrites();
    Inbox::Event early =
        s.inbox->Next(0, op, {}, absl::Now() + absl::Milliseconds(150));
    EXPECT_EQ(early.type, Inbox::Event::kTimeout)
        << "op " << op << ": a held frame left before its release";
    d.transport->ReleaseWrites();
    ExpectFrame(*s.inbox, op, 0, 8);
    if (HasFatalFailure()) return;
  }
}

TEST(GrpcBatches, HeldFramesShareAMessageWhereThePeerAgreed) {
  Served s(/*batches=*/true);
  ASSERT_NE(s.server, nullptr);
  Dialled d(s);
  ASSERT_TRUE(d.Send(1, 0, 4).ok());
  ExpectFrame(*s.inbox, 1, 0, 4);
  // The peer's answer comes with its initial metadata, soon after the
  // link opened; until then frames leave one per message.
  uint64_t op = 2;
  uint64_t batched = 0;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (batched == 0 && absl::Now() < until) {
    batched = HeldThree(d, s, op++);
    if (HasFatalFailure()) return;
    if (batched == 0) absl::SleepFor(absl::Milliseconds(10));
  }
  // The small first frame takes the 300 KiB one along; the third waits
  // for that message's write (the batch is over kBatchJoinBytes).
  EXPECT_EQ(batched, 1u) << "no batch in 10 s of holds";
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(HeldThree(d, s, op++), 1u);
    if (HasFatalFailure()) return;
  }
  // Small frames held together leave in one message.
  const uint64_t before = d.batched();
  {
    HeldWrites held(d.transport.get());
    for (int step = 0; step < 10; ++step) ASSERT_TRUE(d.Send(op, step, 100).ok());
  }
  for (int step = 0; step < 10; ++step) ExpectFrame(*s.inbox, op, step, 100);
  EXPECT_EQ(d.batched() - before, 9u);
}

TEST(GrpcBatches, APeerThatDidNotAgreeGetsOneFramePerMessage) {
  Served s(/*batches=*/false);
  ASSERT_NE(s.server, nullptr);
  Dialled d(s);
  ASSERT_TRUE(d.Send(1, 0, 4).ok());
  ExpectFrame(*s.inbox, 1, 0, 4);
  absl::SleepFor(absl::Milliseconds(100));  // any answer would be here
  // A batch would end this link (DATA_LOSS: bytes beyond the first
  // frame): every frame arriving, in order, shows there was none.
  for (uint64_t op = 2; op < 12; ++op) {
    EXPECT_EQ(HeldThree(d, s, op), 0u) << "op " << op;
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(d.batched(), 0u);
}

}  // namespace
}  // namespace halka
