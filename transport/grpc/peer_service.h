// The serving side of peer links: Peer.Link streams, and the same-host
// (shared memory) and wire (TCP) paths their dialling side offers. The
// dialling side is GrpcTransport (transport/grpc/grpc_transport.h).
#ifndef HALKA_TRANSPORT_GRPC_PEER_SERVICE_H_
#define HALKA_TRANSPORT_GRPC_PEER_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "grpcpp/grpcpp.h"
#include "halka/v1/peer.grpc.pb.h"
#include "core/link_counters.h"
#include "core/transport.h"
#include "transport/path_offer.h"
#include "transport/paths.h"

namespace halka {

// Serves Peer.Link: validates each stream's metadata and each frame, and
// delivers frames to the Inbox of the stream's generation. Frames that fail
// validation end the stream with DATA_LOSS and are reported as a link
// failure.
class PeerService final
    : public v1::Peer::WithRawCallbackMethod_Link<v1::Peer::Service> {
 public:
  // The inbox for a stream of `generation` (a ring's generation, or a
  // future one this worker has not switched to yet); an error refuses the
  // stream with it (e.g. ABORTED for a generation that is over).
  using InboxResolver =
      std::function<absl::StatusOr<std::shared_ptr<Inbox>>(uint64_t)>;
  // What the service takes from its worker (transport/paths.h: which
  // paths it takes, and how).
  using Options = AcceptSetup;
  PeerService(std::string job_id, InboxResolver resolver, Options options);

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Link(
      grpc::CallbackServerContext* context) override;

  // Number of inbound streams open now (for leak tests).
  int open_streams() const;

 private:
  class InLink;
  const std::string job_id_;
  const InboxResolver resolver_;
  // The path kinds this worker takes, fastest first (MakePathAcceptors).
  const std::vector<std::unique_ptr<PathAcceptor>> acceptors_;
  const bool frame_batches_;  // AcceptSetup::frame_batches
  // A ring needs one inbound stream per peer and generation (naive: per
  // peer pair), and old generations' streams close.
  StreamLimiter limiter_{"peer link", 64, 4096};
  mutable absl::Mutex mu_;
  int open_streams_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace halka

#endif  // HALKA_TRANSPORT_GRPC_PEER_SERVICE_H_
