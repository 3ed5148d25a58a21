// The SDK-facing gRPC API of a worker (halka.v1.Worker): Run (shared
// memory or a device tensor), RunInline (the tensor streamed in and out),
// GetInfo, GetRingHealth. A thin adapter over WorkerNode's public methods:
// it checks requests (op_request.h), moves bytes, and maps statuses.
//
// Threads: synchronous gRPC handlers; an operation blocks its handler
// thread, and WorkerNode serialises operations.
#ifndef HALKA_WORKER_WORKER_SERVICE_H_
#define HALKA_WORKER_WORKER_SERVICE_H_

#include "common/grpc_util.h"
#include "halka/v1/worker.grpc.pb.h"
#include "worker/shm_cache.h"

namespace halka {

class WorkerNode;

class WorkerService final : public v1::Worker::Service {
 public:
  // `node` must outlive the service.
  explicit WorkerService(WorkerNode* node) : node_(node) {}

  grpc::Status Run(grpc::ServerContext* ctx, const v1::RunRequest* req,
                   v1::RunReply* reply) override;
  grpc::Status RunInline(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::InlineReply, v1::InlineRequest>* stream)
      override;
  grpc::Status GetInfo(grpc::ServerContext* ctx, const v1::InfoRequest* req,
                       v1::InfoReply* reply) override;
  grpc::Status GetRingHealth(grpc::ServerContext* ctx,
                             const v1::RingHealthRequest* req,
                             v1::RingHealth* reply) override;

 private:
  WorkerNode* const node_;
  // Each inline stream holds a whole tensor: bounded per connection and
  // in all.
  StreamLimiter inline_streams_{"inline operation", 16, 256};
  ShmCache shm_;
};

}  // namespace halka

#endif  // HALKA_WORKER_WORKER_SERVICE_H_
