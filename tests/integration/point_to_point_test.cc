// Point to point (Client::Send/Recv) through the SDK and real workers on
// loopback: over each link kind (shared memory, the TCP wire, the gRPC
// stream) and each transfer (staged shared memory, inline). Messages
// arrive whole and in order per sender; any-source receives name their
// sender; a wrong tag or size, a bad peer or a silent peer gives a clear
// error naming the rank; and sends and receives never disturb the
// numbering of the collectives around them.
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "tests/testing/cluster_harness.h"
#include "tests/testing/run_ranks.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::ClusterHarness;
using halka::testing::RunRanks;

enum class Path { kShm, kWire, kGrpc };
// kZeroCopy: receive buffers shared with the worker (HostBuffer), which
// the worker writes directly; plain memory goes inline either way (a
// send or recv never holds the client's staging object).
enum class Via { kZeroCopy, kInline };

// A receive buffer: shared with the worker (kZeroCopy) or plain.
class Mem {
 public:
  Mem(Client& client, Via via, size_t bytes, uint8_t fill) : bytes_(bytes) {
    if (via == Via::kZeroCopy) {
      absl::StatusOr<HostBuffer> b =
          client.AllocateHostBuffer(std::max<size_t>(bytes, 1));
      EXPECT_TRUE(b.ok()) << b.status();
      if (b.ok()) shared_ = std::move(*b);
      data_ = static_cast<uint8_t*>(shared_.data());
    } else {
      plain_.resize(std::max<size_t>(bytes, 1));
      data_ = plain_.data();
    }
    if (data_ != nullptr) std::memset(data_, fill, std::max<size_t>(bytes, 1));
  }
  uint8_t* data() const { return data_; }
  std::vector<uint8_t> bytes() const {
    return std::vector<uint8_t>(data_, data_ + bytes_);
  }

 private:
  size_t bytes_;
  HostBuffer shared_;
  std::vector<uint8_t> plain_;
  uint8_t* data_ = nullptr;
};

// Bytes of a message from `from` to `to`, number `n`: all distinct.
std::vector<uint8_t> Message(int from, int to, int n, size_t bytes) {
  std::vector<uint8_t> m(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    m[i] = static_cast<uint8_t>(from * 71 + to * 13 + n * 7 + i * 31 + i / 251);
  }
  return m;
}

using Param = std::tuple<Path, Via>;
class PointToPoint : public ::testing::TestWithParam<Param> {
 protected:
  static constexpr int kWorld = 3;
  void SetUp() override {
    const auto [path, via] = GetParam();
    via_ = via;
    halka::testing::ClusterOptions o;
    o.workers = kWorld;
    o.chunk_bytes = 4096;  // a message of more spans several pieces
    o.op_timeout = absl::Seconds(20);
    o.shm_links = path == Path::kShm;
    o.wire_links = path == Path::kWire;
    o.transfer = via == Via::kInline ? Client::Transfer::kInline
                                     : Client::Transfer::kSharedMemory;
    h_ = std::make_unique<ClusterHarness>(o);
    ASSERT_TRUE(h_->ok()) << h_->status();
  }
  Client& client(int r) { return h_->client(r); }

  // One all-reduce on every rank, checked: the collectives' numbering is
  // intact around the point-to-point calls.
  void SumEverywhere(float base) {
    std::vector<std::vector<float>> bufs(kWorld);
    auto results = RunRanks<absl::StatusOr<OpInfo>>(kWorld, [&](int r) {
      bufs[static_cast<size_t>(r)].assign(1000, base + static_cast<float>(r));
      return client(r).AllReduce(absl::MakeSpan(bufs[static_cast<size_t>(r)]),
                                 ReduceOp::kSum);
    });
    const float want = 3 * base + 3;  // ranks 0, 1, 2
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(results[static_cast<size_t>(r)].ok())
          << "rank " << r << ": " << results[static_cast<size_t>(r)].status();
      for (float v : bufs[static_cast<size_t>(r)]) ASSERT_EQ(v, want) << "rank " << r;
    }
  }
  std::unique_ptr<ClusterHarness> h_;
  Via via_ = Via::kInline;
};

// As PyTorch's test_send_recv: each rank in turn sends to every other rank
// a message of its own size; every byte arrives, and the SDK says who and
// how much. Sizes: empty, one byte, several pieces with a tail, 1 MiB.
TEST_P(PointToPoint, EveryRankToEveryOtherWhole) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{3 * 4096 + 17},
                       size_t{1} << 20}) {
    SCOPED_TRACE(absl::StrCat(bytes, " bytes"));
    auto results = RunRanks<absl::Status>(kWorld, [&](int r) -> absl::Status {
      for (int src = 0; src < kWorld; ++src) {
        if (src == r) {
          for (int dst = 0; dst < kWorld; ++dst) {
            if (dst == r) continue;
            const std::vector<uint8_t> m = Message(r, dst, 0, bytes);
            absl::StatusOr<OpInfo> info =
                client(r).Send(m.data(), bytes, DType::kUInt8, dst);
            if (!info.ok()) return info.status();
            if (info->peer != dst || info->bytes_sent != bytes) {
              return absl::InternalError(absl::StrCat(
                  "send says peer ", info->peer, ", ", info->bytes_sent, " bytes"));
            }
          }
        } else {
          Mem got(client(r), via_, bytes, 0xEE);
          absl::StatusOr<OpInfo> info =
              client(r).Recv(got.data(), bytes, DType::kUInt8, src);
          if (info.ok() && via_ == Via::kZeroCopy && bytes > 0 &&
              !info->zero_copy) {
            return absl::InternalError("a recv into a HostBuffer was not zero-copy");
          }
          if (!info.ok()) return info.status();
          if (info->peer != src || info->bytes_received != bytes) {
            return absl::InternalError(absl::StrCat(
                "recv says peer ", info->peer, ", ", info->bytes_received, " bytes"));
          }
          if (got.bytes() != Message(src, r, 0, bytes)) {
            return absl::DataLossError(absl::StrCat("rank ", r, " from ", src,
                                                    ": the bytes differ"));
          }
        }
      }
      return absl::OkStatus();
    });
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(results[static_cast<size_t>(r)].ok())
          << "rank " << r << ": " << results[static_cast<size_t>(r)];
    }
  }
  SumEverywhere(1);
}

// Typed messages keep their values (float64 through the byte path).
TEST_P(PointToPoint, TypedElements) {
  auto results = RunRanks<absl::Status>(2, [&](int r) -> absl::Status {
    std::vector<double> v(777);
    if (r == 0) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * static_cast<double>(i) - 3;
      return client(0).Send(absl::Span<const double>(v), 1, /*tag=*/4).status();
    }
    absl::StatusOr<OpInfo> info = client(1).Recv(absl::MakeSpan(v), 0, 4);
    if (!info.ok()) return info.status();
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] != 0.1 * static_cast<double>(i) - 3) {
        return absl::DataLossError(absl::StrCat("element ", i, " is ", v[i]));
      }
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

// Twenty messages of changing sizes from one sender arrive in order.
TEST_P(PointToPoint, OneSendersMessagesInOrder) {
  auto size_of = [](int n) { return static_cast<size_t>(n * 997 % 9000); };
  auto results = RunRanks<absl::Status>(2, [&](int r) -> absl::Status {
    for (int n = 0; n < 20; ++n) {
      const size_t bytes = size_of(n);
      if (r == 1) {
        const std::vector<uint8_t> m = Message(1, 0, n, bytes);
        absl::Status s = client(1).Send(m.data(), bytes, DType::kUInt8, 0, n).status();
        if (!s.ok()) return s;
      } else {
        std::vector<uint8_t> got(bytes);
        absl::Status s = client(0).Recv(got.data(), bytes, DType::kUInt8, 1, n).status();
        if (!s.ok()) return s;
        if (got != Message(1, 0, n, bytes)) {
          return absl::DataLossError(absl::StrCat("message ", n, " differs"));
        }
      }
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

// As test_send_recv_any_source: rank 0 takes 2(G-1) messages from any
// rank; each says who sent it, and every sender is heard twice.
TEST_P(PointToPoint, AnySourceNamesTheSender) {
  constexpr size_t kBytes = 6000;
  std::map<int, int> heard;
  auto results = RunRanks<absl::Status>(kWorld, [&](int r) -> absl::Status {
    if (r != 0) {
      for (int n = 0; n < 2; ++n) {
        const std::vector<uint8_t> m(kBytes, static_cast<uint8_t>(r));
        absl::Status s = client(r).Send(m.data(), kBytes, DType::kUInt8, 0).status();
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }
    for (int n = 0; n < 2 * (kWorld - 1); ++n) {
      Mem got(client(0), via_, kBytes, 0);
      absl::StatusOr<OpInfo> info =
          client(0).Recv(got.data(), kBytes, DType::kUInt8, /*from=*/-1);
      if (!info.ok()) return info.status();
      if (info->peer < 1 || info->peer >= kWorld ||
          got.bytes() != std::vector<uint8_t>(kBytes, static_cast<uint8_t>(info->peer))) {
        return absl::DataLossError(absl::StrCat(
            "a message said to be rank ", info->peer, "'s holds ", int{got.data()[0]}));
      }
      ++heard[info->peer];
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(heard, (std::map<int, int>{{1, 2}, {2, 2}}));
}

// A send issued before a collective on one rank, and received after it on
// the other: the bytes wait in the receiving worker; the all-reduce runs.
TEST_P(PointToPoint, SendsWaitForTheirRecvAcrossACollective) {
  std::vector<std::vector<float>> bufs(kWorld, std::vector<float>(100));
  std::vector<uint8_t> got(5000);
  const std::vector<uint8_t> m = Message(1, 0, 9, got.size());
  auto results = RunRanks<absl::Status>(kWorld, [&](int r) -> absl::Status {
    auto& b = bufs[static_cast<size_t>(r)];
    std::fill(b.begin(), b.end(), static_cast<float>(r + 1));
    if (r == 1) {
      absl::Status s = client(1).Send(m.data(), m.size(), DType::kUInt8, 0).status();
      if (!s.ok()) return s;
    }
    absl::Status s = client(r).AllReduce(absl::MakeSpan(b), ReduceOp::kSum).status();
    if (!s.ok() || r != 0) return s;
    return client(0).Recv(got.data(), got.size(), DType::kUInt8, 1).status();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(got, m);
  for (const auto& b : bufs) EXPECT_EQ(b[0], 6.0f);
}

// A send issued while this worker's collective runs goes out at once, not
// after it: rank 0's all-reduce waits for rank 1's, which rank 1 calls
// only after its recv of rank 0's send. Were the send queued behind the
// all-reduce, every rank would wait for its deadline.
TEST_P(PointToPoint, ASendDuringACollectiveDoesNotWaitForIt) {
  std::vector<std::vector<float>> bufs(kWorld, std::vector<float>(100));
  std::vector<uint8_t> got(3000);
  const std::vector<uint8_t> m = Message(0, 1, 4, got.size());
  OpOptions o;
  o.timeout = absl::Seconds(15);
  auto results = RunRanks<absl::Status>(kWorld, [&](int r) -> absl::Status {
    auto& b = bufs[static_cast<size_t>(r)];
    std::fill(b.begin(), b.end(), static_cast<float>(r + 1));
    if (r == 1) {
      absl::Status s =
          client(1).Recv(got.data(), got.size(), DType::kUInt8, 0, 0, o).status();
      if (!s.ok()) return s;
      return client(1).AllReduce(absl::MakeSpan(b), ReduceOp::kSum, o).status();
    }
    if (r != 0) return client(r).AllReduce(absl::MakeSpan(b), ReduceOp::kSum, o).status();
    auto sum = std::async(std::launch::async, [&] {
      return client(0).AllReduce(absl::MakeSpan(b), ReduceOp::kSum, o).status();
    });
    // The all-reduce reaches the worker first (and waits there for rank 1).
    absl::SleepFor(absl::Milliseconds(300));
    absl::Status sent =
        client(0).Send(m.data(), m.size(), DType::kUInt8, 1, 0, o).status();
    absl::Status summed = sum.get();
    return sent.ok() ? summed : sent;
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(got, m);
  for (const auto& b : bufs) EXPECT_EQ(b[0], 6.0f);
  SumEverywhere(1.0f);  // and the numbering is intact
}

// A recv waiting for its peer holds up neither the same worker's
// collectives nor its sends (as torch's batch_isend_irecv needs: every
// rank posts its receives before its sends).
TEST_P(PointToPoint, AWaitingRecvHoldsUpNothingElse) {
  constexpr size_t kBytes = 3000;
  auto results = RunRanks<absl::Status>(kWorld, [&](int r) -> absl::Status {
    std::vector<Mem> got;
    for (int p = 0; p < kWorld; ++p) got.emplace_back(client(r), via_, kBytes, 0);
    // Every receive first (on a thread of its own), then a collective,
    // then every send.
    auto recvs = std::async(std::launch::async, [&]() -> absl::Status {
      for (int p = 0; p < kWorld; ++p) {
        if (p == r) continue;
        absl::Status s = client(r).Recv(got[static_cast<size_t>(p)].data(),
                                        kBytes, DType::kUInt8, p).status();
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    });
    std::vector<float> sum(64, 1.0f);
    absl::Status s = client(r).AllReduce(absl::MakeSpan(sum), ReduceOp::kSum).status();
    if (!s.ok()) return s;
    if (sum[0] != static_cast<float>(kWorld)) {
      return absl::DataLossError(absl::StrCat("sum ", sum[0]));
    }
    for (int p = 0; p < kWorld; ++p) {
      if (p == r) continue;
      const std::vector<uint8_t> m = Message(r, p, 1, kBytes);
      s = client(r).Send(m.data(), kBytes, DType::kUInt8, p).status();
      if (!s.ok()) return s;
    }
    s = recvs.get();
    if (!s.ok()) return s;
    for (int p = 0; p < kWorld; ++p) {
      if (p != r && got[static_cast<size_t>(p)].bytes() != Message(p, r, 1, kBytes)) {
        return absl::DataLossError(absl::StrCat("from ", p, ": the bytes differ"));
      }
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

// A recv whose tag or size differs from the message's: FAILED_PRECONDITION
// naming both; the message is consumed and the next one is taken.
TEST_P(PointToPoint, WrongTagOrSizeIsNamedAndTheNextMessageIsTaken) {
  auto results = RunRanks<absl::Status>(2, [&](int r) -> absl::Status {
    if (r == 1) {
      for (int n = 0; n < 3; ++n) {
        const std::vector<uint8_t> m = Message(1, 0, n, 9000);
        absl::Status s = client(1).Send(m.data(), m.size(), DType::kUInt8, 0, 5).status();
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }
    std::vector<uint8_t> got(9000);
    absl::Status tag = client(0).Recv(got.data(), got.size(), DType::kUInt8, 1, 6).status();
    EXPECT_EQ(tag.code(), absl::StatusCode::kFailedPrecondition) << tag;
    EXPECT_THAT(std::string(tag.message()), HasSubstr("tag 5"));
    EXPECT_THAT(std::string(tag.message()), HasSubstr("tag 6"));
    EXPECT_THAT(std::string(tag.message()), HasSubstr("rank 1"));
    absl::Status size = client(0).Recv(got.data(), 100, DType::kUInt8, 1, 5).status();
    EXPECT_EQ(size.code(), absl::StatusCode::kFailedPrecondition) << size;
    EXPECT_THAT(std::string(size.message()), HasSubstr("9000 bytes"));
    absl::Status third = client(0).Recv(got.data(), got.size(), DType::kUInt8, 1, 5).status();
    if (!third.ok()) return third;
    if (got != Message(1, 0, 2, 9000)) {
      return absl::DataLossError("the third message differs");
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  SumEverywhere(2);
}

// A peer that sends nothing: the recv ends at its deadline naming it.
// A peer outside the ring, or this rank itself: INVALID_ARGUMENT. None of
// these takes a number: the collectives after them pair as before.
TEST_P(PointToPoint, SilentOrBadPeersAreNamedAndTakeNoNumber) {
  std::vector<uint8_t> got(64);
  OpOptions quick;
  quick.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::Status silent =
      client(0).Recv(got.data(), got.size(), DType::kUInt8, 2, 0, quick).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(silent.code(), absl::StatusCode::kDeadlineExceeded) << silent;
  EXPECT_THAT(std::string(silent.message()), HasSubstr("rank 2"));
  absl::Status self = client(1).Send(got.data(), 8, DType::kUInt8, 1).status();
  EXPECT_EQ(self.code(), absl::StatusCode::kInvalidArgument) << self;
  EXPECT_THAT(std::string(self.message()), HasSubstr("rank 1"));
  absl::Status outside = client(1).Send(got.data(), 8, DType::kUInt8, 7).status();
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument) << outside;
  EXPECT_THAT(std::string(outside.message()), HasSubstr("ring of 3"));
  absl::Status negative = client(2).Recv(got.data(), 8, DType::kUInt8, -2).status();
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument) << negative;
  SumEverywhere(3);
  SumEverywhere(4);
}

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  const auto [path, via] = info.param;
  return absl::StrCat(path == Path::kShm    ? "Shm"
                      : path == Path::kWire ? "Wire"
                                            : "Grpc",
                      via == Via::kZeroCopy ? "ZeroCopy" : "Inline");
}

INSTANTIATE_TEST_SUITE_P(
    Paths, PointToPoint,
    ::testing::Combine(::testing::Values(Path::kShm, Path::kWire, Path::kGrpc),
                       ::testing::Values(Via::kZeroCopy, Via::kInline)),
    Name);

}  // namespace
}  // namespace halka
