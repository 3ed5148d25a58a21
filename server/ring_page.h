// The live ring page the rendezvous serves at / (HTML + JS, no CDN): members
// as nodes on a circle, ring edges coloured by throughput, the straggler
// marked; it polls /api/health?job=J once a second.
#ifndef HALKA_SERVER_RING_PAGE_H_
#define HALKA_SERVER_RING_PAGE_H_

#include <string>

namespace halka {
const std::string& RingPageHtml();
}  // namespace halka

#endif  // HALKA_SERVER_RING_PAGE_H_
