// Hosts for tests of the host-aware algorithms (two-level, tree): a list
// of hosts, each the ranks on it, as CommConfig::hosts holds them.
#ifndef HALKA_TESTS_TESTING_HOSTS_H_
#define HALKA_TESTS_TESTING_HOSTS_H_

#include <string>
#include <vector>

#include "absl/strings/str_join.h"

namespace halka::testing {

using Hosts = std::vector<std::vector<int>>;

// The ring order that keeps each host's ranks adjacent, hosts in order.
inline std::vector<int> OrderOf(const Hosts& hosts) {
  std::vector<int> order;
  for (const auto& h : hosts) order.insert(order.end(), h.begin(), h.end());
  return order;
}

inline int WorldOf(const Hosts& hosts) {
  int g = 0;
  for (const auto& h : hosts) g += static_cast<int>(h.size());
  return g;
}

// "0,1 | 2,3".
inline std::string Name(const Hosts& hosts) {
  std::vector<std::string> parts;
  for (const auto& h : hosts) parts.push_back(absl::StrJoin(h, ","));
  return absl::StrJoin(parts, " | ");
}

// The index of the host `rank` is on; -1: none.
inline int HostOf(const Hosts& hosts, int rank) {
  for (size_t i = 0; i < hosts.size(); ++i) {
    for (int r : hosts[i]) {
      if (r == rank) return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_HOSTS_H_
