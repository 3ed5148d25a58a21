// A Transport between ranks of one process, for tests of the algorithms
// without any networking. Payloads are copied on Send (so the sender's
// buffer is released at once), and delivered to the receiver's Inbox.
#ifndef HALKA_CORE_TESTING_INPROC_TRANSPORT_H_
#define HALKA_CORE_TESTING_INPROC_TRANSPORT_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/transport.h"

namespace halka {

class InProcNetwork {
 public:
  explicit InProcNetwork(int world_size);

  Inbox* inbox(int rank) { return inboxes_[static_cast<size_t>(rank)].get(); }
  Transport* transport(int rank) {
    return transports_[static_cast<size_t>(rank)].get();
  }

  // Fault injection: a killed rank's links fail in both directions, and
  // its neighbours' inboxes are told.
  void Kill(int rank);
  bool IsDead(int rank) const;
  // Fault injection: calls `mutate` on every frame sent from `from` before
  // delivery.
  void SetTamper(int from, std::function<void(FrameMeta&)> mutate);
  // Fault injection: a frame for which `hold(from, to, meta)` is true stays
  // on its way until ReleaseHeld delivers every held frame, in the order
  // they were sent (frames not held pass them: the link's order is not
  // kept). `hold` runs under the network's lock: it must not call back
  // into the network.
  using HoldFn = std::function<bool(int from, int to, const FrameMeta& meta)>;
  void SetHold(HoldFn hold);
  void ReleaseHeld();
  // Frames `rank`'s transport kept under HoldWrites and sent at
  // ReleaseWrites, so far.
  size_t WritesHeld(int rank) const;

 private:
  class Endpoint;
  const int world_size_;
  std::vector<std::unique_ptr<Inbox>> inboxes_;
  std::vector<std::unique_ptr<Transport>> transports_;
  mutable absl::Mutex mu_;
  std::vector<bool> dead_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(FrameMeta&)>> tamper_ ABSL_GUARDED_BY(mu_);
  struct Held {
    int from;
    int to;
    InFrame frame;
  };
  HoldFn hold_ ABSL_GUARDED_BY(mu_);
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> writes_held_ ABSL_GUARDED_BY(mu_);
  // Hands `frame` to `to`'s inbox (a refused frame breaks the link).
  void Deliver(int from, int to, InFrame frame);
};

}  // namespace halka

#endif  // HALKA_CORE_TESTING_INPROC_TRANSPORT_H_
