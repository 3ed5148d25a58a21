// What every halka daemon's main() does the same way: start (flags, log
// tag, allocator, security), stop on SIGTERM/SIGINT, and exit fast.
#ifndef HALKA_COMMON_DAEMON_H_
#define HALKA_COMMON_DAEMON_H_

#include <functional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"

namespace halka {

// The start every halka daemon shares: flags from the environment
// (HALKA_*), then the command line; the log tag; the allocator tuned for
// streaming; TLS and job tokens from the flags, for the job that
// `job_flag` names (nullptr: the daemon serves every job, as the
// rendezvous does); then SIGTERM/SIGINT handling (common/signals.h): on the
// first signal it logs it, runs `also` (if any) on the signal thread, and
// fires the returned notification. nullptr, logged, when security cannot
// start: the caller exits with 2.
absl::Notification* StartDaemon(int argc, char** argv, absl::string_view usage,
                                absl::string_view tag,
                                const absl::Flag<std::string>* job_flag,
                                std::function<void(int)> also = nullptr);

// Ends the process now, after flushing: call once everything is stopped
// (gRPC's process-exit teardown would take a second or more for nothing).
[[noreturn]] void ExitNow(int code);

}  // namespace halka

#endif  // HALKA_COMMON_DAEMON_H_
