// The link path kinds a worker offers and takes, in one place: what a
// link's dialling end offers (MakePathOffers) and what a worker's serving
// end takes (MakePathAcceptors), fastest kind first, and the one rule that
// picks a link's path (ChoosePath). The gRPC transport and the peer
// service see only PathOffer and PathAcceptor (transport/path_offer.h);
// this file is the only one that names every kind.
#ifndef HALKA_TRANSPORT_PATHS_H_
#define HALKA_TRANSPORT_PATHS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/security.h"
#include "core/link_counters.h"
#include "transport/path_offer.h"

namespace halka {

class WireFallbacks;
class WireListener;

// What a ring's links take from their worker (RingBook::Build fills it
// from the node's options and state; nothing here is read from the
// process).
struct LinkSetup {
  // The ring to offer on the link to `to`; null or 0: no same-host link.
  std::function<size_t(int to)> shm_ring_bytes;
  // Offer peers a wire connection per link (transport/tcp/wire_link.h).
  bool wire_links = false;
  // Its sending socket's congestion control (ChooseCongestion: system,
  // auto, or a name).
  std::string wire_congestion = "system";
  // The channels' TLS and job token (MakeChannel); a wire link is sealed
  // where it is client_tls() (its key then travels inside TLS).
  SecurityConfig security;
  // The worker's link counters and wire fallbacks (null: the transport's
  // own, as in tests).
  std::shared_ptr<LinkCounters> counters;
  std::shared_ptr<WireFallbacks> wire_fallbacks;
};
// `links` with counters and wire fallbacks of its own where it has none.
LinkSetup CompletedLinkSetup(LinkSetup links);

// What a worker's serving end takes (WorkerNode fills it from its options;
// nothing here is read from the process).
struct AcceptSetup {
  // Map the shared-memory rings that same-host peers offer.
  bool accept_shm = false;
  // How long a mapped ring's consumer polls it before it sleeps
  // (ShmRing::set_spin_before_sleep; the worker's shm_spin).
  absl::Duration shm_spin = absl::ZeroDuration();
  // Take wire offers on this listener (null: none; it outlives the
  // service's streams).
  WireListener* wire = nullptr;
  // Only sealed wire offers (the worker serves TLS: its
  // SecurityConfig::server_tls()).
  bool wire_sealed = false;
  // The wire readers may land payloads in operations' buffers
  // (core/landing.h).
  bool wire_landing = true;
  // The operations' threads read the wire links' small frames themselves
  // (WireReceiver::tap).
  bool wire_tap = true;
  // The worker's counters (wire.landed); null: not counted.
  std::shared_ptr<LinkCounters> counters;
  // Read several frames per gRPC message where the dialling side offers
  // it (kFrameBatchesKey, codec/link_metadata.h); off: answer as a worker
  // that predates batches (its peers then send one frame per message).
  bool frame_batches = true;
};

// The offers the link from this worker to rank `to` at `address` makes,
// fastest first (none: the link stays on its gRPC stream). `links` is
// complete (CompletedLinkSetup).
std::vector<std::unique_ptr<PathOffer>> MakePathOffers(
    const LinkSetup& links, int to, const std::string& address);

// The kinds a worker's serving end takes, fastest first.
std::vector<std::unique_ptr<PathAcceptor>> MakePathAcceptors(
    const AcceptSetup& setup);

// Which of `usable` (one entry per offer, in the offers' order: fastest
// first) a link takes: the first usable one, or -1 for the gRPC stream.
// Both ends apply it: the serving end to stop answering after the offer it
// took, the dialling end to the answers.
inline int ChoosePath(const std::vector<bool>& usable) {
  for (size_t i = 0; i < usable.size(); ++i) {
    if (usable[i]) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace halka

#endif  // HALKA_TRANSPORT_PATHS_H_
