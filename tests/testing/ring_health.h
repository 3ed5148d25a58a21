// Asks a rendezvous for a job's ring health (its members, pending ones
// included while the job forms, and what each is waiting for).
#ifndef HALKA_TESTS_TESTING_RING_HEALTH_H_
#define HALKA_TESTS_TESTING_RING_HEALTH_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "common/grpc_util.h"
#include "grpcpp/grpcpp.h"
#include "halka/v1/rendezvous.grpc.pb.h"

namespace halka::testing {

// GetRingHealth on the rendezvous at `rendezvous_address` (plaintext),
// bounded by 5 s. Errors: the call's (NOT_FOUND for an unknown job).
inline absl::StatusOr<v1::RingHealth> FetchRingHealth(
    const std::string& rendezvous_address, const std::string& job_id) {
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(
      rendezvous_address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::RingHealthRequest req;
  req.set_job_id(job_id);
  v1::RingHealth reply;
  grpc::Status s = stub->GetRingHealth(&ctx, req, &reply);
  if (!s.ok()) return FromGrpcStatus(s);
  return reply;
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_RING_HEALTH_H_
