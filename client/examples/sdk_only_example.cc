// The smallest trainer: links halka::client alone (no worker, rendezvous or
// parameter-server code) and averages a gradient with the other ranks
// through the local halka-worker.
//
//   halka_sdk_only_example [WORKER]   # default 127.0.0.1:7200
//
// Every rank of the job runs it at the same time; exit status 0 when the
// all-reduce succeeded.
#include <cstdio>
#include <string>
#include <vector>

#include "halka/client.h"

int main(int argc, char** argv) {
  const std::string worker = argc > 1 ? argv[1] : "127.0.0.1:7200";
  absl::StatusOr<std::unique_ptr<halka::Client>> client =
      halka::Client::Connect(worker);
  absl::Status status = client.status();
  if (status.ok()) {
    std::vector<float> grads(1024, 1.0f);
    absl::StatusOr<halka::OpInfo> info =
        (*client)->AllReduce(absl::MakeSpan(grads), halka::ReduceOp::kAvg);
    status = info.status();
    if (status.ok()) {
      std::printf("rank %d of %d: grads[0] = %g\n", info->rank,
                  info->world_size, grads[0]);
    }
  }
  if (!status.ok()) {
    std::fprintf(stderr, "all-reduce via %s failed: %s\n", worker.c_str(),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
