// The negotiation of the same-host path (transport/path_offer.h): the
// dialling end offers a shared-memory ring it created ("<name> <token>
// <netns>", FormatShmOffer), the serving end maps it if it can
// (AcceptShmOffer: same network namespace, the object there with that
// token) and answers "ok" or "no: <why>". Once answered, the ring's name
// is unlinked: both ends hold the mapping, nobody else can open it.
#ifndef HALKA_TRANSPORT_SHM_SHM_PATH_H_
#define HALKA_TRANSPORT_SHM_SHM_PATH_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "core/link_counters.h"
#include "transport/path_offer.h"

namespace halka {

// The offer of a ring of `ring_bytes` to the peer at `address`; null when
// none is made (0 bytes, a peer that cannot share this host, or no ring
// could be created).
std::unique_ptr<PathOffer> MakeShmOffer(size_t ring_bytes,
                                        const std::string& address,
                                        std::shared_ptr<LinkCounters> counters);

// Maps offered rings (refuses them all unless `enabled`); each consumer
// polls `spin` before it sleeps.
std::unique_ptr<PathAcceptor> MakeShmAcceptor(bool enabled,
                                              absl::Duration spin);

}  // namespace halka

#endif  // HALKA_TRANSPORT_SHM_SHM_PATH_H_
