// The negotiation of the wire path (transport/path_offer.h): the dialling
// end offers a TCP connection of the link's own, sealed with a fresh key
// on a TLS channel (the key travels inside TLS) or plain ("-") otherwise
// (FormatWireOffer); the serving end answers "ok <port> <token>" with a
// one-time token its WireListener expects, or "no: <why>"; the dialling
// end then connects and presents the token, and the link's frames take
// the connection once it is up, or the gRPC stream if it cannot be made
// (that peer is then offered no wire for a minute: WireFallbacks).
#ifndef HALKA_TRANSPORT_TCP_WIRE_PATH_H_
#define HALKA_TRANSPORT_TCP_WIRE_PATH_H_

#include <memory>
#include <string>

#include "core/link_counters.h"
#include "transport/path_offer.h"

namespace halka {

class WireFallbacks;
class WireListener;

// The offer of a wire link to the peer at `address`, sealed when `sealed`;
// null when none is made (the peer's last wire link failed within the
// minute, or no key could be made). `congestion`: the sending socket's
// congestion control (ChooseCongestion, transport/tcp/wire_link.h).
std::unique_ptr<PathOffer> MakeWireOffer(
    const std::string& address, bool sealed,
    std::shared_ptr<LinkCounters> counters,
    std::shared_ptr<WireFallbacks> fallbacks,
    std::string congestion = "system");

// Takes wire offers on `listener` (null: refuses them all); only sealed
// ones when `sealed_only`. With `landing`, the readers put payloads
// straight into the operations' buffers (core/landing.h), counted in
// `counters` (may be null). With `tap`, the operations' threads read the
// links' small frames themselves while they wait (WireReceiver::tap).
std::unique_ptr<PathAcceptor> MakeWireAcceptor(
    WireListener* listener, bool sealed_only, bool landing, bool tap,
    std::shared_ptr<LinkCounters> counters);

}  // namespace halka

#endif  // HALKA_TRANSPORT_TCP_WIRE_PATH_H_
