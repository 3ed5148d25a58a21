// One rank's bad or abandoned call must not wedge the job (issue 13).
//
// Four real workers on loopback, driven the way a foreign client drives
// them: raw gRPC stubs of halka.v1.Worker (Run and RunInline). In each
// case one rank's call goes wrong — a bad dtype, a bad kind, a bad shm
// name, a short stream, data past count, a stream left hanging, a client
// that dies mid-upload — while the other ranks call correctly. The failing
// round must end on every rank within the operation's deadline (no hang),
// and the next round, issued identically on every rank, must succeed with
// the right sums.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "halka/local_cluster.h"
#include "halka/v1/worker.grpc.pb.h"
#include "tests/testing/run_ranks.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::RunRanks;

constexpr int kWorld = 4;
constexpr int64_t kCount = 300000;  // 1.2 MB of float32: two messages
constexpr absl::Duration kOpTimeout = absl::Seconds(3);

// What one rank's caller does in a round.
enum class Fault {
  kNone,
  kBadDType,     // RunInline with dtype 99
  kBadKind,      // RunInline with kind 77
  kShortStream,  // half the data, then half-close
  kExtraData,    // all the data, then one more message
  kHangUpload,   // half the data, then nothing (stream left open)
  kKillUpload,   // half the data, then the client cancels
  kBadShmName,   // Run with a shm name that is not a halka object
  kRunBadDType,  // Run (shm path) with dtype 99
};

struct Outcome {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
  std::vector<float> data;
  absl::Duration took;
};

v1::OpSpec SumSpec() {
  v1::OpSpec spec;
  spec.set_kind(v1::ALL_REDUCE);
  spec.set_dtype(v1::FLOAT32);
  spec.set_op(v1::SUM);
  spec.set_count(kCount);
  spec.set_algorithm(v1::RING);
  return spec;
}

// rank r, round k: element i holds r * 1000 + k + (i % 7), exact in float32.
std::vector<float> Input(int rank, int round) {
  std::vector<float> v(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    v[i] = static_cast<float>(rank * 1000 + round + static_cast<int>(i % 7));
  }
  return v;
}

float Expected(int round, int64_t i) {
  float s = 0;
  for (int r = 0; r < kWorld; ++r) {
    s += static_cast<float>(r * 1000 + round + static_cast<int>(i % 7));
  }
  return s;
}

class BadCalls : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalCluster::Options o;
    o.workers = kWorld;
    o.op_timeout = kOpTimeout;
    o.chunk_bytes = 64 << 10;
    cluster_ = LocalCluster::Start(o).value();
    for (int r = 0; r < kWorld; ++r) {
      stubs_.push_back(v1::Worker::NewStub(grpc::CreateChannel(
          cluster_->worker_address(r), grpc::InsecureChannelCredentials())));
    }
  }

  Outcome Call(int rank, int round, Fault fault) {
    const absl::Time t0 = absl::Now();
    Outcome out = CallInner(rank, round, fault);
    out.took = absl::Now() - t0;
    return out;
  }

  Outcome CallInner(int rank, int round, Fault fault) {
    Outcome out;
    v1::OpSpec spec = SumSpec();
    if (stamp_) {
      // As the SDK marks its calls (OpSpec.caller_id, call_index); a copy
      // re-sends the index of the rank's last call.
      spec.set_caller_id(1000 + static_cast<uint64_t>(rank));
      spec.set_call_index(copy_ ? index_[rank] : ++index_[rank]);
    }
    grpc::ClientContext ctx;  // no client deadline: the worker must bound it
    if (fault == Fault::kBadShmName || fault == Fault::kRunBadDType) {
      v1::RunRequest req;
      *req.mutable_spec() = spec;
      if (fault == Fault::kRunBadDType) req.mutable_spec()->set_dtype(static_cast<v1::DType>(99));
      req.set_shm_name(fault == Fault::kBadShmName ? "/etc-passwd/x" : "/halka-none");
      req.set_shm_size(kCount * 4);
      v1::RunReply reply;
      grpc::Status s = stubs_[rank]->Run(&ctx, req, &reply);
      out.code = static_cast<absl::StatusCode>(s.error_code());
      out.message = s.error_message();
      return out;
    }
    if (fault == Fault::kBadDType) spec.set_dtype(static_cast<v1::DType>(99));
    if (fault == Fault::kBadKind) spec.set_kind(static_cast<v1::OpKind>(77));
    std::vector<float> in = Input(rank, round);
    const char* bytes = reinterpret_cast<const char*>(in.data());
    const size_t total = in.size() * sizeof(float);
    const size_t half = total / 2;
    auto stream = stubs_[rank]->RunInline(&ctx);
    v1::InlineRequest msg;
    *msg.mutable_spec() = spec;
    const bool partial = fault == Fault::kShortStream ||
                         fault == Fault::kHangUpload ||
                         fault == Fault::kKillUpload;
    msg.set_data(bytes, partial ? half : (1 << 20));
    stream->Write(msg);
    if (!partial) {
      v1::InlineRequest rest;
      rest.set_data(bytes + (1 << 20), total - (1 << 20));
      stream->Write(rest);
    }
    if (fault == Fault::kExtraData) {
      v1::InlineRequest extra;
      extra.set_data("abcd", 4);
      stream->Write(extra);
    }
    if (fault == Fault::kKillUpload) {
      absl::SleepFor(absl::Milliseconds(100));
      ctx.TryCancel();
    }
    if (fault != Fault::kHangUpload && fault != Fault::kKillUpload) {
      stream->WritesDone();
    }
    v1::InlineReply reply;
    while (stream->Read(&reply)) {
      const size_t at = out.data.size();
      out.data.resize(at + reply.data().size() / sizeof(float));
      std::memcpy(out.data.data() + at, reply.data().data(), reply.data().size());
    }
    grpc::Status s = stream->Finish();
    out.code = static_cast<absl::StatusCode>(s.error_code());
    out.message = s.error_message();
    return out;
  }

  // One round: rank `bad` does `fault`, the others call correctly.
  std::vector<Outcome> Round(int round, int bad, Fault fault) {
    return RunRanks<Outcome>(kWorld, [&](int r) {
      return Call(r, round, r == bad ? fault : Fault::kNone);
    });
  }

  void ExpectCorrect(const std::vector<Outcome>& out, int round,
                     const std::string& what) {
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_EQ(out[r].code, absl::StatusCode::kOk)
          << what << ": rank " << r << ": " << out[r].message;
      ASSERT_EQ(out[r].data.size(), static_cast<size_t>(kCount)) << what;
      for (int64_t i = 0; i < kCount; i += 997) {
        ASSERT_EQ(out[r].data[i], Expected(round, i))
            << what << ": rank " << r << " element " << i;
      }
    }
  }

  // The fault round fails on every rank, bounded by the deadline (plus
  // slack for a loaded machine), and the next round succeeds.
  void FaultThenRecover(int bad, Fault fault, absl::StatusCode bad_code,
                        const std::string& bad_text) {
    const std::string what =
        absl::StrCat("fault ", static_cast<int>(fault), " on rank ", bad);
    ExpectCorrect(Round(1, -1, Fault::kNone), 1, what + ", round 1");
    std::vector<Outcome> failed = Round(2, bad, fault);
    EXPECT_EQ(failed[bad].code, bad_code) << what << ": " << failed[bad].message;
    if (!bad_text.empty()) {
      EXPECT_THAT(failed[bad].message, HasSubstr(bad_text)) << what;
    }
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_NE(failed[r].code, absl::StatusCode::kOk)
          << what << ": rank " << r << " succeeded without rank " << bad;
      EXPECT_LT(failed[r].took, kOpTimeout + absl::Seconds(5))
          << what << ": rank " << r << " took " << failed[r].took;
    }
    ExpectCorrect(Round(3, -1, Fault::kNone), 3, what + ", the round after");
    ExpectCorrect(Round(4, -1, Fault::kNone), 4, what + ", two rounds after");
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
  bool stamp_ = false;  // calls carry their caller's order
  bool copy_ = false;   // the next call re-sends the last index
  uint64_t index_[kWorld] = {};
};

TEST_F(BadCalls, BadDTypeOnOneRank) {
  FaultThenRecover(0, Fault::kBadDType, absl::StatusCode::kInvalidArgument,
                   "dtype");
}

TEST_F(BadCalls, BadKindOnOneRank) {
  FaultThenRecover(2, Fault::kBadKind, absl::StatusCode::kInvalidArgument,
                   "kind");
}

TEST_F(BadCalls, ShortStreamOnOneRank) {
  FaultThenRecover(1, Fault::kShortStream, absl::StatusCode::kInvalidArgument,
                   "got 600000 of 1200000 bytes");
}

TEST_F(BadCalls, DataPastCountInALaterMessage) {
  FaultThenRecover(3, Fault::kExtraData, absl::StatusCode::kInvalidArgument,
                   "a message after the buffer was full");
}

TEST_F(BadCalls, UploadLeftHangingEndsAtTheDeadline) {
  // The worker cancels the stream at the deadline; the client sees it
  // cancelled (the synchronous API cannot send a status then).
  FaultThenRecover(0, Fault::kHangUpload, absl::StatusCode::kCancelled, "");
}

TEST_F(BadCalls, ClientKilledMidUpload) {
  FaultThenRecover(2, Fault::kKillUpload, absl::StatusCode::kCancelled, "");
}

TEST_F(BadCalls, BadShmNameOnOneRank) {
  FaultThenRecover(1, Fault::kBadShmName, absl::StatusCode::kInvalidArgument,
                   "not a halka object");
}

TEST_F(BadCalls, BadDTypeThroughRunOnOneRank) {
  FaultThenRecover(3, Fault::kRunBadDType, absl::StatusCode::kInvalidArgument,
                   "dtype");
}

// The others learn why at once: their copy of the call fails naming the
// rank whose call was refused and its reason, well before the deadline.
TEST_F(BadCalls, OthersFailFastNamingTheRefusedRank) {
  ExpectCorrect(Round(1, -1, Fault::kNone), 1, "round 1");
  std::vector<Outcome> failed = Round(2, 0, Fault::kBadDType);
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_THAT(failed[r].message, HasSubstr("rank 0")) << "rank " << r;
    EXPECT_THAT(failed[r].message, HasSubstr("dtype")) << "rank " << r;
    EXPECT_EQ(failed[r].code, absl::StatusCode::kFailedPrecondition)
        << failed[r].message;
    // At once: not at the deadline, not after waiting for a generation.
    EXPECT_LT(failed[r].took, kOpTimeout / 3) << failed[r].message;
  }
  ExpectCorrect(Round(3, -1, Fault::kNone), 3, "round 3");
}

// One call too many on rank 0: it waits alone and fails at its deadline;
// the others' next call is paired with it and fails at once, naming rank 0
// (docs/failures.md, "A caller that makes one call more than the others").
TEST_F(BadCalls, OneCallTooManyFailsTheOthersFastNamingTheRank) {
  ExpectCorrect(Round(1, -1, Fault::kNone), 1, "round 1");
  Outcome extra = Call(0, 2, Fault::kNone);
  EXPECT_EQ(extra.code, absl::StatusCode::kDeadlineExceeded) << extra.message;
  EXPECT_LT(extra.took, kOpTimeout + absl::Seconds(5));
  std::vector<Outcome> next = RunRanks<Outcome>(kWorld - 1, [&](int i) {
    return Call(i + 1, 2, Fault::kNone);
  });
  for (int i = 0; i < kWorld - 1; ++i) {
    EXPECT_NE(next[i].code, absl::StatusCode::kOk) << "rank " << i + 1;
    EXPECT_THAT(next[i].message, HasSubstr("rank 0")) << "rank " << i + 1;
    EXPECT_LT(next[i].took, kOpTimeout / 2)
        << "rank " << i + 1 << " waited for its deadline: " << next[i].message;
  }
}

// Health tells the truth: while the last operation of some rank failed,
// the job is failing (with a diagnosis naming the rank); a good round
// clears it.
TEST_F(BadCalls, HealthSaysFailingUntilARoundSucceeds) {
  auto health = [&]() {
    v1::RingHealth h;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    EXPECT_TRUE(stubs_[0]->GetRingHealth(&ctx, v1::RingHealthRequest(), &h).ok());
    return h;
  };
  // Waits (bounded) for the heartbeats to carry the outcome.
  auto wait_failing = [&](bool want) {
    v1::RingHealth h;
    for (absl::Time end = absl::Now() + absl::Seconds(15); absl::Now() < end;
         absl::SleepFor(absl::Milliseconds(50))) {
      h = health();
      if (h.failing() == want) break;
    }
    return h;
  };
  ExpectCorrect(Round(1, -1, Fault::kNone), 1, "round 1");
  EXPECT_FALSE(wait_failing(false).failing());
  Round(2, 1, Fault::kBadDType);
  v1::RingHealth failing = wait_failing(true);
  ASSERT_TRUE(failing.failing()) << failing.DebugString();
  // The diagnosis is read once every rank's heartbeat has told its last
  // operation: with only one rank's report in, it names that rank's
  // message, which may be another survivor's relay of rank 1's refusal.
  for (absl::Time end = absl::Now() + absl::Seconds(15);
       absl::Now() < end &&
       absl::StrContains(failing.diagnosis().failure(), "ended no op");
       absl::SleepFor(absl::Milliseconds(50))) {
    failing = health();
  }
  EXPECT_THAT(failing.diagnosis().failure(), HasSubstr("rank 1"));
  ExpectCorrect(Round(3, -1, Fault::kNone), 3, "round 3");
  v1::RingHealth healed = wait_failing(false);
  EXPECT_FALSE(healed.failing()) << healed.DebugString();
}

// A call lost on its way (its connection broke before the worker saw it,
// as under heavy packet loss): the others wait for it until their deadline.
// The lost call's index is missing from its caller's order, so the worker
// gives its number up when the next call arrives, and that next round
// pairs on every rank again (without the index, that rank stays one call
// behind and every later round fails: the fault test's loss scenario found
// it).
TEST_F(BadCalls, ACallLostOnTheWayCostsOneRound) {
  stamp_ = true;
  ExpectCorrect(Round(1, -1, Fault::kNone), 1, "round 1");
  ++index_[1];  // rank 1's call of round 2 never arrives
  std::vector<Outcome> failed = RunRanks<Outcome>(kWorld - 1, [&](int i) {
    const int r = i == 0 ? 0 : i + 1;
    return Call(r, 2, Fault::kNone);
  });
  for (const Outcome& o : failed) {
    EXPECT_EQ(o.code, absl::StatusCode::kDeadlineExceeded) << o.message;
    EXPECT_THAT(o.message, HasSubstr("rank 1"));
    EXPECT_LT(o.took, kOpTimeout + absl::Seconds(5)) << o.message;
  }
  ExpectCorrect(Round(3, -1, Fault::kNone), 3, "the round after the loss");
  ExpectCorrect(Round(4, -1, Fault::kNone), 4, "two rounds after the loss");
}

// A call that reaches the worker after a later call of its caller (here a
// copy of the last one) runs nowhere: ABORTED at once, no number taken, and
// the next round pairs on every rank.
TEST_F(BadCalls, ACallAfterItsSuccessorRunsNowhere) {
  stamp_ = true;
  ExpectCorrect(Round(1, -1, Fault::kNone), 1, "round 1");
  copy_ = true;
  Outcome late = Call(2, 1, Fault::kNone);
  copy_ = false;
  EXPECT_EQ(late.code, absl::StatusCode::kAborted) << late.message;
  EXPECT_THAT(late.message, HasSubstr("after its call 1"));
  EXPECT_LT(late.took, kOpTimeout) << late.message;
  ExpectCorrect(Round(2, -1, Fault::kNone), 2, "the round after the copy");
}

// Calls without the caller's order (a foreign client) next to stamped
// ones: a refused unstamped call on one rank still costs one round only.
TEST_F(BadCalls, AnUnstampedBadCallBetweenStampedOnesCostsOneRound) {
  stamp_ = true;
  ExpectCorrect(Round(1, -1, Fault::kNone), 1, "round 1");
  stamp_ = false;
  std::vector<Outcome> failed = Round(2, 3, Fault::kBadDType);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(failed[r].code, absl::StatusCode::kOk) << "rank " << r;
  }
  stamp_ = true;
  // Ranks 0..2 count their round-2 calls in their callers' order although
  // those went out unstamped: their round-3 calls show a gap whose number
  // the ring has already passed (the unstamped call took it), so nothing
  // may be given up. Rank 3's foreign call left no gap in its order.
  for (int r = 0; r < 3; ++r) ++index_[r];
  ExpectCorrect(Round(3, -1, Fault::kNone), 3, "the round after");
}

}  // namespace
}  // namespace halka
