// One way a peer link's frames travel once the link has chosen it, and the
// one rule both ends use to choose.
//
// A link always starts as a gRPC stream (transport/grpc/grpc_transport.h,
// transport/grpc/peer_service.h). With its first call the dialling end offers the
// faster paths it can (a shared-memory ring, transport/shm/shm_link.h; a TCP wire
// connection, transport/tcp/wire_link.h), the serving end answers what it could
// take, and ChoosePath, applied by both ends to the same facts, picks one.
// From then on every frame of the link takes that path, so frames stay in
// order; the gRPC stream stays open either way, and its end is the link's.
//
// A path's sending end is a LinkPath: it takes frames (OutFrame, the
// neutral encoded frame of core/frame.h: head and payload as byte spans)
// and releases each one exactly once. The gRPC stream is the path every link can fall back
// to, and the transport drives it itself (it is the stream).
#ifndef HALKA_TRANSPORT_LINK_PATH_H_
#define HALKA_TRANSPORT_LINK_PATH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "core/frame.h"  // OutFrame, ReleaseOnce

namespace halka {

class LinkPath {
 public:
  virtual ~LinkPath() = default;
  // Takes `frames`, in order, behind every frame taken before. Each
  // frame's on_released runs exactly once, on any thread (possibly inside
  // Send, never under the caller's locks it does not know of): when its
  // bytes have been copied or written, or when the path drops it (closed,
  // failed). Never waits for the peer.
  virtual void Send(std::vector<OutFrame> frames) = 0;
  void SendOne(OutFrame frame) {
    std::vector<OutFrame> one;
    one.push_back(std::move(frame));
    Send(std::move(one));
  }
  // Operation `op` failed: its data frames (OutFrame::data) that no
  // byte of has gone out are dropped (released, never sent), and one the
  // path is part way through is detached (DetachPayload) and finished, so
  // that the operation's buffer is free at once and what follows (its
  // ABORT) is not stuck behind frames nobody will use. Other frames keep
  // their order. Never from a frame's on_released.
  virtual void Withdraw(const OpId& op) = 0;
  // Ends the path: a frame being written may be cut, the rest are
  // released. Idempotent; never from a frame's on_released.
  virtual void Close() = 0;
};

// The paths a link can take, fastest first.
enum class PathKind { kShm, kWire, kGrpc };

}  // namespace halka

#endif  // HALKA_TRANSPORT_LINK_PATH_H_
