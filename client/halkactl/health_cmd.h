// halkactl's health commands: `health` (a ring's health from the
// rendezvous or a worker, once or --watch), `trace` (a job's timeline as
// Chrome trace JSON), `healthcheck` (the gRPC health service of a worker).
// The flags are halkactl's (halkactl.cc).
#ifndef HALKA_CLIENT_HALKACTL_HEALTH_CMD_H_
#define HALKA_CLIENT_HALKACTL_HEALTH_CMD_H_

#include <string>

#include "absl/status/status.h"
#include "halka/v1/rendezvous.pb.h"

namespace halka {

// Prints `s` as halkactl's error; returns the exit status 1.
int Fail(const absl::Status& s);

// Writes the timeline of `h` to `out` as Chrome trace JSON.
int WriteTrace(const v1::RingHealth& h, const std::string& out);
int Trace(const std::string& rendezvous, const std::string& job,
          const std::string& out);
int HealthCommand();
int HealthCheck(const std::string& target);

}  // namespace halka

#endif  // HALKA_CLIENT_HALKACTL_HEALTH_CMD_H_
