// halka-worker: one per GPU (or CPU process). Joins a job, links to its
// ring peers, and serves the SDK-facing API.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/daemon.h"
#include "seal/wire_seal.h"
#include "worker/worker_node.h"

ABSL_FLAG(std::string, rendezvous, "127.0.0.1:7100",
          "rendezvous host:port (env HALKA_RENDEZVOUS)");
ABSL_FLAG(std::string, job, "default", "job id (env HALKA_JOB)");
ABSL_FLAG(int, world_size, 1, "ranks in the job (env HALKA_WORLD_SIZE)");
ABSL_FLAG(int, min_world_size, 0,
          "elastic job: the ring runs with at least this many members "
          "(with --max_world_size; env HALKA_MIN_WORLD_SIZE)");
ABSL_FLAG(int, max_world_size, 0,
          "elastic job: at most this many members; 0 with "
          "--min_world_size 0: a fixed job of --world_size "
          "(env HALKA_MAX_WORLD_SIZE)");
ABSL_FLAG(int, rank, -1,
          "rank to ask for, e.g. a StatefulSet ordinal; -1: any "
          "(env HALKA_RANK)");
ABSL_FLAG(std::string, worker_id, "", "unique id; default hostname-pid "
          "(env HALKA_WORKER_ID)");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port for peer links and the TCP API (env HALKA_LISTEN)");
ABSL_FLAG(std::string, advertise, "",
          "host:port that peers dial; default: the listen address "
          "(env HALKA_ADVERTISE)");
ABSL_FLAG(std::string, host_id, "",
          "the host this worker runs on, as the rendezvous groups ranks: one "
          "host's ranks are adjacent in the ring. Default: the Kubernetes "
          "node ($NODE_NAME, downward API spec.nodeName), else "
          "hostname/network-namespace (env HALKA_HOST_ID)");
ABSL_FLAG(std::string, unix_socket, "",
          "also serve the API on this Unix socket (env HALKA_UNIX_SOCKET)");
ABSL_FLAG(int64_t, chunk_bytes, 1 << 20, "bytes per frame on the wire");
ABSL_FLAG(bool, shm_links, true,
          "carry peer links to workers on this host (same network "
          "namespace and /dev/shm) through shared memory; false: gRPC/TCP");
ABSL_FLAG(int64_t, shm_spin_us, -1,
          "microseconds a reader of a same-host ring (a link's reader, an "
          "operation waiting on its rings, a session) polls it before it "
          "sleeps (0-1000; 0: sleeps at once). -1 (auto): an operation "
          "polls 50 us where this host's ranks have a CPU each, and "
          "elsewhere yields its core between looks at its rings and wire "
          "sockets for 100 us before it sleeps");
ABSL_FLAG(bool, wire_tap, true,
          "an operation's thread reads its wire links' small frames (whole, "
          "at most 256 KiB) off their sockets itself while it waits; false: "
          "each link's reader thread hands every frame over");
ABSL_FLAG(std::string, wire_congestion, "system",
          "TCP congestion control of the wire links' sending sockets: "
          "system (the host's default), auto (the host's, except bbr on a "
          "link whose round trip is under 1 ms: then cubic, or reno where "
          "this process may not choose cubic; faster on clean links, far "
          "slower under random packet loss), or a name (cubic, reno, "
          "dctcp, ...). Chosen once a link is connected. The kernel may refuse a name not in "
          "net.ipv4.tcp_allowed_congestion_control to a process without "
          "CAP_NET_ADMIN: the links then keep the host's, and the worker "
          "logs it once");
ABSL_FLAG(bool, wire_landing, true,
          "wire links' readers write all-gather and broadcast chunks straight "
          "into the operation's buffer (no copy on the operation's thread); "
          "false: every chunk is copied there");
ABSL_FLAG(bool, wire_links, true,
          "carry peer links to other hosts on a TCP connection of their own "
          "(an ephemeral port on the listen host; frames sealed with "
          "AES-OCB under TLS) instead of the gRPC stream; false: gRPC");
ABSL_FLAG(int32_t, wire_port, 0,
          "the wire links' TCP port on the listen host (0: an ephemeral "
          "one); peers learn it on each link");
ABSL_FLAG(std::string, wire_ocb, "openssl",
          "which AES-128-OCB seals wire links under TLS: openssl (libcrypto's "
          "EVP) or vaes-512 (halka's own, opt-in: the worker refuses to "
          "start unless the CPU has VAES and AVX-512 and its known-answer "
          "self-test passes); both write the same bytes (env "
          "HALKA_WIRE_OCB)");
ABSL_FLAG(absl::Duration, op_timeout, halka::kDefaultOpTimeout,
          "default deadline of one operation (env HALKA_OP_TIMEOUT)");
ABSL_FLAG(int64_t, max_queued_bytes_per_peer, int64_t{1} << 30,
          "payload bytes one peer may have queued here that no operation has "
          "taken yet; past it the peer's link is closed and the operation "
          "fails RESOURCE_EXHAUSTED naming the peer (0: no bound)");
ABSL_FLAG(int64_t, max_queued_bytes, int64_t{4} << 30,
          "the same bound for all peers together (0: no bound)");
ABSL_FLAG(int64_t, max_inline_bytes, int64_t{16} << 30,
          "bytes that inline uploads in flight may hold in all; past it a "
          "call is RESOURCE_EXHAUSTED (env HALKA_MAX_INLINE_BYTES)");
ABSL_FLAG(std::string, default_algorithm, "auto",
          "all-reduce algorithm for calls that ask for auto: auto, ring, "
          "naive, ps, two_level, tree, recursive_doubling, halving_doubling "
          "(env HALKA_DEFAULT_ALGORITHM)");
ABSL_FLAG(int, device, -1,
          "CUDA device for device tensors; -1: device 0 if usable, else CPU "
          "(env HALKA_DEVICE)");
ABSL_FLAG(absl::Duration, join_timeout, absl::Seconds(120),
          "how long to wait for the job to form (env HALKA_JOIN_TIMEOUT)");

ABSL_FLAG(absl::Duration, test_reduce_delay, absl::ZeroDuration(),
          "FOR TESTS ONLY: sleep this long per received data chunk while "
          "reducing, to make this rank a straggler on purpose (e.g. 5ms)");

ABSL_FLAG(int, metrics_port, 0,
          "serve Prometheus /metrics over HTTP on this port once joined; 0: "
          "off (env HALKA_METRICS_PORT)");

ABSL_FLAG(absl::Duration, shm_sweep_interval, absl::Minutes(1),
          "remove the /dev/shm objects of client processes that are gone, at "
          "start and then this often; 0: never (env "
          "HALKA_SHM_SWEEP_INTERVAL)");

namespace {

// The worker's options as the flags give them (all but the algorithm,
// which main parses: it can be wrong).
halka::WorkerOptions OptionsFromFlags() {
  halka::WorkerOptions o;
  o.rendezvous = absl::GetFlag(FLAGS_rendezvous);
  o.job_id = absl::GetFlag(FLAGS_job);
  o.world_size = absl::GetFlag(FLAGS_world_size);
  o.min_world_size = absl::GetFlag(FLAGS_min_world_size);
  o.max_world_size = absl::GetFlag(FLAGS_max_world_size);
  o.requested_rank = absl::GetFlag(FLAGS_rank);
  o.worker_id = absl::GetFlag(FLAGS_worker_id);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.advertise = absl::GetFlag(FLAGS_advertise);
  o.unix_socket = absl::GetFlag(FLAGS_unix_socket);
  o.host_id = absl::GetFlag(FLAGS_host_id);
  o.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_bytes));
  o.shm_links = absl::GetFlag(FLAGS_shm_links);
  o.shm_spin = absl::Microseconds(absl::GetFlag(FLAGS_shm_spin_us));
  o.wire_links = absl::GetFlag(FLAGS_wire_links);
  o.wire_landing = absl::GetFlag(FLAGS_wire_landing);
  o.wire_tap = absl::GetFlag(FLAGS_wire_tap);
  o.wire_congestion = absl::GetFlag(FLAGS_wire_congestion);
  o.wire_port = absl::GetFlag(FLAGS_wire_port);
  o.op_timeout = absl::GetFlag(FLAGS_op_timeout);
  o.join_timeout = absl::GetFlag(FLAGS_join_timeout);
  o.max_queued_bytes_per_peer = static_cast<uint64_t>(
      std::max<int64_t>(absl::GetFlag(FLAGS_max_queued_bytes_per_peer), 0));
  o.max_queued_bytes = static_cast<uint64_t>(
      std::max<int64_t>(absl::GetFlag(FLAGS_max_queued_bytes), 0));
  o.max_inline_bytes =
      static_cast<uint64_t>(std::max<int64_t>(absl::GetFlag(FLAGS_max_inline_bytes), 0));
  o.cuda_device = absl::GetFlag(FLAGS_device);
  o.test_reduce_delay = absl::GetFlag(FLAGS_test_reduce_delay);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.shm_sweep_interval = absl::GetFlag(FLAGS_shm_sweep_interval);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  // Until the ring has formed there is nothing to leave or drain: a signal
  // during the (blocking) join ends the process at once.
  std::atomic<bool> joined{false};
  absl::Notification* stop = halka::StartDaemon(
      argc, argv,
      "halka-worker --rendezvous=HOST:PORT --job=ID "
      "--world_size=N [--listen=HOST:PORT] "
      "[--unix_socket=PATH]",
      "worker", &FLAGS_job, [&joined](int) {
        if (!joined.load()) std::_Exit(0);
      });
  if (stop == nullptr) return 2;
  // Process-wide and before any link (seal/wire_seal.h, DefaultEngine).
  absl::StatusOr<halka::WireSealEngine> engine =
      halka::ParseWireSealEngine(absl::GetFlag(FLAGS_wire_ocb));
  const absl::Status engine_ok =
      engine.ok() ? halka::WireSeal::SetDefaultEngine(*engine) : engine.status();
  if (!engine_ok.ok()) {
    halka::LogError(absl::StrCat("--wire_ocb: ", engine_ok.ToString()));
    return 2;
  }
  if (*engine == halka::WireSealEngine::kVaes512) {
    halka::LogInfo("wire links are sealed by vaes-512 (its self-test passed)");
  }
  halka::WorkerOptions o = OptionsFromFlags();
  auto algorithm = halka::ParseAlgorithm(absl::GetFlag(FLAGS_default_algorithm));
  if (!algorithm.ok()) {
    halka::LogError(algorithm.status().ToString());
    return 2;
  }
  o.default_algorithm = *algorithm;

  auto node = halka::WorkerNode::Create(o);
  if (!node.ok()) {
    halka::LogError(node.status().ToString());
    return 1;
  }
  // The process's own lines (the signal, a failed join) name the worker
  // too, as its node's do; the rank once it has one.
  const std::string tag = absl::StrCat("worker ", (*node)->options().worker_id);
  halka::SetLogTag(tag);
  // Two lines, two phases: "listening" once the port is bound (peers may
  // dial it; the API answers GetInfo with the phase), "serving" once the
  // worker is in its ring and operations can run.
  std::cout << "halka-worker listening on " << (*node)->address()
            << " (joining job " << o.job_id << " at " << o.rendezvous << ")"
            << std::endl;
  absl::Status status = (*node)->Join();
  if (!status.ok()) {
    halka::LogError(status.ToString());
    return 1;
  }
  joined = true;
  halka::SetLogTag(absl::StrCat(tag, " rank ", (*node)->rank()));
  std::cout << "halka-worker serving on " << (*node)->address() << std::endl;
  stop->WaitForNotification();
  (*node)->Shutdown();
  halka::ExitNow(0);
}
