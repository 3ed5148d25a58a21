// The control plane at scale (issue 18), over real gRPC on loopback: a
// halka-rendezvous process and simulated members (bench/scale/member_sim)
// that Join, heartbeat at once after their Join returns and then every
// interval, and Watch.
//  - a staggered start (the last member several heartbeat timeouts late)
//    forms generation 1 with nobody lost, and stays there;
//  - 400 members are all admitted in generation 1 with no false death,
//    blocked Joins hold no thread, each Join logs one short line, and every
//    watcher sees a membership change.
// No timing is asserted (docs/performance.md has the figures, from
// bench/scale/scale_bench); every wait is bounded.
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/scale/member_sim.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace halka::scale {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string LogPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/halka-", name, "-",
                      getpid(), ".log");
}

TEST(RendezvousScaleTest, StaggeredStartFormsGenerationOneAndStays) {
  // Timeouts scaled down (250 ms beats, 1 s timeout) so that the last
  // member, 3.5 timeouts late, is a pod minutes late in a few seconds.
  const std::string log = LogPath("staggered");
  auto rv = RendezvousProcess::Start(
      HALKA_RENDEZVOUS_BIN,
      {"--heartbeat_interval=250ms", "--heartbeat_timeout=1s"}, log);
  ASSERT_TRUE(rv.ok()) << rv.status();
  SimOptions o;
  o.rendezvous = rv->address();
  o.members = 4;
  o.watchers = 4;
  o.join_spread = absl::Milliseconds(500);
  o.last_join_delay = absl::Milliseconds(3500);
  o.heartbeat_interval = absl::Milliseconds(250);
  o.steady = absl::Seconds(3);  // 3 timeouts of beating
  o.join_timeout = absl::Seconds(20);
  o.change_at_end = false;
  const SimResult r = RunSim(o);
  rv->Stop();
  EXPECT_EQ(r.joined, 4) << r.first_join_error;
  EXPECT_EQ(r.min_join_generation, 1u);
  EXPECT_EQ(r.max_join_generation, 1u);
  EXPECT_GT(r.heartbeats, 4 * 8);
  EXPECT_EQ(r.heartbeat_errors, 0) << r.first_heartbeat_error;
  EXPECT_EQ(r.false_deaths, 0);
  EXPECT_EQ(r.steady_generation, 1u);
  EXPECT_EQ(r.watchers_open, 4);
  const std::string text = ReadFile(log);
  EXPECT_THAT(text, HasSubstr("generation 1: ring formed with 4 members"));
  EXPECT_THAT(text, Not(HasSubstr("lost")));
  EXPECT_THAT(text, Not(HasSubstr("generation 1->")));
}

TEST(RendezvousScaleTest, ManyMembersAdmittedWithoutFalseDeaths) {
  constexpr int kMembers = 400;
  const std::string log = LogPath("many");
  auto rv = RendezvousProcess::Start(HALKA_RENDEZVOUS_BIN, {}, log);
  ASSERT_TRUE(rv.ok()) << rv.status();
  SimOptions o;
  o.rendezvous = rv->address();
  o.members = kMembers;
  o.watchers = kMembers;  // every member watches
  o.steady = absl::Seconds(4);
  o.join_timeout = absl::Seconds(30);
  o.rendezvous_pid = rv->pid();
  const SimResult r = RunSim(o);
  rv->Stop();
  EXPECT_EQ(r.joined, kMembers) << r.first_join_error;
  EXPECT_EQ(r.join_errors, 0) << r.first_join_error;
  EXPECT_EQ(r.min_join_generation, 1u);
  EXPECT_EQ(r.max_join_generation, 1u);
  EXPECT_EQ(r.false_deaths, 0) << r.first_heartbeat_error;
  EXPECT_EQ(r.steady_generation, 1u);
  // Beats may time out on a loaded 2-core host (2 s deadline); a refusal
  // would be a false death, counted above.
  EXPECT_GT(r.heartbeats, kMembers * 3);
  // The old rendezvous held a thread per blocked Join (over 400 here).
  EXPECT_GT(r.peak_threads, 0);
  EXPECT_LT(r.peak_threads, 100);
  // Every watcher but the leaver's own saw the Leave.
  EXPECT_EQ(r.watchers_open, kMembers);
  EXPECT_EQ(r.watchers_saw_change, kMembers - 1);
  EXPECT_NE(r.change_reached_all, absl::InfiniteDuration());

  // One short line per Join: counts, not lists, above a few members.
  const std::string text = ReadFile(log);
  int join_lines = 0;
  size_t join_bytes = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    EXPECT_THAT(std::string(line), Not(HasSubstr("lost")));
    if (!absl::StrContains(line, "] join of ")) continue;
    ++join_lines;
    join_bytes += line.size() + 1;
    int listed = 0;
    for (size_t at = 0; (at = line.find(" at 127.0.0.1:", at)) !=
                        absl::string_view::npos;
         ++at) {
      ++listed;
    }
    EXPECT_LE(listed, 8) << line;
    EXPECT_LE(line.size(), 400u) << line;
  }
  EXPECT_EQ(join_lines, kMembers);
  // About 90 bytes a Join (a list of everyone would be ~6 KB a line here).
  EXPECT_LT(join_bytes, kMembers * 150u);
  EXPECT_THAT(text, HasSubstr(absl::StrCat("join of sim-", kMembers - 1)));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("generation 1: ring formed with ",
                                           kMembers, " members")));
}

}  // namespace
}  // namespace halka::scale
