// Hostile peers and strangers on the data path: a peer that queues without
// bound, and a flood of silent connections to the wire listener.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/loopback.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "tests/testing/link_counts.h"
#include "core/transport.h"
#include "transport/tcp/wire_link.h"
#include "seal/wire_seal.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::CountsOf;
using halka::testing::LinkCounts;

// A data frame of `bytes` payload for `op_seq` from rank `from`, pointing
// into one shared buffer (no memory per frame: the inbox counts bytes it
// is asked to hold, not what they cost here).
InFrame BigFrame(int from, uint64_t op_seq, size_t bytes,
                 const std::shared_ptr<std::vector<uint8_t>>& buf) {
  InFrame f;
  f.meta.kind = FrameKind::kData;
  f.meta.op_seq = op_seq;
  f.meta.sender_rank = from;
  f.meta.count = bytes / 4;
  f.meta.dtype = DType::kFloat32;
  f.pieces.push_back(absl::MakeConstSpan(buf->data(), bytes));
  f.keepalive = buf;
  return f;
}

// A peer streaming valid 32 MiB frames for a far-future operation: before
// byte budgets the inbox took them all (65,536 frames: 2 TiB).
TEST(InboxByteBudgetTest, APeerQueueingWithoutEndIsRefusedNamingIt) {
  Inbox inbox(8);  // the default budget: 1 GiB per peer, 4 GiB in all
  auto buf = std::make_shared<std::vector<uint8_t>>(size_t{32} << 20);
  uint64_t accepted = 0;
  absl::Status refused;
  for (int i = 0; i < 1000; ++i) {
    refused = inbox.Deliver(3, BigFrame(3, 1000 + i, buf->size(), buf));
    if (!refused.ok()) break;
    accepted += buf->size();
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("rank 3"));
  EXPECT_LE(accepted, uint64_t{1} << 30);
  EXPECT_EQ(inbox.queued_bytes(), accepted);
  // Another peer still has its own share, up to the worker's total.
  EXPECT_TRUE(inbox.Deliver(4, BigFrame(4, 1000, buf->size(), buf)).ok());
}

TEST(InboxByteBudgetTest, TheTotalBoundsAllPeersTogetherAndTakingFreesIt) {
  Inbox inbox(8);
  inbox.SetByteBudget({/*per_peer=*/100 << 20, /*total=*/250 << 20});
  auto buf = std::make_shared<std::vector<uint8_t>>(size_t{50} << 20);
  for (int peer = 1; peer <= 2; ++peer) {
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(inbox.Deliver(peer, BigFrame(peer, 5, buf->size(), buf)).ok());
    }
  }
  EXPECT_EQ(inbox.Deliver(1, BigFrame(1, 5, buf->size(), buf)).code(),
            absl::StatusCode::kResourceExhausted);  // its own share
  ASSERT_TRUE(inbox.Deliver(3, BigFrame(3, 5, buf->size(), buf)).ok());
  absl::Status s = inbox.Deliver(4, BigFrame(4, 5, buf->size(), buf));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("rank 4"));
  // An operation takes rank 1's frames: their bytes are free again.
  const int watch[] = {1};
  for (int i = 0; i < 2; ++i) {
    Inbox::Event ev = inbox.Next(1, 5, watch, absl::Now() + absl::Seconds(5));
    ASSERT_EQ(ev.type, Inbox::Event::kFrame);
  }
  EXPECT_TRUE(inbox.Deliver(4, BigFrame(4, 5, buf->size(), buf)).ok());
  // Dropped operations free theirs too.
  inbox.DropBefore(6);
  EXPECT_EQ(inbox.queued_bytes(), 0u);
}

int DialSilent(int port) { return testing::DialLoopback(port); }

// 64 silent connections filled the listener's handshake slots: every new
// connection, a peer's included, was closed at once, and each link fell
// back to gRPC for a minute.
TEST(WireListenerFloodTest, SilentConnectionsCannotKeepAPeerOut) {
  auto listener = WireListener::Start("127.0.0.1");
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::vector<int> silent;
  for (int i = 0; i < 100; ++i) {
    const int fd = DialSilent((*listener)->port());
    ASSERT_GE(fd, 0);
    silent.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(300));  // the listener takes them all
  absl::Notification connected;
  const std::string token = (*listener)->Expect([&](int fd) {
    close(fd);
    connected.Notify();
  });
  absl::Notification ready;
  absl::Status ready_status;
  WireSender tx("127.0.0.1", (*listener)->port(), token, "",
                [&](const absl::Status& s) {
                  ready_status = s;
                  ready.Notify();
                },
                [](const absl::Status&) {});
  ASSERT_TRUE(ready.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(ready_status.ok()) << ready_status;
  EXPECT_TRUE(connected.WaitForNotificationWithTimeout(absl::Seconds(10)));
  tx.Close();
  (*listener)->Stop();
  for (int fd : silent) close(fd);
}

// The same flood against every worker of a running ring, before its links
// are made: the ring forms, runs on its wires (not gRPC), and is right.
TEST(WireListenerFloodTest, ARingFormsAndRunsOnItsWiresThroughTheFlood) {
  LocalCluster::Options o;
  o.workers = 3;
  o.shm_links = false;  // peers on "other hosts": wire links
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<int> silent;
  for (int r = 0; r < 3; ++r) {
    const int port = (*cluster)->worker(r)->wire_port();
    ASSERT_GT(port, 0);
    for (int i = 0; i < 80; ++i) {
      const int fd = DialSilent(port);
      ASSERT_GE(fd, 0);
      silent.push_back(fd);
    }
  }
  absl::SleepFor(absl::Milliseconds(300));
  const LinkCounts before = CountsOf(**cluster);
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < 3; ++r) {
    auto c = (*cluster)->Connect(r);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
  }
  constexpr size_t kCount = 1 << 18;
  std::vector<std::vector<float>> data(3, std::vector<float>(kCount));
  for (int r = 0; r < 3; ++r) {
    for (size_t i = 0; i < kCount; ++i) data[r][i] = static_cast<float>(r + i % 7);
  }
  std::vector<absl::StatusOr<OpInfo>> out(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      OpOptions oo;
      oo.algorithm = Algorithm::kRing;
      out[r] = clients[r]->AllReduce(data[r].data(), kCount, DType::kFloat32,
                                     ReduceOp::kSum, oo);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out[r].ok()) << "rank " << r << ": " << out[r].status();
    for (size_t i = 0; i < kCount; i += 997) {
      ASSERT_EQ(data[r][i], static_cast<float>(3 + 3 * (i % 7))) << i;
    }
  }
  // The cluster's own workers' counters (nothing else in this process).
  const LinkCounts after = CountsOf(**cluster);
  EXPECT_GE(after.wire_accepted - before.wire_accepted, 3u)
      << "the ring's links did not take the wire";
  EXPECT_EQ(after.wire_fell_back, before.wire_fell_back)
      << "a link fell back to gRPC";
  EXPECT_GT(after.wire_evicted, 0u);
  for (int fd : silent) close(fd);
}

// A peer whose links end while an operation waits for its frames (here:
// it stops without leaving the job; a cut connection or a dead process
// looks the same from here) fails the waiting ranks at once, naming it, on
// every path. Before, the gRPC stream's end and the wire's were quiet: the
// ranks waited for the heartbeat deadline's new generation (5 s here).
class LinkEndTest : public ::testing::TestWithParam<int> {};

TEST_P(LinkEndTest, AnOperationWaitingOnALinkThatEndsFailsAtOnceNamingIt) {
  LocalCluster::Options o;
  o.workers = 3;
  o.shm_links = GetParam() == 0;
  o.wire_links = GetParam() == 1;
  o.heartbeat_timeout = absl::Seconds(8);
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < 3; ++r) {
    auto c = (*cluster)->Connect(r);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
  }
  std::vector<std::vector<float>> data(3, std::vector<float>(1 << 16, 1.0f));
  auto run = [&](int r) {
    OpOptions oo;
    oo.algorithm = Algorithm::kRing;
    oo.timeout = absl::Seconds(30);
    return clients[r]->AllReduce(data[r].data(), data[r].size(),
                                 DType::kFloat32, ReduceOp::kSum, oo);
  };
  {  // every link up
    std::vector<std::thread> threads;
    std::vector<absl::Status> ok(3);
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] { ok[r] = run(r).status(); });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(ok[r].ok()) << ok[r];
  }
  // Ranks 0 and 1 call again; rank 2 never does, and its worker stops.
  std::vector<absl::Status> out(2);
  std::vector<absl::Time> ended(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      out[r] = run(r).status();
      ended[r] = absl::Now();
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time killed = absl::Now();
  (*cluster)->KillWorker(2);
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(out[r].ok()) << "rank " << r;
    EXPECT_LT(ended[r] - killed, absl::Seconds(3))
        << "rank " << r << " failed " << ended[r] - killed
        << " after the peer went: " << out[r];
  }
  // The rank next to the one that went names it and its link.
  const absl::Status& s = out[0];
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("rank 2")) << s;
  EXPECT_THAT(s.message(), HasSubstr("ended")) << s;
}

INSTANTIATE_TEST_SUITE_P(EveryPath, LinkEndTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(i.param == 0   ? "Shm"
                                              : i.param == 1 ? "Wire"
                                                             : "Grpc");
                         });

}  // namespace
}  // namespace halka
