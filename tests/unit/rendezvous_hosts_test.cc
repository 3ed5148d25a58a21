// The ring's path over hosts (core/host_ring.h) as the rendezvous state
// publishes it: each host's ranks adjacent, one cross-host edge out of and
// into each host, ranks left as the users gave them; rank order for a job
// whose members did not all name a host; and the same after a loss
// re-forms the ring.
// (A file of its own next to rendezvous_state_test, which is long already.)
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/host_ring.h"
#include "server/rendezvous_state.h"

namespace halka {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// The ring order of a view, rank order spelled out when the view leaves it
// empty.
std::vector<int> Order(const MembershipView& v) {
  if (!v.ring_order.empty()) return v.ring_order;
  std::vector<int> order;
  for (size_t r = 0; r < v.members.size(); ++r) order.push_back(static_cast<int>(r));
  return order;
}

// Checks that `order` is a ring over every rank of `v` in which each host's
// ranks are adjacent and ascending, and each host has exactly one outgoing
// and one incoming cross-host edge (when there are two hosts or more).
void ExpectHostsAdjacent(const MembershipView& v) {
  const std::vector<int> order = Order(v);
  const size_t g = v.members.size();
  ASSERT_EQ(order.size(), g);
  EXPECT_EQ(std::set<int>(order.begin(), order.end()).size(), g);
  std::map<std::string, int> out, in;
  std::set<std::string> hosts;
  for (size_t p = 0; p < g; ++p) {
    const int from = order[p];
    const int to = order[(p + 1) % g];
    const std::string& a = v.members[static_cast<size_t>(from)].host;
    const std::string& b = v.members[static_cast<size_t>(to)].host;
    hosts.insert(a);
    if (a != b) {
      ++out[a];
      ++in[b];
    } else if (p + 1 < g) {
      EXPECT_LT(from, to) << "ranks of " << a << " not ascending";
    }
  }
  if (hosts.size() < 2) return;
  for (const std::string& h : hosts) {
    EXPECT_EQ(out[h], 1) << h;
    EXPECT_EQ(in[h], 1) << h;
  }
  // The published groups say the same.
  ASSERT_EQ(v.hosts.size(), hosts.size());
  std::vector<int> concatenated;
  for (const HostGroup& h : v.hosts) {
    for (int r : h.ranks) {
      EXPECT_EQ(v.members[static_cast<size_t>(r)].host, h.host);
      concatenated.push_back(r);
    }
  }
  EXPECT_EQ(concatenated, order);
}

class RendezvousHostsTest : public ::testing::Test {
 protected:
  // Joins w0..w{n-1} to job "j" with rank i and host hosts[i].
  void Form(const std::vector<std::string>& hosts, int min = 0) {
    const int n = static_cast<int>(hosts.size());
    for (int i = 0; i < n; ++i) {
      JoinArgs a;
      a.job_id = "j";
      a.worker_id = absl::StrCat("w", i);
      a.address = absl::StrCat("10.0.0.", i, ":7000");
      a.world_size = n;
      a.min_world_size = min > 0 ? min : 0;
      a.max_world_size = min > 0 ? n : 0;
      a.requested_rank = i;
      a.host = hosts[static_cast<size_t>(i)];
      ASSERT_TRUE(state_.Join(a, now_).ok()) << i;
    }
  }
  MembershipView View() {
    std::optional<MembershipView> v = state_.AssignmentView("j");
    EXPECT_TRUE(v.has_value());
    return v.value_or(MembershipView());
  }

  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  RendezvousState state_;
};

TEST(HostRingOrder, InterleavedHostsBecomeAdjacentGroups) {
  const HostRing r =
      HostRingOrder({"A", "B", "A", "B", "A", "B", "A", "B"});
  EXPECT_THAT(r.order, ElementsAre(0, 2, 4, 6, 1, 3, 5, 7));
  ASSERT_EQ(r.hosts.size(), 2u);
  EXPECT_EQ(r.hosts[0].host, "A");
  EXPECT_THAT(r.hosts[0].ranks, ElementsAre(0, 2, 4, 6));
  EXPECT_EQ(r.hosts[1].host, "B");
  EXPECT_THAT(r.hosts[1].ranks, ElementsAre(1, 3, 5, 7));
}

TEST(HostRingOrder, NoHostsOrBlocksKeepRankOrder) {
  const HostRing none = HostRingOrder({"", "", "", ""});
  EXPECT_THAT(none.order, IsEmpty());
  EXPECT_THAT(none.hosts, IsEmpty());
  // Hosts already in blocks: rank order, said by leaving the order empty;
  // the groups are still published.
  const HostRing blocks = HostRingOrder({"A", "A", "B", "B"});
  EXPECT_THAT(blocks.order, IsEmpty());
  ASSERT_EQ(blocks.hosts.size(), 2u);
  EXPECT_THAT(blocks.hosts[1].ranks, ElementsAre(2, 3));
  // A member that named no host (an older worker, which runs rank order):
  // rank order for everyone.
  const HostRing mixed = HostRingOrder({"A", "", "A", "B", ""});
  EXPECT_THAT(mixed.order, IsEmpty());
  EXPECT_THAT(mixed.hosts, IsEmpty());
}

TEST(HostRingOrder, HostsOrderedByTheirLowestRank) {
  const HostRing r = HostRingOrder({"C", "A", "B", "A", "C", "B"});
  EXPECT_THAT(r.order, ElementsAre(0, 4, 1, 3, 2, 5));
  ASSERT_EQ(r.hosts.size(), 3u);
  EXPECT_EQ(r.hosts[0].host, "C");
  EXPECT_EQ(r.hosts[1].host, "A");
  EXPECT_EQ(r.hosts[2].host, "B");
}

TEST(RingNeighbours, FollowTheOrderOrRankOrder) {
  EXPECT_THAT(RingNeighbours(4, {0, 2, 1, 3}, 1), ElementsAre(2, 3, 1, 0));
  EXPECT_THAT(RingNeighbours(4, {0, 2, 1, 3}, -1), ElementsAre(3, 2, 0, 1));
  EXPECT_THAT(RingNeighbours(3, {}, 1), ElementsAre(1, 2, 0));
  EXPECT_THAT(RingNeighbours(3, {}, -1), ElementsAre(2, 0, 1));
  // Not a permutation: rank order.
  EXPECT_THAT(RingNeighbours(3, {0, 0, 1}, 1), ElementsAre(1, 2, 0));
  EXPECT_THAT(RingNeighbours(3, {0, 1}, 1), ElementsAre(1, 2, 0));
  EXPECT_THAT(RingNeighbours(1, {0}, 1), ElementsAre(0));
}

TEST_F(RendezvousHostsTest, InterleavedRanksGetAHostAdjacentRing) {
  Form({"A", "B", "A", "B", "A", "B", "A", "B"});
  const MembershipView v = View();
  EXPECT_EQ(v.generation, 1u);
  // The ranks are the users'.
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(v.members[static_cast<size_t>(r)].worker_id, absl::StrCat("w", r));
    EXPECT_EQ(v.members[static_cast<size_t>(r)].host, r % 2 == 0 ? "A" : "B");
  }
  EXPECT_THAT(v.ring_order, ElementsAre(0, 2, 4, 6, 1, 3, 5, 7));
  ExpectHostsAdjacent(v);
  // Health says the same.
  absl::StatusOr<MembershipView> h = state_.Health("j", now_);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->ring_order, v.ring_order);
  EXPECT_EQ(h->hosts.size(), 2u);
}

TEST_F(RendezvousHostsTest, ThreeHostsScatteredByRank) {
  Form({"x", "y", "z", "z", "y", "x", "y", "z", "x"});
  ExpectHostsAdjacent(View());
  EXPECT_THAT(View().ring_order, ElementsAre(0, 5, 8, 1, 4, 6, 2, 3, 7));
}

TEST_F(RendezvousHostsTest, NoHostInfoKeepsRankOrder) {
  Form({"", "", "", "", ""});
  const MembershipView v = View();
  EXPECT_THAT(v.ring_order, IsEmpty());
  EXPECT_THAT(v.hosts, IsEmpty());
  for (int r = 0; r < 5; ++r) EXPECT_EQ(v.members[static_cast<size_t>(r)].rank, r);
}

TEST_F(RendezvousHostsTest, ReformedGenerationKeepsHostsAdjacent) {
  // Elastic (min 4): losing a member re-forms the ring with new ranks.
  Form({"A", "B", "A", "B", "A", "B", "A", "B"}, /*min=*/4);
  ASSERT_TRUE(state_.Leave("j", "w2", now_).ok());
  MembershipView v = View();
  EXPECT_EQ(v.generation, 2u);
  ASSERT_EQ(v.members.size(), 7u);
  ExpectHostsAdjacent(v);
  // A second loss, of a B member: still adjacent.
  ASSERT_TRUE(state_.Leave("j", "w5", now_).ok());
  v = View();
  EXPECT_EQ(v.generation, 3u);
  ASSERT_EQ(v.members.size(), 6u);
  ExpectHostsAdjacent(v);
  std::map<std::string, int> per_host;
  for (const MemberView& m : v.members) ++per_host[m.host];
  EXPECT_EQ(per_host["A"], 3);
  EXPECT_EQ(per_host["B"], 3);
}

TEST_F(RendezvousHostsTest, RestoredJobKeepsItsHosts) {
  RingClaim claim;
  claim.generation = 4;
  claim.min_world_size = claim.max_world_size = 4;
  for (int r = 0; r < 4; ++r) {
    MemberView m;
    m.rank = r;
    m.worker_id = absl::StrCat("w", r);
    m.address = absl::StrCat("10.0.0.", r, ":7000");
    m.host = r % 2 == 0 ? "A" : "B";
    claim.members.push_back(m);
  }
  ASSERT_TRUE(state_.Restore("j", claim, now_).ok());
  const MembershipView v = View();
  EXPECT_THAT(v.ring_order, ElementsAre(0, 2, 1, 3));
  ExpectHostsAdjacent(v);
}

TEST_F(RendezvousHostsTest, OverlongHostIsRefused) {
  JoinArgs a;
  a.job_id = "j";
  a.worker_id = "w0";
  a.address = "10.0.0.1:7000";
  a.world_size = 1;
  a.host = std::string(300, 'h');
  EXPECT_EQ(state_.Join(a, now_).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace halka
