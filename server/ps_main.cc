// halka-ps: one shard of the central parameter server.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/daemon.h"
#include "server/parameter_server.h"

ABSL_FLAG(std::string, rendezvous, "127.0.0.1:7100",
          "rendezvous host:port (env HALKA_RENDEZVOUS)");
ABSL_FLAG(std::string, job, "default", "job id (env HALKA_JOB)");
ABSL_FLAG(std::string, listen, "127.0.0.1:7300",
          "host:port to serve on (env HALKA_LISTEN)");
ABSL_FLAG(std::string, advertise, "",
          "host:port workers dial; default: the listen address");
ABSL_FLAG(int, shard, 0, "this server's shard (env HALKA_SHARD)");
ABSL_FLAG(int, shards, 1, "number of shards (env HALKA_SHARDS)");
ABSL_FLAG(std::string, server_id, "", "id; default ps-<shard>");

int main(int argc, char** argv) {
  absl::Notification* stop = halka::StartDaemon(
      argc, argv,
      "halka-ps --rendezvous=HOST:PORT --job=ID "
      "--listen=HOST:PORT [--shard=K --shards=N]",
      "ps", &FLAGS_job);
  if (stop == nullptr) return 2;
  halka::PsOptions o;
  o.rendezvous = absl::GetFlag(FLAGS_rendezvous);
  o.job_id = absl::GetFlag(FLAGS_job);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.advertise = absl::GetFlag(FLAGS_advertise);
  o.shard = absl::GetFlag(FLAGS_shard);
  o.shards = absl::GetFlag(FLAGS_shards);
  o.server_id = absl::GetFlag(FLAGS_server_id);
  auto started = halka::ParameterServerNode::Start(o);
  if (!started.ok()) {
    halka::LogError(started.status().ToString());
    return 1;
  }
  std::unique_ptr<halka::ParameterServerNode> node = std::move(*started);
  std::cout << "halka-ps serving on " << node->address() << std::endl;
  stop->WaitForNotification();
  node->Shutdown();
  halka::ExitNow(0);
}
