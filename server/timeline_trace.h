// The per-rank timeline as one Chrome trace: gathered from every worker of
// a ring (Worker.GetTimeline) and written as Chrome trace-event JSON (one
// process row per rank, one thread row per kind of span), which any
// Chrome-trace viewer opens (chrome://tracing, Perfetto, speedscope).
// Used by `halkactl trace`, `halkactl bench --trace` and the rendezvous's
// ring page (/api/trace).
#ifndef HALKA_SERVER_TIMELINE_TRACE_H_
#define HALKA_SERVER_TIMELINE_TRACE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "halka/v1/rendezvous.pb.h"
#include "halka/v1/worker.pb.h"

namespace halka {

// Chrome trace-event JSON of `ranks` (one Timeline per rank; pid = rank).
// Times are microseconds since the earliest operation's start; that start
// is in otherData.t0_unix_us. Per rank, tid 0 holds the operations, 1 the
// phases, 2 the chunk waits, 3 the reduces, 4 the sends, 5 the stalls, 6
// the window stalls (waiting for the wire to release a segment), and 100+P
// the link to rank P writing. Pure.
std::string ChromeTraceJson(const std::vector<v1::Timeline>& ranks);

// Each live member's timeline (members as the rendezvous lists them),
// fetched with `timeout` per worker. Errors: the first worker that did not
// answer, named.
absl::StatusOr<std::vector<v1::Timeline>> GatherTimelines(
    const std::vector<v1::Member>& members, absl::Duration timeout);

}  // namespace halka

#endif  // HALKA_SERVER_TIMELINE_TRACE_H_
