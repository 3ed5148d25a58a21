// The ring's path over hosts: which order the ring passes the ranks in so
// that each host's ranks are adjacent. A pure function of the members'
// hosts; the rendezvous publishes its result with every generation
// (Membership.ring_order, Membership.hosts) and the workers run their ring
// in that order (CommConfig::ring_order).
//
// The rule: hosts in the order of their lowest rank, ranks ascending within
// a host. A ring over H >= 2 hosts then crosses from one host to the next
// exactly once: each host has one outgoing and one incoming cross-host
// edge, whatever ranks the users gave (--rank, StatefulSet ordinals). A
// ring in which some member named no host ("": a worker older than the
// order, which runs its ring in rank order) keeps rank order, so that
// every member runs the same ring.
//
// Thread-safety: free functions over values.
#ifndef HALKA_CORE_HOST_RING_H_
#define HALKA_CORE_HOST_RING_H_

#include <string>
#include <vector>

#include "halka/types.h"  // HostGroup

namespace halka {

struct HostRing {
  // order[p]: the rank at ring position p; empty when that is rank order
  // (0, 1, ..., G-1), as it is for a ring of no named hosts.
  std::vector<int> order;
  // The hosts in ring order; empty when a member named no host.
  std::vector<HostGroup> hosts;
};

// host_by_rank[r]: rank r's host ("" when it did not say).
HostRing HostRingOrder(const std::vector<std::string>& host_by_rank);

// Each rank's ring successor (`step` 1) or predecessor (`step` -1) in a
// ring of `g` ranks passed in `order` (order[p]: the rank at position p);
// rank order when `order` is empty or not a permutation of 0..g-1.
std::vector<int> RingNeighbours(int g, const std::vector<int>& order,
                                int step);

}  // namespace halka

#endif  // HALKA_CORE_HOST_RING_H_
