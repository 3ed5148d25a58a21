// What a worker is started with (flags of halka-worker, fields of
// LocalCluster). Plain data; WorkerNode::Create validates it.
#ifndef HALKA_WORKER_WORKER_OPTIONS_H_
#define HALKA_WORKER_WORKER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "common/security.h"
#include "halka/types.h"
#include "core/frame.h"

namespace halka {

// WorkerOptions::shm_spin's automatic choice, and what it polls for.
inline constexpr absl::Duration kShmSpinAuto = absl::Microseconds(-1);
inline constexpr absl::Duration kShmAutoSpin = absl::Microseconds(50);
// And where it does not poll (ranks outnumber the CPUs): how long a waiting
// operation yields its core and looks again before it sleeps.
inline constexpr absl::Duration kShmAutoYield = absl::Microseconds(100);

struct WorkerOptions {
  std::string job_id = "default";
  std::string worker_id;          // default: hostname-pid
  int world_size = 1;
  // Elastic jobs: the ring runs with any size in [min, max] and re-forms
  // without the lost member. Both 0: a fixed job of world_size.
  int min_world_size = 0;
  int max_world_size = 0;
  int requested_rank = -1;        // -1: assigned by the rendezvous
  std::string rendezvous;         // host:port
  std::string listen = "127.0.0.1:0";  // peer links and TCP API
  std::string advertise;          // host:port peers dial; default from listen
  std::string unix_socket;        // optional extra API endpoint
  // The host it names when it joins (JoinRequest.host; one host's ranks
  // are adjacent in the ring). "": $NODE_NAME, else hostname/network
  // namespace (worker/host_identity.h).
  std::string host_id;
  size_t chunk_bytes = size_t{1} << 20;
  // Peer links to workers on this host (same network namespace, same
  // /dev/shm) carry their frames through shared memory
  // (transport/shm/shm_link.h); off: every link uses gRPC over TCP.
  bool shm_links = true;
  // How long this worker's readers of same-host rings (its links' rings,
  // its operations waiting on them, its SDK sessions' requests rings) poll
  // a ring before they sleep (ShmRing::set_spin_before_sleep,
  // Inbox::SetSpinBeforeSleep): this worker's own, also when workers share
  // a process. 0: they sleep at once. kShmSpinAuto (the default): an
  // operation waiting on its rings polls them for kShmAutoSpin where this
  // host's ranks of the ring are no more than the CPUs this process may
  // use (CpusOfThisProcess: its affinity, its cgroup's CPU quota; each can
  // have a core), yields its core (sched_yield) between looks at its
  // rings and wire sockets for kShmAutoYield before it sleeps where the
  // ranks outnumber the CPUs it may run on (OperationYield), and sleeps at
  // once where only a CPU quota leaves fewer; the links' readers and the
  // sessions sleep at once. Set to a value: that polling, and no yield.
  absl::Duration shm_spin = kShmSpinAuto;
  // For kShmSpinAuto: how many ranks of the ring share this machine's
  // cores; 0: this host's ranks as the ring's hosts say (LocalCluster sets
  // its worker count: its workers share one machine whatever hosts they
  // name).
  int machine_ranks = 0;
  // Peer links to other hosts carry their frames on a TCP connection of
  // their own (sealed with AES-OCB under TLS), not on the gRPC stream
  // (transport/tcp/wire_link.h); off: on the gRPC stream.
  bool wire_links = true;
  // Wire links' readers put payloads that an operation expects to copy
  // unchanged (all-gather and broadcast chunks) straight into its buffer
  // (core/landing.h); off: every payload is copied there.
  bool wire_landing = true;
  // The operation's thread reads its wire links' small frames itself while
  // it waits (WireReceiver::tap, Inbox::AddTap); off: their readers hand
  // every frame over.
  bool wire_tap = true;
  // The TCP congestion control of the wire links' sending sockets:
  // "system" (the host's, the default), "auto" (the host's, except bbr on
  // a link whose round trip is under 1 ms: cubic, or reno where cubic is
  // not allowed; faster on clean links, far slower under random loss), or
  // a name (ChooseCongestion, transport/tcp/wire_link.h).
  std::string wire_congestion = "system";
  // The wire links' listening port on the listen host (0: ephemeral).
  int wire_port = 0;
  absl::Duration op_timeout = kDefaultOpTimeout;
  absl::Duration join_timeout = absl::Seconds(120);
  uint64_t max_op_bytes = uint64_t{16} << 30;
  // Bytes that inline uploads (Worker.RunInline) in flight may hold in
  // all; a call whose data would pass it is RESOURCE_EXHAUSTED. Buffers
  // grow as data arrives, never from the request's count up front.
  uint64_t max_inline_bytes = uint64_t{16} << 30;
  // Payload bytes received from peers and not yet taken by an operation,
  // at most per peer and in all (Inbox::ByteBudget): past either, the
  // peer's link is closed and the operation fails RESOURCE_EXHAUSTED
  // naming it. 0: no bound.
  uint64_t max_queued_bytes_per_peer = uint64_t{1} << 30;
  uint64_t max_queued_bytes = uint64_t{4} << 30;
  std::string device = "cpu";   // reported to the rendezvous
  // CUDA device for device tensors: -1 picks device 0 when one is usable
  // (and falls back to the CPU with one log line when not); >= 0 demands it.
  int cuda_device = -1;
  // What an all-reduce that asks for AUTO runs.
  Algorithm default_algorithm = Algorithm::kAuto;
  // FOR TESTS ONLY: sleep this long per received data chunk while reducing,
  // to make this rank a straggler on purpose.
  absl::Duration test_reduce_delay = absl::ZeroDuration();
  // > 0: serve Prometheus /metrics over HTTP on this port (on the listen
  // host) once joined; -1 picks a free port; 0: off.
  int metrics_port = 0;
  // TLS and the job token of this worker's servers, channels and wire
  // links (common/security.h). Unset: the process's configuration
  // (GetSecurityConfig) when the worker is created; WorkerNode::Create
  // captures it here, so a later SetSecurityConfig (another worker's
  // LocalCluster in this process) changes nothing of this worker's.
  std::optional<SecurityConfig> security;
  // Sweeps /dev/shm at start and then this often for the objects of client
  // processes that are gone (worker/shm_reaper.h); zero: never.
  absl::Duration shm_sweep_interval = absl::Minutes(1);
};

}  // namespace halka

#endif  // HALKA_WORKER_WORKER_OPTIONS_H_
