// The wire data path (transport/tcp/wire_link.h) on loopback: sealing, the
// listener's one-time tokens, frames end to end plain and sealed, and what
// a hostile or broken connection gets.
#include "transport/tcp/wire_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tests/testing/loopback.h"
#include "tests/testing/data_meta.h"
#include "common/grpc_util.h"
#include "codec/frame_codec.h"
#include "seal/wire_ocb.h"
#include "seal/wire_seal.h"

namespace halka {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

int Dial(int port) { return testing::DialLoopback(port); }

// Dials, presents the token (hex) and takes the listener's ack.
void DialWithToken(int port, const std::string& token, int* fd) {
  *fd = Dial(port);
  ASSERT_GE(*fd, 0) << std::strerror(errno);
  const std::string raw = WireUnhex(token);
  ASSERT_EQ(write(*fd, raw.data(), raw.size()), 16);
  char ack = 0;
  ASSERT_EQ(read(*fd, &ack, 1), 1);
  ASSERT_EQ(ack, 'k');
}

// This file runs once with each engine (tests/CMakeLists.txt:
// wire_link_test_vaes512 sets HALKA_WIRE_OCB=vaes-512). Where this CPU
// cannot take vaes-512, that run skips everything: the process would
// refuse the engine.
class EngineEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* pick = std::getenv("HALKA_WIRE_OCB");
    if (pick == nullptr || std::string(pick) != "vaes-512") return;
    const absl::Status usable = WireSeal::CheckEngine(WireSealEngine::kVaes512);
    if (!usable.ok()) GTEST_SKIP() << usable.message();
  }
};
::testing::Environment* const engine_environment =
    ::testing::AddGlobalTestEnvironment(new EngineEnvironment);

// Which code seals: OpenSSL's OCB unless HALKA_WIRE_OCB opts in to
// vaes-512, whatever the CPU.
TEST(WireSealEngine, OpenSslUnlessTheEnvironmentOptsIn) {
  const char* pick = std::getenv("HALKA_WIRE_OCB");
  const bool vaes = pick != nullptr && std::string(pick) == "vaes-512";
  EXPECT_STREQ(WireSeal::Engine(), vaes ? "vaes-512" : "openssl");
}

TEST(WireSealTest, RoundTripAndEveryAlterationFails) {
  const std::string key = *WireSeal::NewKey();
  ASSERT_EQ(key.size(), WireSeal::kKeyBytes);
  WireSeal tx(key), rx(key);
  const std::vector<uint8_t> a = Bytes(1000, 1), b = Bytes(77, 9);
  const uint8_t aad[4] = {1, 2, 3, 4};
  std::vector<absl::Span<const uint8_t>> parts = {a, b};
  std::vector<uint8_t> rec1(a.size() + b.size() + WireSeal::kTagBytes);
  ASSERT_TRUE(tx.Seal(parts, aad, rec1.data()).ok());
  std::vector<uint8_t> rec2(rec1.size());
  ASSERT_TRUE(tx.Seal(parts, aad, rec2.data()).ok());
  EXPECT_NE(rec1, rec2) << "two records under one key share a nonce";
  EXPECT_NE(0, std::memcmp(rec1.data(), a.data(), 16)) << "not encrypted";

  std::vector<uint8_t> plain = rec1;
  ASSERT_TRUE(rx.Open(plain.data(), a.size() + b.size(), aad).ok());
  EXPECT_EQ(0, std::memcmp(plain.data(), a.data(), a.size()));
  EXPECT_EQ(0, std::memcmp(plain.data() + a.size(), b.data(), b.size()));

  // Record 1 again where record 2 is due: a replay.
  std::vector<uint8_t> again = rec1;
  absl::Status s = rx.Open(again.data(), a.size() + b.size(), aad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;

  // A flipped bit, another length (associated data), another key.
  for (int variant = 0; variant < 3; ++variant) {
    WireSeal fresh_tx(key), fresh_rx(variant == 2 ? *WireSeal::NewKey() : key);
    std::vector<uint8_t> rec(rec1.size());
    ASSERT_TRUE(fresh_tx.Seal(parts, aad, rec.data()).ok());
    uint8_t other_aad[4] = {1, 2, 3, 5};
    if (variant == 0) rec[500] ^= 0x10;
    s = fresh_rx.Open(rec.data(), a.size() + b.size(),
                      variant == 1 ? absl::Span<const uint8_t>(other_aad)
                                   : absl::Span<const uint8_t>(aad));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "variant " << variant;
  }
}

TEST(WireAnswerTest, ParsesOnlyWellFormedAnswers) {
  int port = 0;
  std::string token;
  const std::string good(32, 'a');
  EXPECT_TRUE(ParseWireAnswer(FormatWireAnswer(4242, good), &port, &token));
  EXPECT_EQ(port, 4242);
  EXPECT_EQ(token, good);
  for (const std::string& bad : std::vector<std::string>{std::string("no: this worker takes no wire links"), "ok 0 " + good,
        "ok 70000 " + good, "ok 12 abc", "ok 12 " + std::string(32, 'G'),
        "ok 12", "ok x " + good, "ok 12 " + good + " extra"}) {
    EXPECT_FALSE(ParseWireAnswer(bad, &port, &token)) << bad;
  }
  EXPECT_EQ(HostOf("10.0.0.1:7000"), "10.0.0.1");
  EXPECT_EQ(HostOf("[::1]:7000"), "::1");
  EXPECT_EQ(HostOf("worker-3.halka:7000"), "worker-3.halka");
  EXPECT_EQ(WireUnhex(WireHex(std::string("\x00\xff\x10", 3))),
            std::string("\x00\xff\x10", 3));
  EXPECT_EQ(WireUnhex("abc"), "");
}

// What a sender answers (on_ready), waited for up to 10 s.
struct ReadyProbe {
  absl::Mutex mu;
  std::optional<absl::Status> ready ABSL_GUARDED_BY(mu);
  std::function<void(const absl::Status&)> Callback() {
    return [this](const absl::Status& s) {
      absl::MutexLock lock(&mu);
      ready = s;
    };
  }
  absl::Status Await() {
    absl::MutexLock lock(&mu);
    auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return ready.has_value();
    };
    if (!mu.AwaitWithTimeout(absl::Condition(&answered), absl::Seconds(10))) {
      return absl::DeadlineExceededError("the sender never answered");
    }
    return *ready;
  }
};

// Payload pieces joined.
std::string PayloadOf(const InFrame& f) {
  std::string out;
  for (const auto& p : f.pieces) {
    out.append(reinterpret_cast<const char*>(p.data()), p.size());
  }
  return out;
}

// A listener and the receiver its callback starts for one expected link;
// what the receiver reports, under mu_.
class RawWireFixture {
 protected:
  // The receiver stops outside mu_ (its callbacks take it).
  void StopAll() {
    std::unique_ptr<WireReceiver> r;
    {
      absl::MutexLock lock(&mu_);
      r = std::move(receiver_);
    }
    r.reset();
    listener_->Stop();
    if (fd_ >= 0) close(fd_);
  }
  // A receiver's frame callback: a good frame goes to `keep` (under mu_),
  // a bad one to errors_.
  template <typename Keep>
  WireReceiver::OnFrame Collect(Keep keep) {
    return [this, keep](absl::StatusOr<InFrame> f) {
      absl::MutexLock lock(&mu_);
      if (!f.ok()) {
        errors_.push_back(f.status());
        return f.status();
      }
      keep(*std::move(f));
      return absl::OkStatus();
    };
  }
  // Expects one link (token_): the listener hands it to a receiver that
  // reads with `key`, calls `on_frame`, and reports the link's end to
  // errors_.
  void ExpectReceiver(const std::string& key, WireReceiver::OnFrame on_frame,
                      std::shared_ptr<LandingBoard> landings = nullptr,
                      int from = -1,
                      std::shared_ptr<LinkCounters> counters = nullptr) {
    token_ = listener_->Expect([=](int fd) {
      absl::MutexLock lock(&mu_);
      receiver_ = std::make_unique<WireReceiver>(
          fd, key, on_frame,
          [this](const absl::Status& s) {
            absl::MutexLock lock(&mu_);
            errors_.push_back(s);
          },
          landings, from, counters);
    });
  }
  // Waits (20 s at most) until `frames` (guarded by mu_) holds n or an
  // error came; whether it holds n.
  template <typename Frames>
  bool WaitCollected(const Frames& frames, size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return frames.size() >= n || !errors_.empty();
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(20)) &&
           frames.size() >= n;
  }

  std::unique_ptr<WireListener> listener_;
  std::string key_, token_;
  int fd_ = -1;
  absl::Mutex mu_;
  std::unique_ptr<WireReceiver> receiver_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> errors_ ABSL_GUARDED_BY(mu_);
};

// One link, end to end: a listener, an expected token, a sender, the
// receiver the listener's callback starts; frames collected in order.
class WireLinkTest : public ::testing::TestWithParam<bool>,
                     protected RawWireFixture {
 protected:
  void SetUp() override {
    auto l = WireListener::Start("127.0.0.1");
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = *std::move(l);
    if (GetParam()) key_ = *WireSeal::NewKey();
  }
  void TearDown() override {
    if (sender_) sender_->Close();
    StopAll();
  }

  std::string ExpectLink() {
    ExpectReceiver(key_, Collect([this](InFrame f) {
                     frames_.push_back({f.meta.op_seq, PayloadOf(f)});
                   }));
    return token_;
  }

  // Starts a sender and waits for its answer.
  absl::Status Connect(const std::string& token, const std::string& key,
                       int port = 0, const std::string& congestion = "auto") {
    if (sender_) sender_->Close();  // before its probe goes
    probe_ = std::make_unique<ReadyProbe>();
    sender_ = std::make_unique<WireSender>(
        "127.0.0.1", port != 0 ? port : listener_->port(), token, key,
        probe_->Callback(),
        [this](const absl::Status& s) {
          absl::MutexLock lock(&mu_);
          failed_ = s;
        },
        congestion);
    return probe_->Await();
  }

  // A valid float32 data frame of `count` elements, as the transport
  // hands it to a path: its encoded bytes in parts, released when written.
  WireSender::Frame DataFrame(uint64_t seq, const std::vector<uint8_t>& data,
                              std::atomic<int>* released) {
    const FrameMeta m = testing::DataChunkMeta(3, seq, Phase::kReduceScatter,
                                               0, data.size() / 4);
    grpc::ByteBuffer buffer = EncodeFrame(m, data);
    auto slices = std::make_shared<std::vector<grpc::Slice>>();
    (void)buffer.Dump(slices.get());
    WireSender::Frame f;
    for (const grpc::Slice& s : *slices) f.parts.emplace_back(s.begin(), s.size());
    f.keepalive = slices;
    f.on_released = [released] { released->fetch_add(1); };
    return f;
  }

  bool WaitFrames(size_t n) { return WaitCollected(frames_, n); }

  // No reader error, every frame arrived (`all`: WaitFrames' answer), and
  // frame i is message i + 1 with exactly expected[i]'s bytes.
  void ExpectFramesAre(const std::vector<std::vector<uint8_t>>& expected,
                       bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ASSERT_TRUE(errors_.empty()) << errors_.front().ToString();
    ASSERT_TRUE(all) << frames_.size() << " frames of " << expected.size();
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_EQ(frames_[i].first, i + 1) << "frame " << i;
      // Not ASSERT_EQ on the bytes: a large frame's difference would
      // flood the log.
      ASSERT_TRUE(frames_[i].second ==
                  std::string(expected[i].begin(), expected[i].end()))
          << "frame " << i << " altered";
    }
  }

  // AFailedOperationsFramesLeaveAtOnceAndItsAbortIsNext, with kFrames
  // frames of kBytes.
  void ExpectWithdrawal(size_t kBytes, int kFrames);

  // Whether `released` reaches n within 10 s.
  static bool WaitReleased(const std::atomic<int>& released, int n) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (released.load() < n && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return released.load() == n;
  }

  std::unique_ptr<WireSender> sender_;
  std::vector<std::pair<uint64_t, std::string>> frames_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ReadyProbe> probe_;
  std::optional<absl::Status> failed_ ABSL_GUARDED_BY(mu_);
};

TEST_P(WireLinkTest, FramesArriveInOrderAndIntact) {
  const std::string token = ExpectLink();
  ASSERT_EQ(token.size(), 32u);
  ASSERT_TRUE(Connect(token, key_).ok());
  std::atomic<int> released{0};
  std::vector<std::vector<uint8_t>> sent;
  // Sizes across the record boundary cases: empty, odd, 1 MiB + 4.
  const size_t sizes[] = {0, 4, 4096, 65540, (size_t{1} << 20) + 4, 12};
  for (size_t i = 0; i < 30; ++i) {
    sent.push_back(Bytes(sizes[i % 6], static_cast<uint8_t>(i)));
    sender_->SendOne(DataFrame(i + 1, sent.back(), &released));
  }
  const bool all = WaitFrames(30);
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(errors_.empty()) << errors_.front().ToString();
  ASSERT_TRUE(all) << frames_.size() << " frames of 30";
  for (size_t i = 0; i < 30; ++i) {
    EXPECT_EQ(frames_[i].first, i + 1);
    EXPECT_EQ(frames_[i].second,
              std::string(sent[i].begin(), sent[i].end()))
        << "frame " << i;
  }
  EXPECT_EQ(released.load(), 30);
}

// reno is built into every Linux kernel and always allowed: a link asked
// for it sends under it, and frames still arrive. auto keeps the host's
// default unless that is bbr (a loopback link's round trip is far under
// 1 ms).
TEST_P(WireLinkTest, TheSendingSocketTakesTheCongestionControlAskedFor) {
  const std::string host = DefaultCongestion();
  ASSERT_FALSE(host.empty());
  ASSERT_TRUE(Connect(ExpectLink(), key_, 0, "reno").ok());
  EXPECT_EQ(sender_->congestion(), "reno");
  std::atomic<int> released{0};
  const std::vector<uint8_t> payload(4096, 7);  // the frame points into it
  sender_->SendOne(DataFrame(1, payload, &released));
  const bool all = WaitFrames(1);
  absl::MutexLock lock(&mu_);
  ExpectFramesAre({payload}, all);
}

// auto on a connected link: the round trip it read is the kernel's, in
// microseconds (a loopback link's is far under a second and not zero),
// and what the socket took follows the rule for that round trip and the
// host's default (on a bbr host, almost always cubic or reno).
TEST_P(WireLinkTest, AutoFollowsTheRuleWithTheLinksRoundTrip) {
  const std::string host = DefaultCongestion();
  ASSERT_FALSE(host.empty());
  ASSERT_TRUE(Connect(ExpectLink(), key_, 0, "auto").ok());
  const CongestionChoice c = sender_->congestion_choice();
  EXPECT_EQ(c.host, host);
  EXPECT_GT(c.rtt, absl::ZeroDuration());
  EXPECT_LT(c.rtt, absl::Seconds(1));
  const std::vector<std::string> tries = CongestionTries(host, "auto", c.rtt);
  if (tries.empty()) {
    EXPECT_EQ(c.in_use, host) << "round trip " << c.rtt;
  } else {
    EXPECT_TRUE(c.in_use == tries[0] || c.in_use == tries[1]) << c.in_use;
    EXPECT_TRUE(c.changed());
  }
  EXPECT_EQ(sender_->congestion(), c.in_use);
}

// What each --wire_congestion value asks the kernel for, whatever this
// host's default is: auto changes bbr (and its later versions) only on a
// link whose round trip is known and under 1 ms.
TEST(WireCongestionTest, WhatEachValueAsksFor) {
  using V = std::vector<std::string>;
  const absl::Duration near = absl::Microseconds(40);
  const absl::Duration far = absl::Milliseconds(30);
  EXPECT_EQ(CongestionTries("bbr", "auto", near), (V{"cubic", "reno"}));
  EXPECT_EQ(CongestionTries("bbr2", "auto", near), (V{"cubic", "reno"}));
  EXPECT_EQ(CongestionTries("bbr", "auto", kAutoCongestionRtt), V{});
  EXPECT_EQ(CongestionTries("bbr", "auto", far), V{});
  EXPECT_EQ(CongestionTries("bbr", "auto", absl::ZeroDuration()), V{});
  EXPECT_EQ(CongestionTries("cubic", "auto", near), V{});
  EXPECT_EQ(CongestionTries("dctcp", "auto", near), V{});
  EXPECT_EQ(CongestionTries("bbr", "system", near), V{});
  EXPECT_EQ(CongestionTries("cubic", "cubic", near), V{});
  EXPECT_EQ(CongestionTries("cubic", "bbr", far), V{"bbr"});
  EXPECT_EQ(CongestionTries("bbr", "reno", far), V{"reno"});
}

TEST(WireCongestionTest, NamesAndWhatTheKernelRefuses) {
  for (const char* good : {"auto", "system", "cubic", "reno", "bbr", "dctcp",
                           "h_tcp2"}) {
    EXPECT_TRUE(ValidCongestionName(good)) << good;
  }
  for (const char* bad : {"", "Cubic", "re no", "reno;", "bbr\n",
                          "sixteen_chars_xx"}) {
    EXPECT_FALSE(ValidCongestionName(bad)) << bad;
  }
  const std::string host = DefaultCongestion();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  // A name the kernel has no module for: the host's stays, and the note
  // says the kernel refused it.
  CongestionChoice c = ChooseCongestion(fd, "no_such_cc");
  EXPECT_EQ(c.host, host);
  EXPECT_EQ(c.in_use, host);
  EXPECT_TRUE(c.refused());
  EXPECT_NE(c.note.find("refused no_such_cc (setsockopt: "), std::string::npos)
      << c.note;
  EXPECT_NE(c.note.find("keep the host's " + host), std::string::npos)
      << c.note;
  // A change says what it replaced; asking for what is there changes
  // nothing and says nothing.
  const std::string other = host == "reno" ? "cubic" : "reno";
  c = ChooseCongestion(fd, other);
  if (c.in_use == other) {
    EXPECT_TRUE(c.changed());
    EXPECT_NE(c.note.find("in place of the host's " + host),
              std::string::npos)
        << c.note;
  } else {  // cubic where an unprivileged process may not choose it
    EXPECT_EQ(c.in_use, host);
    EXPECT_TRUE(c.refused()) << c.note;
  }
  const int fresh = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fresh, 0);
  for (const std::string& keep : {host, std::string("system")}) {
    c = ChooseCongestion(fresh, keep);
    EXPECT_EQ(c.in_use, host) << keep;
    EXPECT_FALSE(c.changed() || c.refused()) << keep;
    EXPECT_EQ(c.note, "") << keep;
  }
  close(fresh);
  close(fd);
}

// Small frames on an idle link are written by the sending thread itself;
// when the socket fills (a receiver that stalls), the rest of a record the
// sender began goes to its writer thread, ahead of every later frame. In
// order and intact either way, sealed or not.
TEST_P(WireLinkTest, FramesTheCallerWritesKeepOrderWhenTheSocketFills) {
  const std::string token = ExpectLink();
  ASSERT_TRUE(Connect(token, key_).ok());
  std::atomic<int> released{0};
  std::vector<std::vector<uint8_t>> sent;
  constexpr size_t kFrames = 1200;
  sent.push_back(Bytes(16000, 1));
  sender_->SendOne(DataFrame(1, sent.back(), &released));
  absl::SleepFor(absl::Milliseconds(50));  // idle again: the next ones inline
  {
    // The reader stalls meanwhile: its frame callback waits for mu_.
    absl::MutexLock lock(&mu_);
    for (size_t i = 1; i < kFrames; ++i) {
      sent.push_back(Bytes(16000 - (i % 7) * 4, static_cast<uint8_t>(i)));
      sender_->SendOne(DataFrame(i + 1, sent.back(), &released));
    }
  }
  const bool all = WaitFrames(kFrames);
  const WireSender::InlineCounts counts = sender_->inline_counts();
  absl::MutexLock lock(&mu_);
  ExpectFramesAre(sent, all);
  EXPECT_EQ(released.load(), static_cast<int>(kFrames));
  // Some frames were written by this thread, and the stalled reader left at
  // least one of them half written (19 MB against loopback's buffers).
  EXPECT_GE(counts.frames, 2u) << counts.partial;
  EXPECT_GE(counts.partial, 1u) << counts.frames;
  std::printf("inline writes: %llu frames, %llu partial\n",
              static_cast<unsigned long long>(counts.frames),
              static_cast<unsigned long long>(counts.partial));
}

// Large frames too are written by the sending thread when the link is
// idle (a plain link's up to 513 KiB, a sealed link's up to 65 KiB): when
// the socket fills, a plain record's rest is written by the writer thread
// from the frame itself, not from a copy, and the frame is released only
// once it is all written. In order and intact either way.
TEST_P(WireLinkTest, LargeFramesTheCallerBeginsFinishFromTheFrame) {
  const std::string token = ExpectLink();
  ASSERT_TRUE(Connect(token, key_).ok());
  // The writer reports ready before it waits for work: the link is idle
  // (the first frame the caller's) once it does.
  absl::SleepFor(absl::Milliseconds(50));
  std::atomic<int> released{0};
  // The frames borrow sent[i] (EncodeFrame does not copy it); expected[i]
  // keeps what was sent.
  std::vector<std::vector<uint8_t>> sent, expected;
  constexpr size_t kFrames = 48;
  sent.reserve(kFrames);
  constexpr size_t kBytes = 500 * 1024;  // 24 MB against loopback's buffers
  {
    // The reader stalls meanwhile: its frame callback waits for mu_.
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < kFrames; ++i) {
      sent.push_back(Bytes(kBytes - i * 4, static_cast<uint8_t>(i + 1)));
      expected.push_back(sent.back());
      WireSender::Frame f = DataFrame(i + 1, sent.back(), &released);
      // Its release overwrites the frame's bytes: a record still written
      // from them afterwards would arrive altered.
      f.on_released = [parts = f.parts, keep = f.keepalive, &released] {
        for (const auto& p : parts) {
          std::memset(const_cast<uint8_t*>(p.data()), 0xEE, p.size());
        }
        released.fetch_add(1);
      };
      sender_->SendOne(std::move(f));
    }
  }
  const bool all = WaitFrames(kFrames);
  const WireSender::InlineCounts counts = sender_->inline_counts();
  // The writer releases a frame just after its last sendmsg.
  EXPECT_TRUE(WaitReleased(released, kFrames));
  absl::MutexLock lock(&mu_);
  ExpectFramesAre(expected, all);
  if (GetParam()) {
    // Sealed: large frames always go to the writer, which seals them.
    EXPECT_EQ(counts.frames, 0u);
  } else {
    // The first frame found the link idle; the stalled reader left it (or
    // a later one) half written, its rest taken from the frame.
    EXPECT_GE(counts.frames, 1u);
    EXPECT_GE(counts.partial, 1u) << counts.frames;
    EXPECT_EQ(counts.from_frame, counts.partial) << counts.frames;
  }
  std::printf("inline writes: %llu frames, %llu partial, %llu from the frame\n",
              static_cast<unsigned long long>(counts.frames),
              static_cast<unsigned long long>(counts.partial),
              static_cast<unsigned long long>(counts.from_frame));
}

// Closing a link while a frame the caller began waits for room (the
// reader stalled): every frame is released, the begun one too, once.
TEST_P(WireLinkTest, ClosingReleasesAFrameTheCallerBegan) {
  const std::string token = ExpectLink();
  ASSERT_TRUE(Connect(token, key_).ok());
  absl::SleepFor(absl::Milliseconds(50));  // idle: the first the caller's
  std::atomic<int> released{0};
  std::vector<std::vector<uint8_t>> sent;
  constexpr int kFrames = 100;
  sent.reserve(kFrames);
  {
    // The reader stalls meanwhile: its frame callback waits for mu_.
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < kFrames; ++i) {
      sent.push_back(Bytes(400 << 10, static_cast<uint8_t>(i + 1)));
      sender_->SendOne(DataFrame(i + 1, sent.back(), &released));
    }
    absl::SleepFor(absl::Milliseconds(100));  // the socket is full by now
    EXPECT_LT(released.load(), kFrames) << "nothing waited behind the socket";
    sender_->Close();
    EXPECT_EQ(released.load(), kFrames);
  }
  const WireSender::InlineCounts counts = sender_->inline_counts();
  if (!GetParam()) EXPECT_GE(counts.from_frame, 1u) << counts.frames;
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(released.load(), kFrames) << "a frame was released twice";
}

// An operation that fails while its frames wait behind a full socket
// (a slow or stalled peer): Withdraw drops those not begun and copies the
// one being written, so every buffer is free at once, without the reader's
// help and without cutting the link; the ABORT behind them comes next, and
// frames of other operations stay.
TEST_P(WireLinkTest, AFailedOperationsFramesLeaveAtOnceAndItsAbortIsNext) {
  ExpectWithdrawal(size_t{1} << 20, 40);
}

// The same with frames the sending thread begins itself (a plain link's
// up to 513 KiB): the first finds the link idle, and the rest the socket
// did not take is written from the frame until it is withdrawn.
TEST_P(WireLinkTest, AFailedOperationsFramesLeaveAtOnceWhenTheCallerBeganOne) {
  ExpectWithdrawal(size_t{400} << 10, 100);
}

void WireLinkTest::ExpectWithdrawal(const size_t kBytes, const int kFrames) {
  const std::string token = ExpectLink();
  ASSERT_TRUE(Connect(token, key_).ok());
  absl::SleepFor(absl::Milliseconds(50));  // idle: the first the caller's
  std::vector<std::vector<uint8_t>> buffers, original;
  for (int i = 0; i < kFrames; ++i) {
    buffers.push_back(Bytes(kBytes, static_cast<uint8_t>(i + 1)));
  }
  original = buffers;
  std::atomic<int> released{0};
  auto borrowed = [&](const FrameMeta& m, absl::Span<const uint8_t> payload) {
    OutFrame f = EncodeOutFrame(m, payload);
    f.on_released = [&released] { released.fetch_add(1); };
    return f;
  };
  FrameMeta abort = testing::DataChunkMeta(3, 7, Phase::kReduceScatter, 0, 0);
  abort.kind = FrameKind::kAbort;
  abort.abort_code = absl::StatusCode::kDeadlineExceeded;
  abort.message = "deadline";
  abort.origin_rank = abort.sender_rank = 0;
  const std::vector<uint8_t> next = Bytes(4096, 9);
  {
    // The reader stalls meanwhile: its frame callback waits for mu_.
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < kFrames; ++i) {
      sender_->SendOne(borrowed(
          testing::DataChunkMeta(3, 7, Phase::kReduceScatter, 0, kBytes / 4),
          buffers[static_cast<size_t>(i)]));
    }
    sender_->SendOne(EncodeOutFrame(abort, {}));
    sender_->SendOne(EncodeOutFrame(
        testing::DataChunkMeta(3, 8, Phase::kReduceScatter, 0, next.size() / 4),
        next));
    absl::SleepFor(absl::Milliseconds(200));  // the socket is full by now
    EXPECT_LT(released.load(), kFrames) << "nothing waited behind the socket";
    sender_->Withdraw(OpId{7});
    // Every frame of operation 7 is let go within the writer's poll, while
    // the reader still reads nothing.
    for (int i = 0; i < 200 && released.load() < kFrames; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(released.load(), kFrames);
    for (auto& b : buffers) std::fill(b.begin(), b.end(), uint8_t{0xEE});
  }
  // What arrives: whole frames of operation 7 as they were sent (the one
  // being written finished from its copy, not from the reused buffer), then
  // the ABORT (op 7, no payload), then operation 8's frame; the rest of
  // operation 7 never.
  size_t n = 0;
  for (int i = 0; i < 100 && n == 0; ++i) {
    {
      absl::MutexLock lock(&mu_);
      for (size_t k = 0; k < frames_.size(); ++k) {
        if (frames_[k].first == 8) n = k + 1;
      }
      if (!errors_.empty()) break;
    }
    if (n == 0) absl::SleepFor(absl::Milliseconds(100));
  }
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(errors_.empty()) << errors_.front().ToString();
  ASSERT_GE(n, 2u) << frames_.size() << " frames and none of op 8";
  ASSERT_EQ(frames_.size(), n);
  const size_t data = n - 2;
  EXPECT_LT(data, static_cast<size_t>(kFrames)) << "nothing was dropped";
  for (size_t k = 0; k < data; ++k) {
    ASSERT_EQ(frames_[k].first, 7u) << "frame " << k;
    ASSERT_EQ(frames_[k].second,
              std::string(original[k].begin(), original[k].end()))
        << "frame " << k << " of " << data;
  }
  EXPECT_EQ(frames_[data].first, 7u);
  EXPECT_TRUE(frames_[data].second.empty()) << "the ABORT";
  EXPECT_EQ(frames_[n - 1].second, std::string(next.begin(), next.end()));
  std::printf("%zu of %d frames went before the withdrawal\n", data, kFrames);
  if (!GetParam() && kBytes < (size_t{512} << 10)) {
    // A frame the caller began was left half written, its rest then
    // written from the frame (and, withdrawn, from a copy).
    EXPECT_GE(sender_->inline_counts().from_frame, 1u);
  }
}

TEST_P(WireLinkTest, ATokenServesOneConnectionAndAForgottenOneNone) {
  const std::string token = ExpectLink();
  ASSERT_TRUE(Connect(token, key_).ok());
  sender_->Close();
  // The same token a second time: nobody expects it any more.
  absl::Status again = Connect(token, key_);
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable) << again;
  EXPECT_THAT(again.message(), HasSubstr("did not take the link token"));
  sender_->Close();
  const std::string forgotten = ExpectLink();
  listener_->Forget(forgotten);
  absl::Status s = Connect(forgotten, key_);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  sender_->Close();
  // A made-up token.
  s = Connect(std::string(32, '0'), key_);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST_P(WireLinkTest, NoListenerMeansAClearConnectError) {
  const int port = listener_->port();
  listener_->Stop();
  const absl::Status s = Connect(std::string(32, 'a'), key_, port);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST_P(WireLinkTest, AReceiverThatGoesAwayFailsTheSender) {
  const std::string token = ExpectLink();
  ASSERT_TRUE(Connect(token, key_).ok());
  {
    // The listener acks before it hands the connection over: wait for it.
    absl::MutexLock lock(&mu_);
    auto handed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return receiver_ != nullptr;
    };
    mu_.AwaitWithTimeout(absl::Condition(&handed), absl::Seconds(10));
    ASSERT_NE(receiver_, nullptr) << "no receiver 10 s after the ack";
  }
  {
    std::unique_ptr<WireReceiver> gone;
    {
      absl::MutexLock lock(&mu_);
      gone = std::move(receiver_);
    }
    gone.reset();  // stops and closes its end
  }
  std::atomic<int> released{0};
  const std::vector<uint8_t> data = Bytes(size_t{1} << 20, 3);
  // The kernel buffers a few frames; the rest must fail, bounded.
  for (int i = 0; i < 64; ++i) {
    sender_->SendOne(DataFrame(static_cast<uint64_t>(i + 1), data, &released));
    absl::SleepFor(absl::Milliseconds(5));
    absl::MutexLock lock(&mu_);
    if (failed_.has_value()) break;
  }
  absl::MutexLock lock(&mu_);
  auto failed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return failed_.has_value();
  };
  ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&failed), absl::Seconds(10)));
  EXPECT_EQ(failed_->code(), absl::StatusCode::kUnavailable) << *failed_;
}

INSTANTIATE_TEST_SUITE_P(PlainAndSealed, WireLinkTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Sealed" : "Plain";
                         });

// The operation's thread reads the link's small frames itself while it
// waits in Inbox::Next (the receiver's tap): the reader thread hands over
// only what the tap leaves (records over kTapRecordBytes, bytes still
// coming). The frames come in order and intact either way.
class WireTapTest : public WireLinkTest {
 protected:
  static constexpr int kFrom = 1;
  void TearDown() override {
    WireLinkTest::TearDown();
    inbox_->RemoveTap(tap_.get());
  }
  std::string ExpectTapped() {
    token_ = listener_->Expect([this](int fd) {
      absl::MutexLock lock(&mu_);
      receiver_ = std::make_unique<WireReceiver>(
          fd, key_,
          [this](absl::StatusOr<InFrame> f) {
            if (!f.ok()) return f.status();
            delivered_.fetch_add(1);
            {
              absl::MutexLock lock(&seq_mu_);
              delivered_seqs_.push_back(f->meta.op_seq);
            }
            return inbox_->Deliver(kFrom, *std::move(f));
          },
          [this](const absl::Status& s) {
            {
              absl::MutexLock lock(&mu_);
              errors_.push_back(s);
            }
            inbox_->LinkFailed(kFrom, s);
          },
          nullptr, -1, counters_);
      tap_ = receiver_->tap();
      if (tap_ != nullptr) inbox_->AddTap(tap_);
    });
    return token_;
  }
  // Connect returns once this end is connected; the listener's thread
  // makes the receiver (and its tap) when it accepts, maybe after that.
  void WaitAccepted() {
    absl::MutexLock lock(&mu_);
    auto accepted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return receiver_ != nullptr;
    };
    ASSERT_TRUE(
        mu_.AwaitWithTimeout(absl::Condition(&accepted), absl::Seconds(10)))
        << "the listener never accepted";
    ASSERT_NE(tap_, nullptr) << "no eventfd: the link has no tap";
    ASSERT_TRUE(tap_->polled());
  }
  Inbox::Event Wait(uint64_t seq, absl::Duration timeout = absl::Seconds(20)) {
    const int watch[] = {kFrom};
    return inbox_->Next(kFrom, seq, watch, absl::Now() + timeout);
  }

  // Sends a frame of each size, each once the operation waits for it (so
  // that the reader stands aside), and takes each through Wait, checking
  // it; *seq is the last message number taken.
  void SendEachWhenAwaited(const std::vector<size_t>& sizes, uint64_t* seq,
                           std::atomic<int>* released) {
    std::vector<std::vector<uint8_t>> sent;
    for (size_t n : sizes) {
      sent.push_back(Bytes(n, static_cast<uint8_t>(*seq + sent.size())));
    }
    std::atomic<size_t> taken{0};
    std::thread writer([&, first = *seq] {
      for (size_t i = 0; i < sent.size(); ++i) {
        const absl::Time until = absl::Now() + absl::Seconds(20);
        while (taken.load() < i && absl::Now() < until) {
          absl::SleepFor(absl::Microseconds(200));
        }
        absl::SleepFor(absl::Milliseconds(1));  // the wait is in poll()
        sender_->SendOne(DataFrame(first + i + 1, sent[i], released));
      }
    });
    for (size_t i = 0; i < sent.size(); ++i) {
      Inbox::Event ev = Wait(++*seq);
      EXPECT_EQ(ev.type, Inbox::Event::kFrame)
          << "frame " << i << " of " << sizes[i] << " bytes: " << ev.status;
      if (ev.type != Inbox::Event::kFrame) break;
      EXPECT_EQ(ev.frame.meta.op_seq, *seq);
      EXPECT_TRUE(PayloadOf(ev.frame) ==
                  std::string(sent[i].begin(), sent[i].end()))
          << "frame " << i << " of " << sizes[i] << " bytes altered";
      taken.fetch_add(1);
    }
    taken.store(sent.size());
    writer.join();
  }

  std::shared_ptr<LinkCounters> counters_ = std::make_shared<LinkCounters>();
  std::shared_ptr<Inbox> inbox_ = std::make_shared<Inbox>(4, counters_);
  std::shared_ptr<InboxTap> tap_;
  std::atomic<int> delivered_{0};
  // The operations of the frames delivered, in the order they were.
  absl::Mutex seq_mu_;
  std::vector<uint64_t> delivered_seqs_ ABSL_GUARDED_BY(seq_mu_);
};

TEST_P(WireTapTest, SmallFramesComeThroughTheTapAndLargeOnesFromTheReader) {
  ASSERT_TRUE(Connect(ExpectTapped(), key_).ok());
  ASSERT_NO_FATAL_FAILURE(WaitAccepted());
  // Three rounds: small frames (the tap's), then large ones with small ones
  // between (over kTapRecordBytes: the reader's, and the link stays the
  // reader's for a while after each), then, once that is over, small ones
  // again. Each frame is sent once the operation waits for it, so that
  // the reader stands aside.
  const std::vector<size_t> rounds[] = {
      {4, 4096, 16384, 0, 4, 4096, 16384, 0, 4, 4096, 16384, 0},
      {(size_t{1} << 20) + 4, 4, 65540, 300 << 10, 4096, (size_t{1} << 20) + 4},
      {4, 4096, 16384, 0, 4, 4096, 16384, 0, 4, 4096, 16384, 0}};
  std::atomic<int> released{0};
  uint64_t seq = 0;
  size_t small = 0;
  uint64_t tapped[3];
  for (int round = 0; round < 3; ++round) {
    if (round == 2) absl::SleepFor(absl::Milliseconds(300));
    for (size_t n : rounds[round]) {
      if (n <= 16384) ++small;
    }
    ASSERT_NO_FATAL_FAILURE(SendEachWhenAwaited(rounds[round], &seq, &released));
    tapped[round] = counters_->wire.tapped.load();
  }
  EXPECT_GT(tapped[0], 0u) << "no small frame came through the tap";
  EXPECT_GT(tapped[2], tapped[1])
      << "the link stayed its reader's after the large frames";
  // Round 1 has two frames within the tap's bound, both behind a large one.
  EXPECT_LE(tapped[1] - tapped[0], 2u)
      << "a frame over the tap's bound was read on the waiting thread";
  EXPECT_LE(tapped[2], small);
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(errors_.empty());
}

// On a plain link the tap also reads records of up to a 64 KiB payload
// (kTapPlainRecordBytes) once they are wholly there, and they do not make
// the link its reader's; a sealed link leaves them to its reader.
TEST_P(WireTapTest, PlainRecordsOfUpTo64KiBComeThroughTheTap) {
  ASSERT_TRUE(Connect(ExpectTapped(), key_).ok());
  ASSERT_NO_FATAL_FAILURE(WaitAccepted());
  std::atomic<int> released{0};
  uint64_t seq = 0;
  // Records under loopback's 64 KiB segment: each arrives at once (a
  // 64 KiB payload's record spans two segments, and a tap that looks
  // between them hands it to the reader).
  const std::vector<size_t> sizes = {60000, 20000, 61000, 40000, 4096, 60000};
  ASSERT_NO_FATAL_FAILURE(SendEachWhenAwaited(sizes, &seq, &released));
  const uint64_t tapped = counters_->wire.tapped.load();
  if (GetParam()) {
    // Sealed: every one of them over kTapRecordBytes is the reader's, and
    // the link then stays the reader's (the 4 KiB one too).
    EXPECT_EQ(tapped, 0u);
  } else {
    // All six, unless a loaded machine keeps the waiting thread off the
    // CPU as a frame comes (its reader then takes it); with the 17 KiB
    // bound only the 4 KiB one could be.
    EXPECT_GE(tapped, 3u) << "records of up to 64 KiB were left to the "
                             "reader";
    EXPECT_LE(tapped, sizes.size());
  }
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(errors_.empty());
}

INSTANTIATE_TEST_SUITE_P(PlainAndSealed, WireTapTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Sealed" : "Plain";
                         });

// The same on a raw plain connection, which the test cuts or stops.
class WireTapRawTest : public WireTapTest {
 protected:
  void DialTapped() {
    ExpectTapped();
    DialWithToken(listener_->port(), token_, &fd_);
    ASSERT_NO_FATAL_FAILURE(WaitAccepted());
  }
  // One plain record: a float32 data frame of operation `seq` with
  // `elements` elements.
  static std::vector<uint8_t> Record(uint64_t seq, size_t elements) {
    const FrameMeta m =
        testing::DataChunkMeta(3, seq, Phase::kReduceScatter, 0, elements);
    grpc::ByteBuffer buffer = EncodeFrame(m, Bytes(elements * 4, 9));
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(buffer.Dump(&slices).ok());
    std::vector<uint8_t> rec(4);
    for (const grpc::Slice& sl : slices) {
      rec.insert(rec.end(), sl.begin(), sl.begin() + sl.size());
    }
    const uint32_t n = rec.size() - 4;
    for (int i = 0; i < 4; ++i) rec[i] = static_cast<uint8_t>(n >> (8 * i));
    return rec;
  }
  void WriteFrame(uint64_t seq) {
    const std::vector<uint8_t> rec = Record(seq, 16);
    ASSERT_EQ(write(fd_, rec.data(), rec.size()),
              static_cast<ssize_t>(rec.size()));
  }
  // Operation 1's frame, sent once this thread waits for it, taken.
  void TakeFirstFrame() {
    std::thread first([this] {
      absl::SleepFor(absl::Milliseconds(50));
      WriteFrame(1);
    });
    const Inbox::Event ev = Wait(1);
    first.join();
    ASSERT_EQ(ev.type, Inbox::Event::kFrame) << ev.status;
  }
  // Waits for operation `seq` while `bytes` are written 50 ms later.
  Inbox::Event WaitWritingLater(uint64_t seq, std::vector<uint8_t> bytes) {
    std::thread late([this, &bytes] {
      absl::SleepFor(absl::Milliseconds(50));
      EXPECT_EQ(write(fd_, bytes.data(), bytes.size()),
                static_cast<ssize_t>(bytes.size()));
    });
    Inbox::Event ev = Wait(seq);
    late.join();
    return ev;
  }
  // Operations 1 to 7 were delivered in order, and the link reported no
  // error.
  void ExpectSevenInOrderAndNoError() {
    {
      absl::MutexLock lock(&seq_mu_);
      EXPECT_EQ(delivered_seqs_, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}));
    }
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(errors_.empty()) << errors_.front();
  }
  // Records of operations 2, 3, ... with counts[i] elements each, then
  // `tail` (part of the next record), in one write 20 ms after the
  // operation starts to wait for the first (its reader then stands
  // aside); each taken in order and checked. How many of them the tap
  // took.
  uint64_t WriteBatchAndTake(const std::vector<size_t>& counts,
                             const std::vector<uint8_t>& tail) {
    const uint64_t tapped0 = counters_->wire.tapped.load();
    std::vector<uint8_t> bytes;
    for (size_t i = 0; i < counts.size(); ++i) {
      const std::vector<uint8_t> rec = Record(i + 2, counts[i]);
      bytes.insert(bytes.end(), rec.begin(), rec.end());
    }
    bytes.insert(bytes.end(), tail.begin(), tail.end());
    std::atomic<bool> waiting{false};
    std::thread batch([&] {
      const absl::Time until = absl::Now() + absl::Seconds(10);
      while (!waiting.load() && absl::Now() < until) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      absl::SleepFor(absl::Milliseconds(20));
      EXPECT_EQ(write(fd_, bytes.data(), bytes.size()),
                static_cast<ssize_t>(bytes.size()));
    });
    for (size_t i = 0; i < counts.size(); ++i) {
      waiting.store(true);
      const Inbox::Event ev = Wait(i + 2);
      if (i == 0) batch.join();
      EXPECT_EQ(ev.type, Inbox::Event::kFrame) << i + 2 << " " << ev.status;
      if (ev.type != Inbox::Event::kFrame) break;
      EXPECT_EQ(ev.frame.meta.op_seq, i + 2);
      EXPECT_EQ(ev.frame.meta.count, counts[i]);
    }
    if (batch.joinable()) batch.join();
    return counters_->wire.tapped.load() - tapped0;
  }
};

// A connection cut while the operation holds the tap (its reader stands
// aside) fails the wait at once, naming why: the reader reports what the
// tap found.
TEST_P(WireTapRawTest, ACutWhileTheOperationWaitsFailsItAtOnce) {
  ASSERT_NO_FATAL_FAILURE(DialTapped());
  WriteFrame(1);
  ASSERT_EQ(Wait(1).type, Inbox::Event::kFrame);
  std::thread cutter([this] {
    absl::SleepFor(absl::Milliseconds(100));
    close(fd_);  // no close record: as a peer that died
    fd_ = -1;
  });
  const absl::Time start = absl::Now();
  Inbox::Event ev = Wait(2, absl::Seconds(15));
  const absl::Duration took = absl::Now() - start;
  cutter.join();
  EXPECT_EQ(ev.type, Inbox::Event::kLinkFailed) << ev.type << " " << ev.status;
  EXPECT_THAT(ev.status.message(), HasSubstr("close record"));
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_TRUE(tap_->over());
}

// The receiver stopped while an operation waits on its tap: the wait goes
// on to its deadline without the link, and nothing is delivered or
// reported after Stop (a frame written after it stays unread).
TEST_P(WireTapRawTest, StoppedWhileTheOperationWaits) {
  ASSERT_NO_FATAL_FAILURE(DialTapped());
  WriteFrame(1);
  ASSERT_EQ(Wait(1).type, Inbox::Event::kFrame);
  std::thread stopper([this] {
    absl::SleepFor(absl::Milliseconds(100));
    absl::MutexLock lock(&mu_);
    receiver_->Stop();
  });
  const absl::Time start = absl::Now();
  Inbox::Event ev = Wait(2, absl::Milliseconds(500));
  stopper.join();
  EXPECT_EQ(ev.type, Inbox::Event::kTimeout) << ev.type << " " << ev.status;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400));
  EXPECT_TRUE(tap_->over());
  const int delivered = delivered_.load();
  WriteFrame(2);
  ev = Wait(2, absl::Milliseconds(300));
  EXPECT_EQ(ev.type, Inbox::Event::kTimeout) << ev.type << " " << ev.status;
  EXPECT_EQ(delivered_.load(), delivered) << "a frame delivered after Stop";
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(errors_.empty()) << errors_.front();
}

// A record whose bytes stop coming part way (a stalled peer) is the
// reader's: the waiting operation sleeps meanwhile, costing no CPU, even
// after an earlier hand-over made the reader signal the end of its turn.
TEST_P(WireTapRawTest, AStalledRecordCostsTheWaitNoCpu) {
  ASSERT_NO_FATAL_FAILURE(DialTapped());
  auto thread_cpu = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return absl::DurationFromTimespec(ts);
  };
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    const std::vector<uint8_t> rec = Record(seq, 1024);
    const size_t half = rec.size() / 2;
    std::thread writer([&] {
      absl::SleepFor(absl::Milliseconds(20));
      ASSERT_EQ(write(fd_, rec.data(), half), static_cast<ssize_t>(half));
      absl::SleepFor(absl::Milliseconds(300));  // stalled inside the record
      ASSERT_EQ(write(fd_, rec.data() + half, rec.size() - half),
                static_cast<ssize_t>(rec.size() - half));
    });
    const absl::Duration cpu0 = thread_cpu();
    Inbox::Event ev = Wait(seq);
    const absl::Duration cpu = thread_cpu() - cpu0;
    writer.join();
    ASSERT_EQ(ev.type, Inbox::Event::kFrame) << ev.status;
    // Asleep for the 320 ms: a few wake-ups (the 50 ms cap) at most.
    EXPECT_LT(cpu, absl::Milliseconds(60)) << "record " << seq;
  }
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(errors_.empty()) << errors_.front();
}

// Several whole records that arrive in one write are delivered in order,
// and a record whose second half comes later is still delivered whole
// after them (the tap on a plain link peeks whole records, several at a
// look, and leaves a partial one to the reader).
TEST_P(WireTapRawTest, RecordsThatArriveTogetherAreTakenInOrder) {
  ASSERT_NO_FATAL_FAILURE(DialTapped());
  // A first frame while the operation waits; the batch comes while it
  // waits again: the reader stands aside, so all of it is the tap's.
  ASSERT_NO_FATAL_FAILURE(TakeFirstFrame());
  const std::vector<uint8_t> last = Record(7, 512);
  const size_t half = last.size() / 2;
  EXPECT_EQ(WriteBatchAndTake({32, 48, 64, 80, 96},
                              {last.begin(), last.begin() + half}),
            5u)
      << "the reader took some of the batch while the operation waited";
  const Inbox::Event ev =
      WaitWritingLater(7, {last.begin() + half, last.end()});
  ASSERT_EQ(ev.type, Inbox::Event::kFrame) << ev.status;
  EXPECT_EQ(ev.frame.meta.count, 512u);
  ExpectSevenInOrderAndNoError();
}

// The same with records of 17 to 65 KiB (a plain link's tap takes them
// once FIONREAD says they are all there): several at once are all the
// tap's, in order; one whose bytes are still coming is not waited for on
// the operation's thread, and arrives whole; a close record right behind
// the last ends the link quietly.
TEST_P(WireTapRawTest, RecordsOfUpTo64KiBArrivingTogetherOrInPiecesComeWhole) {
  ASSERT_NO_FATAL_FAILURE(DialTapped());
  ASSERT_NO_FATAL_FAILURE(TakeFirstFrame());
  // Elements per frame: 24 KiB, 16 floats, 64 KiB, 40 KiB; then half of a
  // 48 KiB one. One write of 155 KB arrives in pieces: a record cut
  // between two is handed to the reader; the first (24 KiB, within the
  // first piece) is the tap's. On a fresh connection the first piece can
  // be as short as 32 KiB (its receive window has not grown yet): with a
  // first record of 40 KiB the tap found it whole in only about half the
  // runs on a loaded machine (FIONREAD said 32,768 bytes), and rightly
  // handed it to the reader.
  const std::vector<uint8_t> sixth = Record(6, 12288);
  const size_t half = sixth.size() / 2;
  EXPECT_GE(WriteBatchAndTake({6144, 16, 16384, 10240},
                              {sixth.begin(), sixth.begin() + half}),
            1u)
      << "no record over 17 KiB came through the tap";
  // The sixth's rest 50 ms later, with the seventh and the close record.
  std::vector<uint8_t> rest(sixth.begin() + half, sixth.end());
  const std::vector<uint8_t> seventh = Record(7, 10240);
  rest.insert(rest.end(), seventh.begin(), seventh.end());
  rest.insert(rest.end(), {0, 0, 0, 0});
  const absl::Time start = absl::Now();
  Inbox::Event ev = WaitWritingLater(6, rest);
  ASSERT_EQ(ev.type, Inbox::Event::kFrame) << ev.status;
  EXPECT_EQ(ev.frame.meta.count, 12288u);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(40));
  ev = Wait(7);
  ASSERT_EQ(ev.type, Inbox::Event::kFrame) << ev.status;
  EXPECT_EQ(ev.frame.meta.count, 10240u);
  absl::SleepFor(absl::Milliseconds(100));  // the close record's end
  ExpectSevenInOrderAndNoError();
}

INSTANTIATE_TEST_SUITE_P(Plain, WireTapRawTest, ::testing::Values(false),
                         [](const ::testing::TestParamInfo<bool>&) {
                           return "Plain";
                         });

// A listener and one raw client connection to it (which writes what it
// likes), and the receiver the listener starts for it.
class HostileWireTest : public ::testing::Test, protected RawWireFixture {
 protected:
  void SetUp() override {
    listener_ = *WireListener::Start("127.0.0.1");
    key_ = *WireSeal::NewKey();
  }
  void TearDown() override { StopAll(); }
  void Attach(const std::string& key) {
    ExpectReceiver(key, Collect([this](const InFrame&) { ++frames_; }));
    DialWithToken(listener_->port(), token_, &fd_);
  }
  // Writes `bytes` to the link as they are, all at once.
  void WriteRaw(const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(write(fd_, bytes.data(), bytes.size()),
              static_cast<ssize_t>(bytes.size()));
  }
  // The first error (FirstError) is `code`, with `text` in its message
  // (when not empty).
  void ExpectFirstError(absl::StatusCode code, const std::string& text = "") {
    absl::Status s = FirstError();
    EXPECT_EQ(s.code(), code) << s;
    if (!text.empty()) EXPECT_THAT(s.message(), HasSubstr(text));
  }
  absl::Status FirstError(absl::Duration wait = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto some = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !errors_.empty();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&some), wait)) {
      return absl::OkStatus();
    }
    return errors_.front();
  }

  int frames_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(HostileWireTest, AnUnsealedRecordOnASealedLinkIsRefused) {
  Attach(key_);
  // A record whose "ciphertext" is anything and whose tags are zeros:
  // [n][h][h bytes][tag][n - h bytes][tag].
  const uint32_t n = 64, h = 20;
  std::vector<uint8_t> rec(8 + n + 2 * WireSeal::kTagBytes, 0);
  std::memcpy(rec.data(), &n, 4);  // little-endian host
  std::memcpy(rec.data() + 4, &h, 4);
  ASSERT_NO_FATAL_FAILURE(WriteRaw(rec));
  ExpectFirstError(absl::StatusCode::kDataLoss, "authentication");
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(frames_, 0);
}

TEST_F(HostileWireTest, ASealedRecordWithAnImpossibleHeadIsRefused) {
  Attach(key_);
  const uint32_t n = 64, h = 65;  // a head longer than the frame
  std::vector<uint8_t> rec(8, 0);
  std::memcpy(rec.data(), &n, 4);
  std::memcpy(rec.data() + 4, &h, 4);
  ASSERT_NO_FATAL_FAILURE(WriteRaw(rec));
  ExpectFirstError(absl::StatusCode::kDataLoss,
                   "frame head is 65 of 64 bytes");
}

TEST_F(HostileWireTest, AnOversizedRecordIsRefusedBeforeAnyAllocation) {
  Attach("");
  const uint32_t n = 0xFFFFFFF0u;
  ASSERT_EQ(write(fd_, &n, 4), 4);
  ExpectFirstError(absl::StatusCode::kDataLoss, "at most");
}

TEST_F(HostileWireTest, GarbageInAPlainRecordIsAFrameError) {
  Attach("");
  const uint32_t n = 10;
  std::vector<uint8_t> rec(4 + n, 0xAB);
  std::memcpy(rec.data(), &n, 4);
  ASSERT_NO_FATAL_FAILURE(WriteRaw(rec));
  ExpectFirstError(absl::StatusCode::kDataLoss);
}

TEST_F(HostileWireTest, ACutInsideARecordIsReported) {
  Attach("");
  const uint32_t n = 1000;
  std::vector<uint8_t> rec(4 + 100, 0);
  std::memcpy(rec.data(), &n, 4);
  ASSERT_NO_FATAL_FAILURE(WriteRaw(rec));
  close(fd_);
  fd_ = -1;
  ExpectFirstError(absl::StatusCode::kUnavailable, "inside a record");
}

// A FIN between records (injected by a third party, or the peer died) is
// not the link's normal end: that is a close record first. Before close
// records, the reader ended quietly and the operation waited for its
// deadline.
TEST_F(HostileWireTest, AnEndBetweenRecordsWithoutTheCloseRecordIsReported) {
  Attach("");
  shutdown(fd_, SHUT_WR);  // a FIN, no record
  ExpectFirstError(absl::StatusCode::kUnavailable,
                   "without the link's close record");
}

TEST_F(HostileWireTest, TheCloseRecordEndsTheLinkQuietly) {
  Attach("");
  const uint32_t zero = 0;
  ASSERT_EQ(write(fd_, &zero, 4), 4);
  shutdown(fd_, SHUT_WR);
  absl::Status s = FirstError(absl::Seconds(1));
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(HostileWireTest, AForgedCloseRecordOnASealedLinkIsRefused) {
  Attach(key_);
  std::vector<uint8_t> rec(4 + WireSeal::kTagBytes, 0);  // a made-up tag
  ASSERT_NO_FATAL_FAILURE(WriteRaw(rec));
  shutdown(fd_, SHUT_WR);
  ExpectFirstError(absl::StatusCode::kDataLoss, "authentication");
}

// The sender's own Close (idle) ends with the close record: no error.
TEST_F(HostileWireTest, ASendersCloseIsTheNormalEnd) {
  for (const bool sealed : {false, true}) {
    const std::string key = sealed ? key_ : "";
    ExpectReceiver(key,
                   [](absl::StatusOr<InFrame> f) { return f.status(); });
    absl::Notification ready;
    WireSender tx("127.0.0.1", listener_->port(), token_, key,
                  [&](const absl::Status&) { ready.Notify(); },
                  [](const absl::Status&) {});
    ASSERT_TRUE(ready.WaitForNotificationWithTimeout(absl::Seconds(10)));
    absl::SleepFor(absl::Milliseconds(50));  // the sender is idle
    tx.Close();
    EXPECT_TRUE(FirstError(absl::Seconds(1)).ok()) << (sealed ? "sealed" : "plain");
    std::unique_ptr<WireReceiver> r;
    {
      absl::MutexLock lock(&mu_);
      r = std::move(receiver_);
    }
  }
}

// Landings (core/landing.h) through a wire reader, plain and
// sealed, from a raw client that writes records itself and so can stop
// inside one.
class LandingWireTest : public ::testing::TestWithParam<bool>,
                        protected RawWireFixture {
 protected:
  static constexpr int kFrom = 2;
  void SetUp() override {
    listener_ = *WireListener::Start("127.0.0.1");
    if (GetParam()) {
      key_ = *WireSeal::NewKey();
      seal_ = std::make_unique<WireSeal>(key_);
    }
    ExpectReceiver(key_, Collect([this](InFrame f) {
                     frames_.push_back(std::move(f));
                   }),
                   board_, kFrom, counters_);
    DialWithToken(listener_->port(), token_, &fd_);
    if (HasFatalFailure()) return;
    // The listener acks, then hands the connection over.
    absl::MutexLock lock(&mu_);
    auto handed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return receiver_ != nullptr;
    };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&handed), absl::Seconds(10)));
  }
  void TearDown() override { StopAll(); }

  static FrameMeta Chunk(uint64_t op_seq, int step, uint64_t count) {
    FrameMeta m =
        testing::DataChunkMeta(3, op_seq, Phase::kAllGather, step, count);
    m.segment = 1;
    m.offset = 64;
    m.sender_rank = kFrom;
    return m;
  }
  // The record that carries `meta` and `payload`: [u32 n][frame], or
  // sealed [u32 n][u32 h][head][tag][payload][tag].
  std::vector<uint8_t> Record(const FrameMeta& meta,
                              const std::vector<uint8_t>& payload) {
    const std::string head = EncodeFrameHead(meta);
    const uint32_t n = static_cast<uint32_t>(head.size() + payload.size());
    const absl::Span<const uint8_t> head_bytes(
        reinterpret_cast<const uint8_t*>(head.data()), head.size());
    if (!seal_) {
      std::vector<uint8_t> rec(4 + n);
      std::memcpy(rec.data(), &n, 4);  // little-endian host
      std::memcpy(rec.data() + 4, head.data(), head.size());
      std::memcpy(rec.data() + 4 + head.size(), payload.data(), payload.size());
      return rec;
    }
    const uint32_t h = static_cast<uint32_t>(head.size());
    std::vector<uint8_t> rec(8 + n + 2 * WireSeal::kTagBytes);
    std::memcpy(rec.data(), &n, 4);
    std::memcpy(rec.data() + 4, &h, 4);
    const absl::Span<const uint8_t> aad(rec.data(), 8);
    const absl::Span<const uint8_t> first[1] = {head_bytes};
    const absl::Span<const uint8_t> second[1] = {absl::MakeConstSpan(payload)};
    EXPECT_TRUE(seal_->Seal(first, aad, rec.data() + 8).ok());
    EXPECT_TRUE(seal_->Seal(second, aad,
                            rec.data() + 8 + h + WireSeal::kTagBytes).ok());
    return rec;
  }
  void Write(const std::vector<uint8_t>& bytes, size_t from = 0,
             size_t to = SIZE_MAX) {
    to = std::min(to, bytes.size());
    size_t at = from;
    while (at < to) {
      const ssize_t w = write(fd_, bytes.data() + at, to - at);
      ASSERT_GT(w, 0);
      at += static_cast<size_t>(w);
    }
  }
  bool WaitFrames(size_t n) { return WaitCollected(frames_, n); }
  const std::shared_ptr<LandingBoard> board_ = std::make_shared<LandingBoard>();
  // The receiver's (a worker's, core/link_counters.h).
  const std::shared_ptr<LinkCounters> counters_ = std::make_shared<LinkCounters>();
  std::unique_ptr<WireSeal> seal_;  // the raw client's
  std::vector<InFrame> frames_ ABSL_GUARDED_BY(mu_);
};

TEST_P(LandingWireTest, AnOfferedPayloadLandsInPlaceAndOthersTakeTheUsualPath) {
  const size_t count = (size_t{1} << 18) + 3;  // 1 MiB + 12 bytes
  std::vector<uint8_t> dst(count * 4 + 8, 0xEE);
  const std::vector<uint8_t> data = Bytes(count * 4, 5);
  const std::vector<uint8_t> other = Bytes(4000, 9);
  std::shared_ptr<Landing> offer =
      board_->Offer(kFrom, Chunk(7, 0, count), dst.data() + 4, count * 4);
  ASSERT_NE(offer, nullptr);
  // Offered, but for a payload of another size: not claimed.
  std::shared_ptr<Landing> wrong_size =
      board_->Offer(kFrom, Chunk(7, 1, 1000), dst.data(), 4000);
  ASSERT_NE(wrong_size, nullptr);
  Write(Record(Chunk(7, 2, 1000), other));   // nobody offered it
  Write(Record(Chunk(7, 0, count), data));   // lands
  Write(Record(Chunk(7, 1, 999), Bytes(3996, 1)));  // count differs
  ASSERT_TRUE(WaitFrames(3));
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(errors_.empty()) << errors_.front();
  EXPECT_FALSE(frames_[0].landed);
  EXPECT_EQ(PayloadOf(frames_[0]), std::string(other.begin(), other.end()));
  ASSERT_TRUE(frames_[1].landed);
  EXPECT_EQ(frames_[1].meta.step, 0);
  ASSERT_EQ(frames_[1].pieces.size(), 1u);
  EXPECT_EQ(frames_[1].pieces[0].data(), dst.data() + 4);
  EXPECT_EQ(std::vector<uint8_t>(dst.begin() + 4, dst.end() - 4), data);
  EXPECT_EQ(dst[3], 0xEE);  // nothing outside the landing
  EXPECT_EQ(dst[dst.size() - 4], 0xEE);
  EXPECT_FALSE(frames_[2].landed);
  EXPECT_EQ(frames_[2].meta.count, 999u);
  EXPECT_EQ(counters_->wire.landed.load(), 1u);
  EXPECT_EQ(board_->offered(), 1u);  // the one of the wrong size
  const std::shared_ptr<Landing> mine[] = {offer, wrong_size};
  board_->Withdraw(mine);
}

TEST_P(LandingWireTest, ALandingRevokedInsideItsRecordGetsNoMoreBytes) {
  const size_t count = size_t{1} << 18;  // 1 MiB
  std::vector<uint8_t> dst(count * 4, 0xEE);
  const std::vector<uint8_t> data = Bytes(count * 4, 3);
  std::shared_ptr<Landing> offer =
      board_->Offer(kFrom, Chunk(8, 0, count), dst.data(), count * 4);
  ASSERT_NE(offer, nullptr);
  const std::vector<uint8_t> rec = Record(Chunk(8, 0, count), data);
  const size_t cut = rec.size() / 4;
  Write(rec, 0, cut);  // the head and a quarter of the payload, then a stall
  {
    // The reader has read the frame's head and claimed the landing.
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (board_->offered() > 0 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_EQ(board_->offered(), 0u) << "the reader never claimed the landing";
  }
  // The operation ends: from here on the reader writes nothing there.
  const std::shared_ptr<Landing> mine[] = {offer};
  board_->Withdraw(mine);
  const std::vector<uint8_t> before = dst;
  Write(rec, cut);
  const std::vector<uint8_t> next = Bytes(4096, 1);
  Write(Record(Chunk(9, 0, 1024), next));
  ASSERT_TRUE(WaitFrames(1));
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(errors_.empty()) << errors_.front();
  // The revoked frame was dropped; the next one came whole (sealed: the
  // connection's cipher stayed in step through the dropped bytes).
  ASSERT_EQ(frames_.size(), 1u);
  EXPECT_EQ(frames_[0].meta.op_seq, 9u);
  EXPECT_FALSE(frames_[0].landed);
  EXPECT_EQ(PayloadOf(frames_[0]), std::string(next.begin(), next.end()));
  EXPECT_EQ(dst, before);
  EXPECT_EQ(dst.back(), 0xEE);  // the record's end never reached it
}

TEST_P(LandingWireTest, AnAlteredLandedRecordEndsTheLinkAndIsNotDelivered) {
  const size_t count = 5000;
  std::vector<uint8_t> dst(count * 4, 0);
  std::shared_ptr<Landing> offer =
      board_->Offer(kFrom, Chunk(5, 0, count), dst.data(), count * 4);
  ASSERT_NE(offer, nullptr);
  std::vector<uint8_t> rec = Record(Chunk(5, 0, count), Bytes(count * 4, 2));
  rec[rec.size() - 100] ^= 1;  // in the payload
  Write(rec);
  absl::MutexLock lock(&mu_);
  auto some = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !errors_.empty() || !frames_.empty();
  };
  ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&some), absl::Seconds(10)));
  if (GetParam()) {
    // Sealed: the tag fails, the link ends, nothing is delivered, and no
    // byte of it (ciphertext or unverified plaintext) reached the buffer.
    ASSERT_EQ(errors_.size(), 1u);
    EXPECT_EQ(errors_[0].code(), absl::StatusCode::kDataLoss) << errors_[0];
    EXPECT_THAT(errors_[0].message(), HasSubstr("authentication"));
    EXPECT_TRUE(frames_.empty());
    EXPECT_EQ(dst, std::vector<uint8_t>(count * 4, 0))
        << "bytes that failed authentication reached the operation's buffer";
  } else {
    // Plain: nothing can tell; the bytes arrive as sent.
    ASSERT_EQ(frames_.size(), 1u);
    EXPECT_TRUE(frames_[0].landed);
  }
  const std::shared_ptr<Landing> mine[] = {offer};
  board_->Withdraw(mine);
}

INSTANTIATE_TEST_SUITE_P(PlainAndSealed, LandingWireTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Sealed" : "Plain";
                         });

// A port that accepts but never acks (not a halka listener): the sender
// gives up within the handshake time and says why.
TEST(WireSenderTest, APeerThatNeverAcksTimesOutNamingWhy) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ReadyProbe probe;
  WireSender sender("127.0.0.1", ntohs(a.sin_port), std::string(32, 'a'), "",
                    probe.Callback(), [](const absl::Status&) {});
  const absl::Status ready = probe.Await();
  EXPECT_EQ(ready.code(), absl::StatusCode::kUnavailable) << ready;
  EXPECT_THAT(ready.message(), HasSubstr("timed out after 2 s")) << ready;
  sender.Close();
  close(fd);
}

TEST(WireListenerTest, SilentConnectionsAreDroppedAndDoNotBlockOthers) {
  auto listener = *WireListener::Start("127.0.0.1");
  // Ten connections that never speak.
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) {
    const int fd = Dial(listener->port());
    ASSERT_GE(fd, 0) << std::strerror(errno);
    silent.push_back(fd);
  }
  // A real link still connects at once.
  std::atomic<bool> got{false};
  const std::string token = listener->Expect([&](int fd) {
    got = true;
    close(fd);
  });
  ReadyProbe probe;
  WireSender sender("127.0.0.1", listener->port(), token, "",
                    probe.Callback(), [](const absl::Status&) {});
  const absl::Status ready = probe.Await();
  EXPECT_TRUE(ready.ok()) << ready;
  // The listener acks, then hands the connection over: wait for that.
  for (int i = 0; i < 1000 && !got.load(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(got.load()) << "the connection was not handed over in 10 s";
  // The silent ones are closed by the listener within its handshake time.
  for (int fd : silent) {
    char c;
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    EXPECT_EQ(read(fd, &c, 1), 0) << "a silent connection was kept";
    close(fd);
  }
  sender.Close();
  listener->Stop();
}

}  // namespace
}  // namespace halka
