// The two ends of a peer link's shared-memory data path (a ShmRing,
// core/shm_ring.h), as the gRPC transport uses them when both ends
// of a link run on the same host.
//
// Negotiation (transport/grpc/grpc_transport.cc): the dialling side creates a ring
// and offers it in the link's call metadata as "<name> <token> <netns>".
// The serving side maps it only if it runs in the same network namespace
// (workers in separate namespaces stand for separate hosts, e.g. the
// shaped-link experiments, and their traffic must cross those links) and
// the object is there with that token; it answers in its initial metadata
// "ok" or "no: <why>". Until the answer, the dialling side holds its
// frames; after it, every frame of that link takes one path, so frames
// stay in order. The gRPC stream stays open either way: its end is the
// link's end, and a refused or corrupt frame ends it with the error.
#ifndef HALKA_TRANSPORT_SHM_SHM_LINK_H_
#define HALKA_TRANSPORT_SHM_SHM_LINK_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/frame.h"
#include "core/link_counters.h"
#include "core/shm_ring.h"
#include "core/transport.h"
#include "transport/link_path.h"

namespace halka {

inline constexpr char kLinkShmOfferKey[] = "halka-shm-offer";
inline constexpr char kLinkShmAnswerKey[] = "halka-shm";

// The ring a link gets for frames of `chunk_bytes`: room for about four
// chunks (one record each), 1-64 MiB. 4.25 MiB for the default 1 MiB.
size_t LinkRingBytes(size_t chunk_bytes);
// The ring of a link that is not to the ring successor (fingerprints,
// aborts, naive operations): records up to 256 KiB, larger frames go in
// several.
inline constexpr size_t kSmallLinkRingBytes = size_t{1} << 20;
// What a rank offers on its link to each peer: the ring's data flows to
// its ring `successor` (LinkRingBytes; the rank after it in the ring's
// order, RingPath), every other link gets a small ring; null when
// same-host links are off.
std::function<size_t(int to)> LinkRingPolicy(bool enabled, size_t chunk_bytes,
                                             int successor);

// False when `address` ("host:port") is an IP literal that is not one of
// this network namespace's own addresses: that peer cannot share this
// host's /dev/shm in this namespace, so no ring is offered. True for
// loopback, for this namespace's addresses, and for host names (the peer
// then decides).
bool PeerMayShareHost(const std::string& address);


// The sending end: copies frames into the ring on the caller's thread when
// it has room and nothing is queued, else queues them for its writer
// thread, which writes them record by record as the receiver frees space.
// Thread-safe.
class ShmSender : public LinkPath {
 public:
  using Frame = OutFrame;
  explicit ShmSender(std::shared_ptr<ShmRing> ring);
  // Close(), then waits for the writer thread.
  ~ShmSender() override;

  // LinkPath: one frame with nothing queued is copied into the ring on
  // this thread when it has room (and released at once); anything else is
  // queued for the writer, which releases each frame once copied.
  void Send(std::vector<OutFrame> frames) override;
  // LinkPath: a queued frame the writer has begun (a frame larger than a
  // record) is copied; the others of the operation are dropped.
  void Withdraw(const OpId& op) override;
  // Closes the ring (the receiver drains what was written), stops the
  // writer, waits for it, and releases every queued frame.
  void Close() override;

 private:
  void WriterLoop();

  const std::shared_ptr<ShmRing> ring_;
  absl::Mutex mu_;
  struct Queued {
    Frame frame;
    size_t total = 0;
    size_t done = 0;
  };
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
};

// The receiving end: a thread that takes records off the ring, turns each
// frame into an InFrame (zero-copy for frames of one record; frames larger
// than a record are assembled on the heap), and hands it, or the error
// DecodeFrame found in it, to `on_frame`. An error from `on_frame` stops
// the ring and goes to `on_rejected`; a corrupt ring goes to `on_error`;
// either once. Stop() closes the ring, delivers what was written before it
// (no more: a sender that keeps writing cannot hold it), and joins.
//
// tap() lets an operation's thread take the records itself (Inbox::AddTap):
// the reader and the tap take turns under one lock, and the reader stands
// aside while the tap is attached, and between an operation's waits: once
// the tap was attached since its last look, it parks for a slice (5 ms)
// without announcing a sleep on the ring, so a record written meanwhile
// wakes no thread and the operation's next wait takes it; a slice with no
// attach, or a wait that leaves the ring to it (InboxTap::LeaveToReader),
// and it sleeps on the ring again. The callbacks may run on either thread
// (on_rejected and on_error with that lock released), never after Stop
// returns.
class ShmReceiver {
 public:
  using OnFrame = std::function<absl::Status(absl::StatusOr<InFrame>)>;
  using OnError = std::function<void(const absl::Status&)>;
  ShmReceiver(std::shared_ptr<ShmRing> ring, OnFrame on_frame,
              OnError on_rejected, OnError on_error);
  ~ShmReceiver();  // Stop()
  void Stop();
  std::shared_ptr<InboxTap> tap() const;
  // How long the reader stands aside between an operation's waits (5 ms
  // unless set; tests lengthen it). Any thread; the next slice takes it.
  void set_stand_aside(absl::Duration d);
  // How many times the reader has begun standing aside (tests).
  uint64_t stand_asides() const;

 private:
  class Tap;
  static void ReaderLoop(Tap& tap, ShmRing& ring);

  const std::shared_ptr<Tap> tap_;
  std::thread reader_;
};

}  // namespace halka

#endif  // HALKA_TRANSPORT_SHM_SHM_LINK_H_
