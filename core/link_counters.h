// What one worker's peer links did: which path each took (shared memory,
// a wire connection, the gRPC stream), the frames that landed in place,
// the silent connections its wire listener closed, the wake-ups its
// inboxes missed (tests, diagnostics and the worker's /metrics).
//
// Each WorkerNode owns one and hands it, by shared_ptr, to everything that
// counts: its rings' transports (transport/grpc/grpc_transport.h) and inboxes, its
// peer service's wire readers, its wire listener. Workers sharing a process
// (LocalCluster, a trainer embedding a worker) count their own links only.
// Plain atomics: any thread, no lock.
#ifndef HALKA_CORE_LINK_COUNTERS_H_
#define HALKA_CORE_LINK_COUNTERS_H_

#include <atomic>
#include <cstdint>

namespace halka {

// Outbound links whose shared-memory offer the peer took or refused.
struct ShmLinkCounts {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> refused{0};
};

// Outbound links that took the wire, were refused it, or could not connect
// and stayed on gRPC; and the serving side's landed frames and evictions.
struct WireLinkCounts {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> fell_back{0};
  // Frames whose payload a wire reader put straight into an operation's
  // buffer (core/landing.h).
  std::atomic<uint64_t> landed{0};
  // Frames an operation's own thread read off a wire connection while it
  // waited (the reader's tap, transport/tcp/wire_link.h): no hand-off.
  std::atomic<uint64_t> tapped{0};
  // Connections to the wire listener that sat silent (no token) and were
  // closed to make room for a newer one.
  std::atomic<uint64_t> evicted{0};
  // Sending sockets of wire links that took another TCP congestion
  // control than the host's default (--wire_congestion), and those whose
  // asked-for one the kernel refused (they keep the host's).
  std::atomic<uint64_t> congestion_changed{0};
  std::atomic<uint64_t> congestion_refused{0};
};

struct LinkCounters {
  ShmLinkCounts shm;
  WireLinkCounts wire;
  // Sleeps of Inbox::Next on same-host rings that the clock ended although
  // a word had moved: wake-ups that were missed, or came just as the sleep
  // ran out.
  std::atomic<uint64_t> missed_wakeups{0};
  // Waits of Inbox::Next whose frame (or event) came while it yielded its
  // core before sleeping (Inbox::SetYieldBeforeSleep): no wake-up needed.
  std::atomic<uint64_t> waits_yielded{0};
  // Frames that left on a gRPC stream in one message behind another frame
  // (a batch: the peer agreed, the first was small; GrpcTransport).
  std::atomic<uint64_t> grpc_frames_batched{0};
};

}  // namespace halka

#endif  // HALKA_CORE_LINK_COUNTERS_H_
