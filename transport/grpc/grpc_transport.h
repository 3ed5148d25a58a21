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

namespace halka {

class WireFallbacks;

class GrpcTransport : public Transport {
 public:
  // What the links take from their worker (RingBook::Build fills it from
  // the node's options and state; nothing here is read from the process).
  struct LinkSetup {
    // The ring to offer on the link to `to`; null or 0: no same-host link.
    std::function<size_t(int to)> shm_ring_bytes;
    // Offer peers a wire connection per link (transport/tcp/wire_link.h).
    bool wire_links = false;
    // The channels' TLS and job token (MakeChannel); a wire link is sealed
    // where it is client_tls() (its key then travels inside TLS).
    SecurityConfig security;
    // The worker's link counters and wire fallbacks (null: the transport's
    // own, as in tests).
    std::shared_ptr<LinkCounters> counters;
    std::shared_ptr<WireFallbacks> wire_fallbacks;
  };
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
  void Withdraw(uint64_t op_seq) override;
  void Reset(int to) override;

 private:
  class OutLink;
  std::shared_ptr<OutLink> LinkTo(int to);

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
};

}  // namespace halka

#endif  // HALKA_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
