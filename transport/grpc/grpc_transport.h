// The Transport over gRPC: one long-lived bidirectional Peer.Link stream
// per destination rank, opened on first use and reopened after a failure.
//
// Threading: Send enqueues and returns; the stream's reactor writes one
// frame at a time (gRPC allows one write in flight per stream) from gRPC's
// callback threads, and never blocks there. Stream failures reach the Inbox
// as LinkFailed(rank). Inbound streams are served by PeerService
// (transport/grpc/peer_service.h).
//
// Same-host links (shm_ring_bytes(to) > 0, see LinkRingPolicy): a link to
// a peer that runs on this host, in this network namespace, carries its
// frames through a shared-memory ring instead (transport/shm/shm_link.h); other
// links, with wire_links, on a TCP connection of their own
// (transport/tcp/wire_link.h). Either way the gRPC stream stays open as the
// link's liveness and error channel. Parameter-server streams always use
// gRPC.
#ifndef HALKA_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
#define HALKA_TRANSPORT_GRPC_GRPC_TRANSPORT_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "grpcpp/grpcpp.h"
#include "halka/v1/peer.grpc.pb.h"
#include "core/link_counters.h"
#include "core/transport.h"
#include "transport/paths.h"

namespace halka {

class GrpcTransport : public Transport {
 public:
  // What the links take from their worker (transport/paths.h).
  using LinkSetup = halka::LinkSetup;
  // addresses[i] is rank i's peer server.
  GrpcTransport(std::string job_id, uint64_t generation, int rank,
                std::vector<std::string> addresses, Inbox* inbox,
                LinkSetup links);
  // Cancels every link and waits until their reactors are done.
  ~GrpcTransport() override;

  // Parameter-server shards, reachable as ranks world_size + k. Replaces
  // earlier ones (and their links).
  void SetServerAddresses(std::vector<std::string> addresses);

  absl::Status Send(int to, const FrameMeta& meta,
                    absl::Span<const uint8_t> payload,
                    std::function<void()> on_released) override;
  // Every link's own frames of the operation (OutLink::Withdraw).
  void Withdraw(const OpId& op) override;
  void Reset(int to) override;
  // Held writes stay in their link's queue; the outermost ReleaseWrites
  // starts them, a link whose peer agreed to batches sending the held
  // frames together (kBatchJoinBytes in grpc_transport.cc).
  void HoldWrites() override;
  void ReleaseWrites() override;

 private:
  class OutLink;
  std::shared_ptr<OutLink> LinkTo(int to);
  bool holding() const { return holds_.load() > 0; }

  const std::string job_id_;
  const uint64_t generation_;
  const int rank_;
  const std::vector<std::string> addresses_;  // ranks 0..G-1
  Inbox* const inbox_;
  const LinkSetup setup_;  // its counters and wire_fallbacks never null

  absl::Mutex mu_;
  std::vector<std::string> servers_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::shared_ptr<OutLink>> links_ ABSL_GUARDED_BY(mu_);
  // Links that were replaced or reset but whose reactor is not done yet.
  std::vector<std::shared_ptr<OutLink>> retired_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> holds_{0};  // HoldWrites not yet released
};

}  // namespace halka

#endif  // HALKA_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
