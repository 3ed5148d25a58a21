#include "halka/embedded.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "server/rendezvous_service.h"
#include "worker/worker_node.h"

namespace halka {

absl::StatusOr<std::unique_ptr<EmbeddedRendezvous>> EmbeddedRendezvous::Start(
    const std::string& listen) {
  KeepGrpcForTheProcess();
  auto server = RendezvousServer::Start(listen);
  if (!server.ok()) return server.status();
  std::unique_ptr<EmbeddedRendezvous> r(new EmbeddedRendezvous());
  r->server_ = std::move(*server);
  return r;
}

EmbeddedRendezvous::~EmbeddedRendezvous() = default;

const std::string& EmbeddedRendezvous::address() const {
  return server_->address();
}

absl::StatusOr<std::unique_ptr<EmbeddedWorker>> EmbeddedWorker::Start(
    const Options& options) {
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedded worker: rank ", options.rank, " is not in [0, ",
        options.world_size, ")"));
  }
  TuneProcessForStreaming();
  KeepGrpcForTheProcess();
  WorkerOptions wo;
  wo.job_id = options.job_id;
  wo.worker_id = absl::StrCat(options.job_id, "-rank-", options.rank);
  wo.world_size = options.world_size;
  wo.requested_rank = options.rank;
  wo.rendezvous = options.rendezvous;
  wo.listen = options.listen;
  wo.op_timeout = options.op_timeout;
  wo.join_timeout = options.join_timeout;
  auto node = WorkerNode::Start(wo);
  if (!node.ok()) return node.status();
  std::unique_ptr<EmbeddedWorker> w(new EmbeddedWorker());
  w->node_ = std::move(*node);
  return w;
}

EmbeddedWorker::~EmbeddedWorker() = default;

const std::string& EmbeddedWorker::address() const { return node_->address(); }

int EmbeddedWorker::rank() const { return node_->rank(); }

}  // namespace halka
