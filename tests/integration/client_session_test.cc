// The SDK's shared-memory session with a worker on its host
// (client/shm_session.h, Worker.Session): used when it can be, off when
// asked, the same answers as one call each, an operation's own errors
// passed through unchanged, a worker that stops mid-call failing the call
// instead of leaving it waiting, and a worker that checks everything a
// session's client sends it.
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "halka/v1/worker.grpc.pb.h"
#include "tests/testing/run_ranks.h"
#include "core/shm_ring.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::RunRanks;
using halka::testing::StartRanks;

// rank r, round k: element i holds r * 100 + k + (i % 5), exact in float32.
std::vector<float> Input(int rank, int round, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    v[i] = static_cast<float>(rank * 100 + round + static_cast<int>(i % 5));
  }
  return v;
}

float Expected(int world, int round, size_t i) {
  float s = 0;
  for (int r = 0; r < world; ++r) s += static_cast<float>(r * 100 + round + static_cast<int>(i % 5));
  return s;
}

// A client that reaches its worker as one in another process would (the
// workers here share the test's process): through the session.
Client::Options NotInProcess() {
  Client::Options co;
  co.in_process = false;
  return co;
}

std::unique_ptr<LocalCluster> StartCluster(int workers,
                                           absl::Duration op_timeout) {
  LocalCluster::Options o;
  o.workers = workers;
  o.op_timeout = op_timeout;
  return LocalCluster::Start(o).value();
}

// Every rank all-reduces `rounds` times (sizes from 4 KiB to 1 MiB, plain
// vectors: staged; a HostBuffer: zero copy) with the session on for the
// ranks in `with_session`; checks every element and how each call went.
void AllReduceRounds(LocalCluster& cluster, const std::vector<bool>& with_session,
                     int rounds) {
  const int g = cluster.size();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < g; ++r) {
    Client::Options co;
    co.session = with_session[static_cast<size_t>(r)];
    co.in_process = false;  // the session is what this test is about
    clients.push_back(cluster.Connect(r, co).value());
  }
  const size_t kCounts[] = {1024, 65536, 262144};
  auto results = RunRanks<std::string>(g, [&](int r) -> std::string {
    Client& cl = *clients[static_cast<size_t>(r)];
    for (int k = 0; k < rounds; ++k) {
      for (size_t count : kCounts) {
        std::vector<float> data = Input(r, k, count);
        absl::StatusOr<OpInfo> info;
        HostBuffer shared;
        if (k % 2 == 1) {
          shared = cl.AllocateHostBuffer(count * sizeof(float)).value();
          std::memcpy(shared.data(), data.data(), count * sizeof(float));
          info = cl.AllReduce(shared.data(), count, DType::kFloat32, ReduceOp::kSum);
          std::memcpy(data.data(), shared.data(), count * sizeof(float));
        } else {
          info = cl.AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
        }
        if (!info.ok()) return info.status().ToString();
        if (info->session != with_session[static_cast<size_t>(r)]) {
          return absl::StrCat("round ", k, ": session ", info->session);
        }
        if (info->zero_copy != (k % 2 == 1)) {
          return absl::StrCat("round ", k, ": zero_copy ", info->zero_copy);
        }
        for (size_t i = 0; i < count; ++i) {
          if (data[i] != Expected(g, k, i)) {
            return absl::StrCat("round ", k, " count ", count, " element ", i,
                                ": ", data[i], " != ", Expected(g, k, i));
          }
        }
      }
    }
    return "";
  });
  for (int r = 0; r < g; ++r) EXPECT_EQ(results[r], "") << "rank " << r;
}

TEST(ClientSession, UsedOnTheSameHostAndRightAtEverySize) {
  auto cluster = StartCluster(4, absl::Seconds(30));
  AllReduceRounds(*cluster, {true, true, true, true}, 4);
}

TEST(ClientSession, OffWhenAskedAndMixedRanksAgree) {
  auto cluster = StartCluster(3, absl::Seconds(30));
  AllReduceRounds(*cluster, {false, false, false}, 2);
  AllReduceRounds(*cluster, {true, false, true}, 2);
}

TEST(ClientSession, AnOperationsOwnErrorComesBackAsFromRun) {
  auto cluster = StartCluster(2, absl::Seconds(30));
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < 2; ++r) clients.push_back(cluster->Connect(r, NotInProcess()).value());
  // Ranks disagree on the count: both fail naming the pair, through their
  // sessions, and the sessions stay usable for the next round.
  auto failed = RunRanks<absl::StatusOr<OpInfo>>(2, [&](int r) {
    std::vector<float> data = Input(r, 0, r == 0 ? 1000 : 1001);
    return clients[static_cast<size_t>(r)]->AllReduce(absl::MakeSpan(data),
                                                      ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(failed[r].ok()) << "rank " << r;
    EXPECT_EQ(failed[r].status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(failed[r].status().message(), HasSubstr("disagree"));
  }
  auto next = RunRanks<absl::StatusOr<OpInfo>>(2, [&](int r) {
    std::vector<float> data = Input(r, 1, 1000);
    return clients[static_cast<size_t>(r)]->AllReduce(absl::MakeSpan(data),
                                                      ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_TRUE(next[r]->session);
  }
}

// One round of rank 0 and rank 1, through rank 0's session.
void OneRoundOpensTheSession(Client& client, Client& peer) {
  auto first = RunRanks<absl::StatusOr<OpInfo>>(2, [&](int r) {
    std::vector<float> data = Input(r, 0, 256);
    return (r == 0 ? client : peer).AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
  });
  ASSERT_TRUE(first[0].ok()) << first[0].status();
  ASSERT_TRUE(first[0]->session);
}

TEST(ClientSession, AWorkerStoppedMidCallFailsTheCallInsteadOfHanging) {
  // A long operation deadline: only the worker's stop can end the call.
  auto cluster = StartCluster(2, absl::Seconds(120));
  auto client = cluster->Connect(0, NotInProcess()).value();
  auto peer = cluster->Connect(1, NotInProcess()).value();
  // One round first, so that rank 0's session is open.
  ASSERT_NO_FATAL_FAILURE(OneRoundOpensTheSession(*client, *peer));
  // Rank 0 calls alone (rank 1 never does) and waits for its peer; its
  // worker is stopped under it.
  auto waiting = StartRanks<absl::StatusOr<OpInfo>>({0}, [&](int) {
    std::vector<float> data = Input(0, 1, 256);
    return client->AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
  });
  absl::SleepFor(absl::Milliseconds(300));
  cluster->KillWorker(0);
  std::vector<absl::StatusOr<OpInfo>> got = waiting.Join();
  ASSERT_FALSE(got[0].ok());
  EXPECT_EQ(got[0].status().code(), absl::StatusCode::kUnavailable)
      << got[0].status();
}

// Found by system_ring_processes with back-to-back calls: the worker died
// between two calls, the next call found the session over and went by
// Worker.Run, which waited for the dead worker until its deadline (the
// operation's plus 30 s) before it failed.
TEST(ClientSession, ACallAfterTheWorkerDiedFailsAtOnce) {
  auto cluster = StartCluster(2, absl::Seconds(120));
  auto client = cluster->Connect(0, NotInProcess()).value();
  auto peer = cluster->Connect(1, NotInProcess()).value();
  ASSERT_NO_FATAL_FAILURE(OneRoundOpensTheSession(*client, *peer));
  cluster->KillWorker(0);
  absl::SleepFor(absl::Milliseconds(200));  // the session's end is seen
  std::vector<float> data = Input(0, 1, 256);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<OpInfo> got = client->AllReduce(absl::MakeSpan(data),
                                                 ReduceOp::kSum);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  // Not a timing benchmark: the deadline is 150 s away; the call must not
  // wait for a worker that is gone.
  EXPECT_LT(absl::Now() - t0, absl::Seconds(60)) << got.status();
}

// A raw session, as a hostile or broken client would open it.
class RawSession : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = StartCluster(1, absl::Seconds(10));
    stub_ = v1::Worker::NewStub(grpc::CreateChannel(
        cluster_->worker_address(0), grpc::InsecureChannelCredentials()));
    requests_ = ShmRing::Create(64 << 10).value();
    replies_ = ShmRing::Create(64 << 10).value();
  }

  // Opens a session with `offer` and returns how the stream ended after
  // `then` ran (with the open event read, when there was one).
  absl::Status Session(const v1::SessionOffer& offer, bool* opened,
                       const std::function<void()>& then) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto stream = stub_->Session(&ctx, offer);
    v1::SessionEvent event;
    *opened = stream->Read(&event) && event.open();
    if (*opened) then();
    while (stream->Read(&event)) {
    }
    grpc::Status s = stream->Finish();
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        s.error_message());
  }

  v1::SessionOffer GoodOffer() const {
    v1::SessionOffer offer;
    offer.set_requests(FormatShmOffer(*requests_));
    offer.set_replies(FormatShmOffer(*replies_));
    return offer;
  }

  void Write(const std::string& bytes) {
    ASSERT_TRUE(requests_->TryWrite(bytes));
  }

  // The worker's answer to the session's next call.
  v1::SessionResult ReadReply() {
    v1::SessionResult result;
    auto rec = replies_->Next(absl::Seconds(20));
    EXPECT_TRUE(rec.ok() && rec->has_value());
    if (rec.ok() && rec->has_value()) {
      EXPECT_TRUE(result.ParseFromArray((*rec)->data, static_cast<int>((*rec)->bytes)));
      replies_->Release((*rec)->id);
    }
    return result;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  std::shared_ptr<ShmRing> requests_;
  std::shared_ptr<ShmRing> replies_;
};

TEST_F(RawSession, OffersThatCannotBeMappedAreRefusedSayingWhy) {
  bool opened = true;
  v1::SessionOffer offer = GoodOffer();
  offer.set_requests("garbage");
  absl::Status s = Session(offer, &opened, [] {});
  EXPECT_FALSE(opened);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("session: malformed"));

  offer = GoodOffer();
  std::optional<ShmOffer> parsed = ParseShmOffer(offer.replies());
  ASSERT_TRUE(parsed.has_value());
  offer.set_replies(absl::StrCat(parsed->name, " ", parsed->token_hex,
                                 " net:[1]"));
  s = Session(offer, &opened, [] {});
  EXPECT_FALSE(opened);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("network namespace"));

  offer = GoodOffer();
  offer.set_requests(absl::StrCat("/halka-held-none ", parsed->token_hex, " ",
                                  parsed->netns));
  s = Session(offer, &opened, [] {});
  EXPECT_FALSE(opened);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  // A ring larger than a session needs: refused before it is mapped (the
  // worker would populate it).
  std::shared_ptr<ShmRing> big = ShmRing::Create(4 * kSessionRingBytes).value();
  offer = GoodOffer();
  offer.set_replies(FormatShmOffer(*big));
  s = Session(offer, &opened, [] {});
  EXPECT_FALSE(opened);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("allowed here"));
}

TEST_F(RawSession, ARequestThatDoesNotParseEndsTheSessionWithDataLoss) {
  bool opened = false;
  absl::Status s = Session(GoodOffer(), &opened, [&] {
    Write(std::string("\xff\xff\xff\xff not a SessionCall", 22));
  });
  EXPECT_TRUE(opened);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("does not parse"));
  EXPECT_TRUE(replies_->closed());  // a client waiting on it wakes
}

TEST_F(RawSession, CallsOutOfSequenceEndTheSessionAfterAnsweringTheGoodOnes) {
  bool opened = false;
  v1::SessionResult first;
  absl::Status s = Session(GoodOffer(), &opened, [&] {
    // Call 1: a bad dtype, answered as Run answers it; then call 3.
    v1::SessionCall call;
    call.set_seq(1);
    call.mutable_run()->mutable_spec()->set_kind(v1::ALL_REDUCE);
    call.mutable_run()->mutable_spec()->set_dtype(static_cast<v1::DType>(99));
    call.mutable_run()->mutable_spec()->set_count(4);
    Write(call.SerializeAsString());
    first = ReadReply();
    call.set_seq(3);
    Write(call.SerializeAsString());
  });
  EXPECT_TRUE(opened);
  EXPECT_EQ(first.seq(), 1u);
  EXPECT_EQ(first.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << first.message();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("request 3 after request 1"));
}

TEST_F(RawSession, AClientThatKeepsItsSessionBusyCannotHoldAStoppingWorker) {
  grpc::ClientContext ctx;
  auto stream = stub_->Session(&ctx, GoodOffer());
  v1::SessionEvent event;
  ASSERT_TRUE(stream->Read(&event) && event.open());
  // Requests back to back (each refused at once: a bad dtype), the next
  // one written as soon as the answer is read; bounded by count.
  auto busy = StartRanks<int>({0}, [&](int) {
    int answered = 0;
    for (uint64_t seq = 1; seq <= 200000; ++seq) {
      v1::SessionCall call;
      call.set_seq(seq);
      call.mutable_run()->mutable_spec()->set_kind(v1::ALL_REDUCE);
      call.mutable_run()->mutable_spec()->set_dtype(static_cast<v1::DType>(99));
      call.mutable_run()->mutable_spec()->set_count(4);
      if (!requests_->TryWrite(call.SerializeAsString())) break;
      auto rec = replies_->Next(absl::Seconds(5));
      if (!rec.ok() || !rec->has_value()) break;
      replies_->Release((*rec)->id);
      ++answered;
    }
    return answered;
  });
  absl::SleepFor(absl::Milliseconds(200));
  cluster_->KillWorker(0);  // returns: the session ends under the load
  std::vector<int> answered = busy.Join();
  EXPECT_GT(answered[0], 0);
  EXPECT_LT(answered[0], 200000);
  while (stream->Read(&event)) {
  }
  grpc::Status end = stream->Finish();
  EXPECT_FALSE(end.ok());
}

TEST_F(RawSession, ClosingTheRingsEndsTheSessionCleanly) {
  bool opened = false;
  absl::Status s = Session(GoodOffer(), &opened, [&] { requests_->Close(); });
  EXPECT_TRUE(opened);
  EXPECT_TRUE(s.ok()) << s;
}

// The SDK marks each request with its client's id and its index among that
// client's requests (OpSpec.caller_id, call_index), from which a worker
// tells a call lost on its way (docs/failures.md). A fake worker records
// what arrives.
class SpecRecorder final : public v1::Worker::Service {
 public:
  grpc::Status RunInline(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::InlineReply, v1::InlineRequest>* stream)
      override {
    v1::InlineRequest msg;
    bool hold = false;
    if (stream->Read(&msg)) {
      absl::MutexLock lock(&mu_);
      specs_.push_back(msg.spec());
      hold = hold_first_ && specs_.size() == 1;
    }
    while (stream->Read(&msg)) {
    }
    if (hold) {
      // The first call stays in flight until a second one has arrived
      // (bounded), so the two overlap at the client.
      absl::MutexLock lock(&mu_);
      auto two = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return specs_.size() >= 2;
      };
      mu_.AwaitWithTimeout(absl::Condition(&two), absl::Seconds(10));
    }
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "recorded");
  }

  std::vector<v1::OpSpec> specs() {
    absl::MutexLock lock(&mu_);
    return specs_;
  }
  size_t count() {
    absl::MutexLock lock(&mu_);
    return specs_.size();
  }
  void HoldFirst() {
    absl::MutexLock lock(&mu_);
    hold_first_ = true;
    specs_.clear();
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::OpSpec> specs_ ABSL_GUARDED_BY(mu_);
  bool hold_first_ ABSL_GUARDED_BY(mu_) = false;
};

class ClientStamps : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                       &port_);
    b.RegisterService(&recorder_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<Client> NewClient() {
    Client::Options o;
    o.transfer = Client::Transfer::kInline;
    return Client::Connect(absl::StrCat("127.0.0.1:", port_), o).value();
  }

  int port_ = 0;
  SpecRecorder recorder_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(ClientStamps, OneClientsCallsCountFromOneUnderOneId) {
  std::unique_ptr<Client> a = NewClient();
  std::unique_ptr<Client> b = NewClient();
  std::vector<float> v(16, 1.0f);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(a->AllReduce(absl::MakeSpan(v), ReduceOp::kSum).ok());
  }
  EXPECT_FALSE(b->AllReduce(absl::MakeSpan(v), ReduceOp::kSum).ok());
  const std::vector<v1::OpSpec> got = recorder_.specs();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_NE(got[0].caller_id(), 0u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].caller_id(), got[0].caller_id()) << i;
    EXPECT_EQ(got[i].call_index(), static_cast<uint64_t>(i + 1)) << i;
  }
  EXPECT_NE(got[3].caller_id(), 0u);
  EXPECT_NE(got[3].caller_id(), got[0].caller_id());
  EXPECT_EQ(got[3].call_index(), 1u);
}

TEST_F(ClientStamps, ACallMadeWhileAnotherIsInFlightGoesUnmarked) {
  std::unique_ptr<Client> a = NewClient();
  recorder_.HoldFirst();
  std::vector<float> v1(16, 1.0f), v2(16, 2.0f);
  auto first = std::async(std::launch::async, [&] {
    return a->AllReduce(absl::MakeSpan(v1), ReduceOp::kSum);
  });
  for (absl::Time end = absl::Now() + absl::Seconds(10);
       recorder_.count() == 0 && absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(5))) {
  }
  ASSERT_EQ(recorder_.count(), 1u) << "the first call never arrived";
  EXPECT_FALSE(a->AllReduce(absl::MakeSpan(v2), ReduceOp::kSum).ok());
  EXPECT_FALSE(first.get().ok());
  const std::vector<v1::OpSpec> got = recorder_.specs();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].call_index(), 1u);
  // Its order against the first cannot be known at the worker: unmarked.
  EXPECT_EQ(got[1].caller_id(), 0u);
  EXPECT_EQ(got[1].call_index(), 0u);
  // The next call alone is marked again, right after the last index.
  EXPECT_FALSE(a->AllReduce(absl::MakeSpan(v2), ReduceOp::kSum).ok());
  ASSERT_EQ(recorder_.count(), 3u);
  EXPECT_EQ(recorder_.specs()[2].call_index(), 2u);
}

}  // namespace
}  // namespace halka
