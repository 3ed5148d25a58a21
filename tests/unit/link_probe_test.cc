// The link probe's plan (worker/link_probe.h, PlanProbeRounds): every ring
// edge once, at the right level, and no two edges of one round sharing a
// rank or, between hosts, a host's NIC.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/link_probe.h"

namespace halka {
namespace {

// The host index of each rank (its own when hosts are not known).
std::map<int, int> HostOf(const std::vector<int>& order,
                          const std::vector<std::vector<int>>& hosts) {
  std::map<int, int> of;
  for (size_t h = 0; h < hosts.size(); ++h) {
    for (int r : hosts[h]) of[r] = static_cast<int>(h);
  }
  for (int r : order) {
    if (of.count(r) == 0) of[r] = 1000 + r;
  }
  return of;
}

void ExpectPlan(const std::vector<int>& order,
                const std::vector<std::vector<int>>& hosts,
                const std::string& shape) {
  SCOPED_TRACE(shape);
  const std::vector<ProbeEdge> plan = PlanProbeRounds(order, hosts);
  const int g = static_cast<int>(order.size());
  ASSERT_EQ(static_cast<int>(plan.size()), g == 2 ? 1 : g);
  const std::map<int, int> host = HostOf(order, hosts);
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ProbeEdge& e = plan[i];
    EXPECT_EQ(e.a, order[i]);
    EXPECT_EQ(e.b, order[(i + 1) % order.size()]);
    EXPECT_EQ(e.local, host.at(e.a) == host.at(e.b)) << e.a << "-" << e.b;
    EXPECT_GE(e.round, 0);
    EXPECT_LT(e.round, kProbeRounds);
    EXPECT_TRUE(seen.insert({std::min(e.a, e.b), std::max(e.a, e.b)}).second);
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    for (size_t j = i + 1; j < plan.size(); ++j) {
      const ProbeEdge& x = plan[i];
      const ProbeEdge& y = plan[j];
      if (x.round != y.round) continue;
      EXPECT_TRUE(x.a != y.a && x.a != y.b && x.b != y.a && x.b != y.b)
          << "edges " << x.a << "-" << x.b << " and " << y.a << "-" << y.b
          << " share a rank in round " << x.round;
      if (!x.local && !y.local) {
        const std::set<int> hx = {host.at(x.a), host.at(x.b)};
        EXPECT_TRUE(hx.count(host.at(y.a)) == 0 && hx.count(host.at(y.b)) == 0)
            << "net edges " << x.a << "-" << x.b << " and " << y.a << "-"
            << y.b << " share a host in round " << x.round;
      }
    }
  }
}

TEST(LinkProbePlan, NoTwoEdgesOfARoundShareARankOrAHost) {
  ExpectPlan({0, 1}, {}, "two ranks, hosts not known");
  ExpectPlan({0, 1}, {{0, 1}}, "two ranks on one host");
  ExpectPlan({0, 1, 2}, {{0, 1, 2}}, "one host of 3 (an odd cycle)");
  ExpectPlan({0, 1, 2, 3, 4}, {}, "5 ranks, hosts not known (all net, odd)");
  ExpectPlan({0, 2, 1, 3}, {{0, 2}, {1, 3}}, "2 x 2 in host order");
  ExpectPlan({0, 1, 2, 3, 4, 5}, {{0, 1}, {2, 3}, {4, 5}}, "3 x 2 (odd nets)");
  ExpectPlan({0, 4, 1, 5, 2, 6, 3, 7}, {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
             "4 x 2");
  ExpectPlan({0, 1, 2, 3, 4, 5, 6, 7}, {{0, 1, 2, 3}, {4, 5, 6, 7}}, "2 x 4");
  ExpectPlan({0, 1, 2, 3, 4, 5}, {{0, 1, 2}, {3}, {4, 5}}, "uneven 3 + 1 + 2");
}

TEST(LinkProbePlan, TheLevelsOfAHostOrderedRing) {
  const std::vector<ProbeEdge> plan =
      PlanProbeRounds({0, 2, 1, 3}, {{0, 2}, {1, 3}});
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_TRUE(plan[0].local);   // 0-2 on host 0
  EXPECT_FALSE(plan[1].local);  // 2-1 across
  EXPECT_TRUE(plan[2].local);   // 1-3 on host 1
  EXPECT_FALSE(plan[3].local);  // 3-0 across
  // The two net edges join the same two hosts: never at once.
  EXPECT_NE(plan[1].round, plan[3].round);
  EXPECT_TRUE(PlanProbeRounds({0}, {}).empty());
}

}  // namespace
}  // namespace halka
