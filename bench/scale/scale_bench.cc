// halka-scale-bench: the control plane at N members. For each size, a
// fresh halka-rendezvous with default flags (plus --rendezvous_flags) on
// 127.0.0.1, and N simulated members over its gRPC API (Join, heartbeat
// every second, --watchers of them Watch); one member Leaves at the end.
// Prints one markdown row per size (docs/performance.md).
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/scale/member_sim.h"
#include "common/grpc_util.h"

ABSL_FLAG(std::string, sizes, "64,256,1024,4096", "member counts to run");
ABSL_FLAG(int, watchers, -1, "members that Watch; -1: every member");
ABSL_FLAG(absl::Duration, steady, absl::Seconds(10),
          "heartbeat this long after the last Join was answered");
ABSL_FLAG(absl::Duration, join_spread, absl::ZeroDuration(),
          "send the Joins evenly over this span");
ABSL_FLAG(std::string, rendezvous_bin, HALKA_RENDEZVOUS_BIN,
          "the halka-rendezvous binary");
ABSL_FLAG(std::string, rendezvous_flags, "",
          "extra flags for halka-rendezvous, comma-separated");
ABSL_FLAG(std::string, log_dir, "/tmp", "where the rendezvous logs go");
ABSL_FLAG(bool, heartbeat_channels, false,
          "members heartbeat on connections of their own");
ABSL_FLAG(bool, compact, true,
          "members ask for the ring deflated in Join replies and for Watch "
          "deltas (as halka-worker); false: whole memberships");

namespace {

std::string Ms(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return "not all";
  return absl::StrFormat("%.2f s", absl::ToDoubleSeconds(d));
}

// One size's row of the table (stdout).
void PrintRow(int n, const halka::scale::SimOptions& o,
              const halka::scale::SimResult& r) {
  std::printf(
      "| %d | %d | %s | %.2f s (%.2f ms) | %d | %.0f MiB | %.1f KB (%ld B) | "
      "%d | %.1f / %.1f ms | %.1f / %.1f ms | %d | %d | %llu | %s |\n",
      n, o.watchers, r.joined == n ? Ms(r.after_last_join).c_str()
                                   : absl::StrCat(r.joined, " of ", n).c_str(),
      r.joins_cpu_seconds, 1e3 * r.joins_cpu_seconds / n, r.peak_threads,
      static_cast<double>(r.at_end.rss_kib) / 1024.0,
      static_cast<double>(r.joins_log_bytes) / 1e3, r.joins_log_bytes / n,
      r.heartbeats, r.heartbeat_p50_ms, r.heartbeat_p99_ms, r.steady_p50_ms,
      r.steady_p99_ms,
      r.heartbeat_errors, r.false_deaths,
      static_cast<unsigned long long>(r.steady_generation),
      Ms(r.change_reached_all).c_str());
  std::fflush(stdout);
}

// One size's figures beyond the table, and its first errors (stderr).
void PrintDetails(int n, const halka::scale::SimResult& r) {
  std::fprintf(stderr,
               "N=%d: CPU used in all: rendezvous %.1f s, simulator %.1f s\n",
               n, r.at_end.cpu_seconds, r.sim_cpu_seconds);
  std::fprintf(stderr,
               "N=%d: Join replies %.1f MB (%.1f KB each); Watch messages "
               "for the change %.2f MB\n",
               n, static_cast<double>(r.join_reply_bytes) / 1e6,
               r.joined > 0 ? static_cast<double>(r.join_reply_bytes) /
                                  r.joined / 1e3
                            : 0.0,
               static_cast<double>(r.change_watch_bytes) / 1e6);
  std::string by_second;
  for (double ms : r.p99_by_second_ms) absl::StrAppend(&by_second, " ", ms);
  std::fprintf(stderr, "N=%d: heartbeat p99 (ms) by second:%s\n", n,
               by_second.c_str());
  if (!r.first_join_error.empty()) {
    std::fprintf(stderr, "N=%d first Join error: %s\n", n,
                 r.first_join_error.c_str());
  }
  if (!r.first_heartbeat_error.empty()) {
    std::fprintf(stderr, "N=%d first heartbeat error: %s\n", n,
                 r.first_heartbeat_error.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As halka-worker: no Abseil deadlock detection on every lock, glibc's
  // heap kept (the members' calls allocate and free the same sizes).
  halka::TuneProcessForStreaming();
  std::vector<std::string> flags;
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_rendezvous_flags),
                                            ',', absl::SkipEmpty())) {
    flags.emplace_back(f);
  }
  std::printf(
      "| members | watchers | all Joins answered, after the last Join | "
      "rendezvous CPU for the joins (per Join) | peak threads | peak RSS | "
      "log by the joins (per Join) | heartbeats | heartbeat p50 / p99, all | "
      "p50 / p99, steady | "
      "heartbeat errors | false deaths | generation | change reaches all "
      "watchers |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      "---:|---:|---:|\n");
  int failures = 0;
  for (absl::string_view size : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',',
                                               absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(size, &n) || n < 2) {
      std::fprintf(stderr, "bad size %s (need an integer >= 2)\n",
                   std::string(size).c_str());
      return 2;
    }
    const std::string log = absl::StrCat(absl::GetFlag(FLAGS_log_dir),
                                         "/halka-scale-rendezvous-", n, "-",
                                         getpid(), ".log");
    auto rv = halka::scale::RendezvousProcess::Start(
        absl::GetFlag(FLAGS_rendezvous_bin), flags, log);
    if (!rv.ok()) {
      std::fprintf(stderr, "%s\n", rv.status().ToString().c_str());
      return 1;
    }
    halka::scale::SimOptions o;
    o.rendezvous = rv->address();
    o.members = n;
    o.watchers = absl::GetFlag(FLAGS_watchers) < 0 ? n
                                                   : absl::GetFlag(FLAGS_watchers);
    o.steady = absl::GetFlag(FLAGS_steady);
    o.join_spread = absl::GetFlag(FLAGS_join_spread);
    o.heartbeat_channels = absl::GetFlag(FLAGS_heartbeat_channels);
    o.compact = absl::GetFlag(FLAGS_compact);
    o.rendezvous_pid = rv->pid();
    o.rendezvous_log = log;
    const halka::scale::SimResult r = halka::scale::RunSim(o);
    rv->Stop();
    PrintRow(n, o, r);
    PrintDetails(n, r);
    failures += r.joined != n || r.false_deaths != 0 ? 1 : 0;
  }
  return failures == 0 ? 0 : 1;
}
