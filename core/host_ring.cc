#include "core/host_ring.h"

#include <algorithm>
#include <map>
#include <utility>

namespace halka {

HostRing HostRingOrder(const std::vector<std::string>& host_by_rank) {
  HostRing out;
  // Ranks ascend, so a host's group is created at its lowest rank and the
  // groups are in the order of their lowest ranks.
  std::map<std::string, size_t> group_of;
  for (size_t r = 0; r < host_by_rank.size(); ++r) {
    const std::string& host = host_by_rank[r];
    if (host.empty()) return HostRing{};  // a member runs rank order
    auto [it, fresh] = group_of.emplace(host, out.hosts.size());
    if (fresh) out.hosts.push_back(HostGroup{host, {}});
    out.hosts[it->second].ranks.push_back(static_cast<int>(r));
  }
  bool identity = true;
  for (const HostGroup& h : out.hosts) {
    for (int r : h.ranks) {
      identity &= r == static_cast<int>(out.order.size());
      out.order.push_back(r);
    }
  }
  if (identity) out.order.clear();
  return out;
}

std::vector<int> RingNeighbours(int g, const std::vector<int>& order,
                                int step) {
  const size_t n = static_cast<size_t>(std::max(g, 0));
  std::vector<int> at(n);  // ring position -> rank
  std::vector<bool> seen(n, false);
  bool valid = order.size() == n;
  for (size_t p = 0; p < n; ++p) {
    const int r = valid ? order[p] : static_cast<int>(p);
    if (r < 0 || static_cast<size_t>(r) >= n || seen[static_cast<size_t>(r)]) {
      valid = false;
      break;
    }
    seen[static_cast<size_t>(r)] = true;
    at[p] = r;
  }
  std::vector<int> out(n);
  for (size_t p = 0; p < n; ++p) {
    const int rank = valid ? at[p] : static_cast<int>(p);
    const size_t q = (p + n + static_cast<size_t>(step % g + g)) % n;
    out[static_cast<size_t>(rank)] = valid ? at[q] : static_cast<int>(q);
  }
  return out;
}

}  // namespace halka
