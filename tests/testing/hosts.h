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

// Every rank its own host, ranks in order: a flat ring.
inline Hosts Flat(int g) {
  Hosts h;
  for (int r = 0; r < g; ++r) h.push_back({r});
  return h;
}

// Hosts for the tree algorithms (all-reduce and broadcast): 2x2, 4x2,
// 3x3, uneven (3 + 1 + 2), interleaved in rank order, 5 hosts of 2.
inline std::vector<Hosts> MultiHostShapes() {
  return {{{0, 1}, {2, 3}},
          {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
          {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}},
          {{0, 1, 2}, {3}, {4, 5}},
          {{0, 3}, {1, 4}, {2, 5}},
          {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}}};
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
