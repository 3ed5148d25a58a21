// The rendezvous's HTTP side: /metrics (Prometheus text), / (the live ring
// page), /api/jobs and /api/health?job=J (RingHealth as JSON). Each handler
// reads the service through BuildHealth/JobIds, so it takes the service's
// lock only briefly; handlers run on the HTTP server's threads.
#ifndef HALKA_SERVER_RENDEZVOUS_HTTP_H_
#define HALKA_SERVER_RENDEZVOUS_HTTP_H_

#include <map>
#include <string>

#include "common/http_server.h"
#include "halka/v1/rendezvous.pb.h"
#include "server/rendezvous_service.h"

namespace halka {

// Prometheus text exposition of every job's ring health.
std::string RendezvousMetrics(RendezvousService& service);

// RingHealth as JSON (proto field names, every field), with the state
// also as the word people read ("state":"healthy").
std::string HealthJson(const v1::RingHealth& h);

// The handlers by path. `service` must outlive the HTTP server.
std::map<std::string, HttpHandler> RendezvousHttpHandlers(
    RendezvousService* service);

}  // namespace halka

#endif  // HALKA_SERVER_RENDEZVOUS_HTTP_H_
