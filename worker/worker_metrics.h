// What a worker reports about itself: the Prometheus text it serves at
// /metrics and the telemetry its heartbeats carry, as pure functions of a
// communicator's Telemetry and Progress (tested without a ring).
#ifndef HALKA_WORKER_WORKER_METRICS_H_
#define HALKA_WORKER_WORKER_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "halka/v1/rendezvous.pb.h"
#include "halka/v1/worker.pb.h"
#include "core/communicator.h"
#include "core/link_counters.h"

namespace halka {

// The /metrics text of rank `rank` of a ring of `world` ranks (peers at or
// above `world` are parameter-server shards, labelled "ps<k>"), with the
// worker's own link counters.
std::string WorkerMetricsText(const std::string& job_id, int rank,
                              uint64_t generation, int world,
                              const Telemetry& t, const LinkCounters& links);

// The telemetry a heartbeat carries; `now` dates the current wait.
v1::WorkerTelemetry TelemetryProto(const Telemetry& tel, const Progress& p,
                                   absl::Time now);

// The timeline GetTimeline answers (ops oldest first; times in Unix us).
v1::Timeline TimelineProto(const std::vector<TraceOp>& ops);

}  // namespace halka

#endif  // HALKA_WORKER_WORKER_METRICS_H_
