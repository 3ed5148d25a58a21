// halka-rendezvous: membership, ranks, ring order, generations, health.
#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/daemon.h"
#include "server/rendezvous_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7100",
          "host:port to serve on (env HALKA_LISTEN)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "how often workers heartbeat (env HALKA_HEARTBEAT_INTERVAL)");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(5),
          "a worker silent this long is declared dead "
          "(env HALKA_HEARTBEAT_TIMEOUT)");
ABSL_FLAG(absl::Duration, elastic_settle, absl::Seconds(1),
          "elastic jobs: how long joins must pause before a ring smaller than "
          "its maximum forms or grows (env HALKA_ELASTIC_SETTLE)");
ABSL_FLAG(int, join_answer_window, 64,
          "a forming ring's Join answers go out in waves: at most this many "
          "answered members not yet heard from (their first heartbeat); 0: "
          "all at once (env HALKA_JOIN_ANSWER_WINDOW)");

ABSL_FLAG(int, metrics_port, 0,
          "serve HTTP on this port: /metrics (Prometheus), / (live ring "
          "page), /api/health?job=J; 0: off (env HALKA_METRICS_PORT)");

ABSL_FLAG(std::string, link_model, "",
          "the jobs' link model, local=ALPHA_US:GBPS,net=ALPHA_US:GBPS (per "
          "message latency in microseconds and rate in GB/s inside a host "
          "and between hosts; halkactl bench --model measures them): every "
          "member's auto then ranks the all-reduce, reduce-scatter and "
          "all-gather algorithms by the model's predicted time "
          "(docs/scaling.md); \"probe\": each job's members measure it on "
          "their ring links whenever the members change, and it is published "
          "as the next generation; empty: auto's counting rules (env "
          "HALKA_LINK_MODEL)");

ABSL_FLAG(absl::Duration, link_probe_every, absl::ZeroDuration(),
          "with --link_model=probe: a job's model measured this long ago is "
          "measured again while its members stay (two generation changes: "
          "one asks, one publishes); 0: only when the members change (env "
          "HALKA_LINK_PROBE_EVERY)");

int main(int argc, char** argv) {
  absl::Notification* stop = halka::StartDaemon(
      argc, argv,
      "halka-rendezvous --listen=HOST:PORT "
      "[--heartbeat_timeout=5s]",
      "rendezvous", nullptr);
  if (stop == nullptr) return 2;
  halka::RendezvousOptions options;
  options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  options.elastic_settle = absl::GetFlag(FLAGS_elastic_settle);
  options.join_answer_window = absl::GetFlag(FLAGS_join_answer_window);
  if (const std::string lm = absl::GetFlag(FLAGS_link_model); lm == "probe") {
    options.probe_links = true;
    options.probe_every = absl::GetFlag(FLAGS_link_probe_every);
    halka::LogInfo(
        "link model: measured by each job's members on their ring links");
  } else if (!lm.empty()) {
    absl::StatusOr<halka::LinkModel> m = halka::ParseLinkModel(lm);
    if (!m.ok()) {
      halka::LogError(absl::StrCat("--link_model: ", m.status().message()));
      return 2;
    }
    options.link_model = *m;
    halka::LogInfo(absl::StrCat("link model for every job: ",
                                halka::DescribeLinkModel(*m)));
  }
  auto started = halka::RendezvousServer::Start(
      absl::GetFlag(FLAGS_listen), options, absl::GetFlag(FLAGS_metrics_port));
  if (!started.ok()) {
    halka::LogError(started.status().ToString());
    return 1;
  }
  std::unique_ptr<halka::RendezvousServer> server = std::move(*started);
  halka::LogInfo(absl::StrCat("serving on ", server->address()));
  std::cout << "halka-rendezvous listening on " << server->address()
            << std::endl;
  stop->WaitForNotification();
  server->Shutdown();
  halka::ExitNow(0);
}
