// A trainer's view of halka: average gradients across the ring.
//
//   halka_allreduce_example                 # embedded 4-worker ring
//   halka_allreduce_example 127.0.0.1:7201  # the local halka-worker
#include <cstdio>
#include <vector>

#include "halka/client.h"
#include "halka/local_cluster.h"

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return 1;
}

int main(int argc, char** argv) {
  std::unique_ptr<halka::LocalCluster> cluster;
  std::string worker;
  if (argc > 1) {
    worker = argv[1];
  } else {
    auto started = halka::LocalCluster::Start({});  // 4 workers
    if (!started.ok()) return Fail(started.status());
    cluster = std::move(*started);
    worker = cluster->worker_address(0);
  }
  auto client = halka::Client::Connect(worker);
  if (!client.ok()) return Fail(client.status());

  // Gradients in shared memory: the worker reduces them in place.
  auto buffer = (*client)->AllocateHostBuffer(1000 * sizeof(float));
  if (!buffer.ok()) return Fail(buffer.status());
  absl::Span<float> grads = buffer->as<float>().subspan(0, 1000);
  for (float& g : grads) g = 1.0f;

  if (cluster) {
    // In a real job every trainer calls AllReduce from its own process; here
    // the other three ranks of the embedded ring join from threads.
    std::vector<std::future<absl::StatusOr<halka::OpInfo>>> others;
    std::vector<std::vector<float>> theirs(3, std::vector<float>(1000, 3.0f));
    std::vector<std::unique_ptr<halka::Client>> peers;
    for (int r = 1; r < 4; ++r) {
      auto peer = cluster->Connect(r);
      if (!peer.ok()) return Fail(peer.status());
      peers.push_back(std::move(*peer));
      others.push_back(peers.back()->AllReduceAsync(absl::MakeSpan(theirs[r - 1]),
                                                    halka::ReduceOp::kAvg));
    }
    auto info = (*client)->AllReduce(grads, halka::ReduceOp::kAvg);
    for (auto& f : others) f.get().IgnoreError();
    if (!info.ok()) {
      std::fprintf(stderr, "all-reduce failed: %s\n", info.status().ToString().c_str());
      return 1;
    }
    std::printf("rank %d of %d: grads[0] = %g (expected (1+3+3+3)/4 = 2.5), "
                "%llu bytes sent\n", info->rank, info->world_size, grads[0],
                static_cast<unsigned long long>(info->bytes_sent));
    return grads[0] == 2.5f ? 0 : 1;
  }
  auto info = (*client)->AllReduce(grads, halka::ReduceOp::kAvg);
  if (!info.ok()) {
    std::fprintf(stderr, "all-reduce failed: %s\n", info.status().ToString().c_str());
    return 1;
  }
  std::printf("rank %d of %d: grads[0] = %g\n", info->rank, info->world_size,
              grads[0]);
  return 0;
}
