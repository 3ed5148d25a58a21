// Built by sdk_public_headers_test.sh alone, against the SDK's public
// headers (client/include, common/include) and libhalka_client: a trainer's
// program. It must compile without the generated protos or gRPC on its
// include path and link without any daemon library.
#include <cstdio>
#include <cstring>

#include "halka/client.h"
#include "halka/ring.h"
#include "halka/types.h"

int main() {
  // Connecting does not wait for the worker; a host buffer needs none.
  auto client = halka::Client::Connect("unix:/nonexistent/halka.sock");
  if (!client.ok()) {
    std::printf("connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<halka::HostBuffer> buf = (*client)->AllocateHostBuffer(4096);
  if (!buf.ok()) {
    std::printf("host buffer: %s\n", buf.status().ToString().c_str());
    return 1;
  }
  std::memset(buf->data(), 1, buf->size());
  // The ring's reports are plain structs.
  halka::RingHealth health;
  health.job_state = halka::JobState::kHealthy;
  health.members.push_back(halka::Member{});
  halka::WorkerInfo info;
  info.world_size = 1;
  std::printf("ok: %zu-byte host buffer, job %s, %d member(s)\n", buf->size(),
              halka::JobStateName(health.job_state), info.world_size);
  return 0;
}
