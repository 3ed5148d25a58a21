// SweepHeldShm over a temporary directory: an object is removed only when
// no open file holds a flock on it and it is old enough; anything else in
// the directory is left alone.
#include "worker/shm_reaper.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace halka {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

class ShmReaperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/halka-shm-reaper-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (int fd : fds_) close(fd);
    std::filesystem::remove_all(dir_);
  }
  // Creates dir/name; with `hold`, keeps it open under a shared flock, as
  // a live client does. Returns the descriptor (or -1).
  int Make(const std::string& name, bool hold) {
    const int fd = open(Path(name).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << name;
    if (fd < 0) return -1;
    if (!hold) {
      close(fd);
      return -1;
    }
    EXPECT_EQ(flock(fd, LOCK_SH), 0);
    fds_.push_back(fd);
    return fd;
  }
  bool Exists(const std::string& name) const {
    return std::filesystem::exists(Path(name));
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  // A sweep as if `after` had passed since the files were made.
  ShmSweep SweepAfter(absl::Duration after) {
    return SweepHeldShm(dir_, absl::Seconds(5), absl::Now() + after);
  }

  std::string dir_;
  std::vector<int> fds_;
};

TEST_F(ShmReaperTest, RemovesOnlyObjectsNoProcessHolds) {
  Make("halka-held-100-1-0", /*hold=*/true);
  Make("halka-held-100-1-1", /*hold=*/false);  // its creator died
  Make("halka-held-200-7-0", /*hold=*/false);
  const ShmSweep s = SweepAfter(absl::Seconds(10));
  EXPECT_EQ(s.held, 1);
  EXPECT_THAT(s.removed, UnorderedElementsAre("halka-held-100-1-1",
                                              "halka-held-200-7-0"));
  EXPECT_TRUE(Exists("halka-held-100-1-0"));
  EXPECT_FALSE(Exists("halka-held-100-1-1"));
  EXPECT_FALSE(Exists("halka-held-200-7-0"));
}

TEST_F(ShmReaperTest, ObjectGoesOnceItsHolderLetsGo) {
  const int fd = Make("halka-held-300-2-0", /*hold=*/true);
  EXPECT_THAT(SweepAfter(absl::Seconds(10)).removed, IsEmpty());
  EXPECT_TRUE(Exists("halka-held-300-2-0"));
  ASSERT_EQ(close(fd), 0);  // the kernel drops the lock with the last close
  fds_.clear();
  EXPECT_THAT(SweepAfter(absl::Seconds(10)).removed, ElementsAre("halka-held-300-2-0"));
  EXPECT_FALSE(Exists("halka-held-300-2-0"));
}

TEST_F(ShmReaperTest, LeavesYoungObjectsAndOtherNames) {
  Make("halka-held-400-3-0", /*hold=*/false);   // just made: maybe not locked yet
  Make("halka-400-3-0", /*hold=*/false);        // an older client's name
  Make("other-held-400-3-0", /*hold=*/false);
  ASSERT_EQ(mkdir(Path("halka-held-dir").c_str(), 0700), 0);
  const ShmSweep young = SweepAfter(absl::ZeroDuration());
  EXPECT_THAT(young.removed, IsEmpty());
  EXPECT_TRUE(Exists("halka-held-400-3-0"));
  const ShmSweep old = SweepAfter(absl::Seconds(10));
  EXPECT_THAT(old.removed, ElementsAre("halka-held-400-3-0"));
  EXPECT_TRUE(Exists("halka-400-3-0"));
  EXPECT_TRUE(Exists("other-held-400-3-0"));
  EXPECT_TRUE(Exists("halka-held-dir"));
}

// An object under its first name (common/held_shm.h) is its creator's
// until it locks it; only one left unlocked for ten minutes is taken.
TEST_F(ShmReaperTest, ObjectsUnderTheirFirstNameGetTenMinutes) {
  Make("halka-new-500-0-halka-held-500-1-0", /*hold=*/false);
  Make("halka-new-500-1-halka-held-500-1-1", /*hold=*/true);
  EXPECT_THAT(SweepAfter(absl::Minutes(9)).removed, IsEmpty());
  EXPECT_THAT(SweepAfter(absl::Minutes(11)).removed,
              ElementsAre("halka-new-500-0-halka-held-500-1-0"));
  EXPECT_TRUE(Exists("halka-new-500-1-halka-held-500-1-1"));
}

TEST_F(ShmReaperTest, MissingDirectoryIsAnEmptySweep) {
  const ShmSweep s = SweepHeldShm(dir_ + "/nonexistent", absl::ZeroDuration(),
                                  absl::Now());
  EXPECT_EQ(s.held, 0);
  EXPECT_THAT(s.removed, IsEmpty());
}

}  // namespace
}  // namespace halka
