#include "transport/paths.h"

#include <utility>

#include "transport/shm/shm_path.h"
#include "transport/tcp/wire_link.h"  // WireFallbacks
#include "transport/tcp/wire_path.h"

namespace halka {

LinkSetup CompletedLinkSetup(LinkSetup links) {
  if (links.counters == nullptr) {
    links.counters = std::make_shared<LinkCounters>();
  }
  if (links.wire_fallbacks == nullptr) {
    links.wire_fallbacks = std::make_shared<WireFallbacks>();
  }
  return links;
}

std::vector<std::unique_ptr<PathOffer>> MakePathOffers(
    const LinkSetup& links, int to, const std::string& address) {
  std::vector<std::unique_ptr<PathOffer>> offers;
  // A same-host ring first: shared memory wins over the wire.
  if (links.shm_ring_bytes) {
    if (auto shm = MakeShmOffer(links.shm_ring_bytes(to), address,
                                links.counters)) {
      offers.push_back(std::move(shm));
    }
  }
  if (links.wire_links) {
    if (auto wire = MakeWireOffer(address, links.security.client_tls(),
                                  links.counters, links.wire_fallbacks,
                                  links.wire_congestion)) {
      offers.push_back(std::move(wire));
    }
  }
  return offers;
}

std::vector<std::unique_ptr<PathAcceptor>> MakePathAcceptors(
    const AcceptSetup& setup) {
  std::vector<std::unique_ptr<PathAcceptor>> acceptors;
  acceptors.push_back(MakeShmAcceptor(setup.accept_shm, setup.shm_spin));
  acceptors.push_back(MakeWireAcceptor(setup.wire, setup.wire_sealed,
                                       setup.wire_landing, setup.wire_tap,
                                       setup.counters));
  return acceptors;
}

}  // namespace halka
