// A Transport between ranks of one process, for tests of the algorithms
// without any networking. Payloads are copied on Send (so the sender's
// buffer is released at once), and delivered to the receiver's Inbox.
#ifndef HALKA_CORE_TESTING_INPROC_TRANSPORT_H_
#define HALKA_CORE_TESTING_INPROC_TRANSPORT_H_

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

 private:
  class Endpoint;
  const int world_size_;
  std::vector<std::unique_ptr<Inbox>> inboxes_;
  std::vector<std::unique_ptr<Transport>> transports_;
  mutable absl::Mutex mu_;
  std::vector<bool> dead_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(FrameMeta&)>> tamper_ ABSL_GUARDED_BY(mu_);
};

}  // namespace halka

#endif  // HALKA_CORE_TESTING_INPROC_TRANSPORT_H_
