// A worker maps only shared memory its caller proved it created
// (common/held_shm.h, worker/shm_cache.h), and an object that shrinks
// under a mapping fails the operation cleanly instead of killing the
// worker with SIGBUS (common/shm_guard.h).
//
// The attack: a caller of job A (it holds A's token) names an object of
// another client or job on the same host in Worker.Run. Before owner pages
// the worker mapped any "/halka-*" name read-write: the call returned OK
// and the victim's floats were summed into and overwritten.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/held_shm.h"
#include "common/shm_guard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "halka/v1/worker.grpc.pb.h"
#include "core/shm_ring.h"
#include "worker/shm_cache.h"
#include "worker/shm_reaper.h"

namespace halka {
namespace {

std::vector<float> Floats(const void* p, size_t n) {
  std::vector<float> v(n);
  std::memcpy(v.data(), p, n * sizeof(float));
  return v;
}

class ShmOwnershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalCluster::Options o;
    o.workers = 2;
    auto c = LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    stub_ = v1::Worker::NewStub(MakeChannel(cluster_->worker_address(0)));
  }
  // Worker.Run on rank 0 naming `name` as an all-reduce of `count` floats.
  grpc::Status RunNaming(const std::string& name, uint64_t size,
                         const std::string& capability, size_t count) {
    v1::RunRequest req;
    v1::OpSpec* spec = req.mutable_spec();
    spec->set_kind(v1::ALL_REDUCE);
    spec->set_dtype(v1::FLOAT32);
    spec->set_op(v1::SUM);
    spec->set_count(count);
    spec->set_timeout_ms(3000);
    req.set_shm_name(name);
    req.set_shm_offset(0);
    req.set_shm_size(size);
    req.set_shm_capability(capability);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::RunReply reply;
    return stub_->Run(&ctx, req, &reply);
  }
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

TEST_F(ShmOwnershipTest, AnotherClientsObjectIsRefusedUntouchedAndUndescribed) {
  constexpr size_t kCount = 1024;
  // The victim: an object another client made for its own worker.
  const std::string victim_name = NewHeldShmName();
  auto victim = CreateOwnedShm(victim_name, kCount * sizeof(float));
  ASSERT_TRUE(victim.ok()) << victim.status();
  for (size_t i = 0; i < kCount; ++i) static_cast<float*>(victim->data)[i] = 7.0f;
  const std::vector<float> before = Floats(victim->data, kCount);
  // And one made the way a pre-owner-page client (or anyone) makes one.
  const std::string bare_name = NewHeldShmName();
  auto bare = CreateHeldShm(bare_name, kCount * sizeof(float), false);
  ASSERT_TRUE(bare.ok()) << bare.status();

  const std::string wrong(kShmCapabilityBytes, 'x');
  std::string flipped = victim->capability;
  flipped[5] ^= 1;
  struct Try {
    std::string name;
    uint64_t size;
    std::string capability;
  };
  const std::vector<Try> tries = {
      {victim_name, victim->size, ""},
      {victim_name, victim->size, wrong},
      {victim_name, victim->size, flipped},
      {victim_name, victim->size + 4096, wrong},  // a size probe
      {victim_name, 4096, flipped},
      {bare_name, bare->size, ""},
      {bare_name, bare->size, wrong},
      {"/halka-held-does-not-exist", 4096, wrong},
  };
  std::string first_words;
  for (const Try& t : tries) {
    const grpc::Status s = RunNaming(t.name, t.size, t.capability, kCount / 4);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << t.name << ": " << s.error_message();
    // The same words whether the object exists, what size it has, whose
    // it is: nothing about it but the caller's own input.
    std::string words = s.error_message();
    const size_t at = words.find(t.name);
    ASSERT_NE(at, std::string::npos) << words;
    words.erase(at, t.name.size());
    if (first_words.empty()) first_words = words;
    EXPECT_EQ(words, first_words);
    EXPECT_EQ(words.find(absl::StrCat(victim->size)), std::string::npos) << words;
  }
  EXPECT_EQ(Floats(victim->data, kCount), before) << "the victim's data changed";
  UnmapOwnedShm(victim->data, victim->size);
  shm_unlink(victim_name.c_str());
  munmap(bare->data, bare->size);
  shm_unlink(bare_name.c_str());
}

TEST_F(ShmOwnershipTest, TheSdksOwnObjectsStillRunZeroCopy) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < 2; ++r) {
    auto c = cluster_->Connect(r);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
  }
  std::vector<HostBuffer> bufs;
  for (int r = 0; r < 2; ++r) {
    auto b = clients[r]->AllocateHostBuffer(4096 * sizeof(float));
    ASSERT_TRUE(b.ok()) << b.status();
    for (float& f : b->as<float>()) f = static_cast<float>(r + 1);
    bufs.push_back(std::move(*b));
  }
  std::vector<absl::StatusOr<OpInfo>> out(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      out[r] = clients[r]->AllReduce(bufs[r].data(), 4096, DType::kFloat32,
                                     ReduceOp::kSum);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(out[r].ok()) << out[r].status();
    EXPECT_TRUE(out[r]->zero_copy) << "rank " << r << ": " << out[r]->transfer;
    for (float f : bufs[r].as<float>()) ASSERT_EQ(f, 3.0f);
  }
}

// An object truncated while mapped: a guarded mapping reads zeros and says
// it is broken; the process lives.
TEST(ShmGuardTest, TruncatedObjectIsABrokenMappingNotSigbus) {
  const std::string name = NewHeldShmName();
  auto made = CreateOwnedShm(name, 1 << 16);
  ASSERT_TRUE(made.ok()) << made.status();
  ShmCache cache;
  auto mapping = cache.Map(name, made->size, made->capability);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  std::memset(made->data, 1, made->size);
  EXPECT_FALSE((*mapping)->broken());
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);  // what a hostile same-user process does
  close(fd);
  const uint64_t absorbed = ShmGuard::Absorbed();
  volatile uint8_t sum = 0;
  for (size_t i = 0; i < made->size; i += 4096) sum += (*mapping)->base[i];
  EXPECT_EQ(sum, 0) << "after the fault the range reads zeros";
  EXPECT_TRUE((*mapping)->broken());
  EXPECT_GT(ShmGuard::Absorbed(), absorbed);
  UnmapOwnedShm(made->data, made->size);
  shm_unlink(name.c_str());
}

// A link ring truncated by a same-user process: the reader gets DATA_LOSS
// naming the ring (before the guard: SIGBUS killed the worker).
TEST(ShmGuardTest, ATruncatedLinkRingIsDataLossNotSigbus) {
  auto tx = ShmRing::Create(64 << 10);
  ASSERT_TRUE(tx.ok()) << tx.status();
  auto rx = ShmRing::Open((*tx)->name(), (*tx)->token_hex());
  ASSERT_TRUE(rx.ok()) << rx.status();
  const std::string body(100, 'a');
  ASSERT_TRUE((*tx)->TryWrite(body));
  const int fd = shm_open((*tx)->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  auto r = (*rx)->Next(absl::Seconds(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              ::testing::HasSubstr((*tx)->name()));
  EXPECT_TRUE((*rx)->broken());
}

// The sweep takes objects nobody holds a lock on. Before, a creator made
// its object under the swept name and locked it a moment later: a sweep in
// between (or a creator stalled there past the sweep's minimum age) took a
// live creator's object. Now an object has its swept name only once its
// creator holds the lock: a sweep that runs flat out beside 2,000 creations
// (minimum age 0) takes none of them.
TEST(ShmReaperRaceTest, ASweepNeverTakesAnObjectItsCreatorIsMaking) {
  std::atomic<bool> stop{false};
  std::atomic<int> sweeps{0};
  std::thread sweeper([&] {
    while (!stop.load()) {
      SweepHeldShm("/dev/shm", absl::ZeroDuration(),
                   absl::Now() + absl::Seconds(10));
      sweeps.fetch_add(1);
    }
  });
  int lost = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::string name = NewHeldShmName();
    auto made = CreateOwnedShm(name, 4096);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) break;
    const int fd = shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) {
      ++lost;
    } else {
      close(fd);
    }
    UnmapOwnedShm(made->data, made->size);
    shm_unlink(name.c_str());
  }
  stop.store(true);
  sweeper.join();
  EXPECT_GT(sweeps.load(), 10);
  EXPECT_EQ(lost, 0) << "the sweep took objects their creators were making";
}

// A SIGBUS outside every guarded range still ends the process.
TEST(ShmGuardDeathTest, UnguardedSigbusStillKills) {
  // The handler is in place (another guard exists), but this mapping is
  // not guarded: its fault must end the process as it always did.
  auto other = CreateOwnedShm(NewHeldShmName(), 4096);
  ASSERT_TRUE(other.ok()) << other.status();
  auto guard = ShmGuard::Guard(other->data, other->size);
  ASSERT_NE(guard, nullptr);
  const std::string name = NewHeldShmName();
  auto made = CreateHeldShm(name, 1 << 16, false);
  ASSERT_TRUE(made.ok()) << made.status();
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  shm_unlink(name.c_str());
  volatile uint8_t* p = static_cast<uint8_t*>(made->data);
  EXPECT_DEATH(p[100] = 1, "");
  EXPECT_DEATH(raise(SIGBUS), "");
  EXPECT_FALSE(guard->broken());
}

}  // namespace
}  // namespace halka
