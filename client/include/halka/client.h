// halka's C++ SDK: all-reduce, all-gather, reduce-scatter, broadcast and
// barrier through the local halka-worker.
//
//   auto client = halka::Client::Connect("127.0.0.1:7200").value();
//   std::vector<float> grads = ...;
//   auto info = client->AllReduce(absl::MakeSpan(grads), halka::ReduceOp::kAvg);
//   if (!info.ok()) { /* the status names the peer, phase and step */ }
//
// Transfer: on the same host the tensor reaches the worker through shared
// memory that both processes map: zero copies for buffers from
// AllocateHostBuffer, one memcpy each way for any other span. Elsewhere (or
// with Transfer::kInline) it streams inline through the worker's gRPC API.
//
// Errors (absl::Status): INVALID_ARGUMENT (bad request),
// FAILED_PRECONDITION (ranks disagree; names both), UNAVAILABLE (a peer or
// the worker is unreachable; names it), DEADLINE_EXCEEDED (names what was
// awaited), ABORTED (membership changed), DATA_LOSS (corrupt frame),
// RESOURCE_EXHAUSTED (too large).
// Thread-safety: a Client may be shared by threads; the worker runs one
// operation at a time, in arrival order.
#ifndef HALKA_CLIENT_CLIENT_H_
#define HALKA_CLIENT_CLIENT_H_

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "halka/ring.h"
#include "halka/types.h"

namespace halka {

// The DType of a span's element type (Half, BFloat16: halka/types.h).
template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::kInt8; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kUInt8; };
template <> struct DTypeOf<int16_t> { static constexpr DType value = DType::kInt16; };
// One byte, 0 or 1 (the SDK checks sizeof(bool) == 1 below).
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };
static_assert(sizeof(bool) == 1, "halka's bool is one byte");

struct OpOptions {
  // Deadline of the operation; zero: the worker's default (normally
  // kDefaultOpTimeout).
  absl::Duration timeout = absl::ZeroDuration();
  // kAuto lets the worker choose. All-reduce: recursive doubling or tree
  // for small buffers; two-level on hosts of equal size >= 2, else
  // recursive doubling up to 256 KiB on at most 16 ranks (not two on one
  // host) and the ring, for larger ones. Reduce-scatter and all-gather: two-level on such
  // hosts, else the ring. Broadcast: the tree (hosts' leaders, then inside
  // each host) up to one chunk on 3 ranks or more, else the chain (kRing).
  // The others force one (a collective that does not
  // implement it is refused, UNIMPLEMENTED).
  Algorithm algorithm = Algorithm::kAuto;
  // A collective of a group of the job's ranks (torch's new_group): the
  // job ranks in the group's order, this rank's among them; every member
  // passes the same list. The call's roots, slices and world are then the
  // group's (OpInfo::rank and world_size too), its operations are numbered
  // by the group and run beside the job's collectives (and other groups'),
  // one at a time: a client issues a group's calls one after another.
  // Host memory only; not for Send and Recv. Empty: the whole job.
  std::vector<int> group;
  // Tells apart groups of the same ranks (each with its own numbering and
  // order of calls): every member of a group passes the same tag.
  uint64_t group_tag = 0;
};

// What one operation did, as this rank saw it.
struct OpInfo {
  uint64_t op_seq = 0;
  std::string algorithm;
  uint64_t bytes_sent = 0;      // payload bytes this rank put on the wire
  uint64_t bytes_received = 0;
  double seconds = 0;           // inside the worker
  int rank = 0;
  int world_size = 0;
  uint64_t generation = 0;
  bool zero_copy = false;       // the worker reduced the caller's memory
  std::string transfer;         // "shm", "shm-staged", "inline" or
                                // "in-process"
  bool session = false;         // sent through the shared-memory session
  int peer = -1;                // Send: the rank it went to; Recv: from
  // What the job's link model predicted for the algorithm that ran
  // (halka-rendezvous --link_model), in seconds; 0: no model or no
  // prediction.
  double model_seconds = 0;
};

// Host memory shared with the local worker: collectives on it copy nothing.
// Movable, not copyable; unmaps and unlinks on destruction.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  ~HostBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  absl::Span<T> as() const {
    return absl::Span<T>(static_cast<T*>(data_), size_ / sizeof(T));
  }

 private:
  friend class Client;
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  std::shared_ptr<void> registry_;  // the client's list of shared regions
};

class Client {
 public:
  enum class Transfer { kAuto, kSharedMemory, kInline };
  struct Options {
    Transfer transfer = Transfer::kAuto;
    // With a worker on this host (shared memory in use): send operations
    // through a session of two shared-memory rings instead of one gRPC
    // call each (Worker.Session; about half the latency of a small
    // operation). Falls back to one call each where the worker refuses or
    // lacks sessions, and for calls made while another thread's call
    // holds the session.
    bool session = true;
    // How long a call through the session polls the replies ring before it
    // sleeps on it (0-1 ms; 0: it sleeps at once). Pays only on a host
    // with idle cores; the worker's --shm_spin_us is the worker side's.
    absl::Duration shm_spin = absl::ZeroDuration();
    // With the worker in this very process (EmbeddedWorker, LocalCluster,
    // halka.torch's embedded worker) and transfer kAuto: run each call on
    // the caller's thread, over the caller's buffer (no session, no gRPC
    // call, no copy into shared memory; OpInfo.transfer "in-process").
    // Off: the calls take the paths a worker in another process would.
    bool in_process = true;
  };

  // `target`: "host:port" or "unix:/path" of the local worker. Connecting
  // does not wait for the worker; the first call does (bounded).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& target, Options options);
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& target) {
    return Connect(target, Options());
  }
  ~Client();

  // In place: on success every rank's buffer holds the same bits.
  absl::StatusOr<OpInfo> AllReduce(void* data, size_t count, DType dtype,
                                   ReduceOp op, OpOptions options = {});
  template <typename T>
  absl::StatusOr<OpInfo> AllReduce(absl::Span<T> data, ReduceOp op,
                                   OpOptions options = {}) {
    return AllReduce(data.data(), data.size(), DTypeOf<T>::value, op, options);
  }
  // The span must stay alive and untouched until the future is ready.
  template <typename T>
  std::future<absl::StatusOr<OpInfo>> AllReduceAsync(absl::Span<T> data,
                                                     ReduceOp op,
                                                     OpOptions options = {}) {
    return std::async(std::launch::async, [this, data, op, options] {
      return AllReduce(data, op, options);
    });
  }

  // All-gather: every rank contributes send_count elements; on success
  // recv (recv_count elements) holds rank r's contribution at
  // [r*send_count, (r+1)*send_count) on every rank, bit for bit. recv_count
  // must be world x send_count, else INVALID_ARGUMENT naming the ring's
  // world. In place when send == recv + rank*send_count elements. Each rank
  // sends (G-1)/G of recv. Zero copy when recv lies in a HostBuffer (the
  // contribution is then moved there first, unless in place).
  absl::StatusOr<OpInfo> AllGather(const void* send, size_t send_count,
                                   void* recv, size_t recv_count, DType dtype,
                                   OpOptions options = {});
  template <typename S, typename T>
  absl::StatusOr<OpInfo> AllGather(absl::Span<S> send, absl::Span<T> recv,
                                   OpOptions options = {}) {
    static_assert(std::is_same_v<std::remove_const_t<S>, T>,
                  "send and recv must have the same element type");
    return AllGather(send.data(), send.size(), recv.data(), recv.size(),
                     DTypeOf<T>::value, options);
  }
  // Both spans must stay alive (and send unchanged) until the future is
  // ready.
  template <typename S, typename T>
  std::future<absl::StatusOr<OpInfo>> AllGatherAsync(absl::Span<S> send,
                                                     absl::Span<T> recv,
                                                     OpOptions options = {}) {
    return std::async(std::launch::async, [this, send, recv, options] {
      return AllGather(send, recv, options);
    });
  }

  // Reduce-scatter: send holds send_count = world x recv_count elements; on
  // success rank r's recv holds the element-wise reduction (op; AVG divides
  // by the world) over all ranks of elements [r*recv_count,
  // (r+1)*recv_count). send_count must be world x recv_count, else
  // INVALID_ARGUMENT naming the world. recv may alias send + rank *
  // recv_count; send is otherwise left unchanged (the worker reduces a
  // staged copy, so this is never zero copy). Each rank sends (G-1)/G of
  // send.
  absl::StatusOr<OpInfo> ReduceScatter(const void* send, size_t send_count,
                                       void* recv, size_t recv_count,
                                       DType dtype, ReduceOp op,
                                       OpOptions options = {});
  template <typename S, typename T>
  absl::StatusOr<OpInfo> ReduceScatter(absl::Span<S> send, absl::Span<T> recv,
                                       ReduceOp op, OpOptions options = {}) {
    static_assert(std::is_same_v<std::remove_const_t<S>, T>,
                  "send and recv must have the same element type");
    return ReduceScatter(send.data(), send.size(), recv.data(), recv.size(),
                         DTypeOf<T>::value, op, options);
  }
  template <typename S, typename T>
  std::future<absl::StatusOr<OpInfo>> ReduceScatterAsync(
      absl::Span<S> send, absl::Span<T> recv, ReduceOp op,
      OpOptions options = {}) {
    return std::async(std::launch::async, [this, send, recv, op, options] {
      return ReduceScatter(send, recv, op, options);
    });
  }

  // Reduce to `root`: every rank contributes `count` elements of send; on
  // success the root's recv holds their element-wise reduction (op; AVG
  // divides by the world). recv is written on the root only and may be
  // null elsewhere (INVALID_ARGUMENT, after the call, on a root whose recv
  // is null); it may alias send; send is never changed (the worker reduces
  // a staged copy). Small buffers (auto: up to the worker's eager size)
  // go straight to the root; larger ones take a ring reduce-scatter and
  // then each rank's reduced part to the root (algorithm ring or naive to
  // force either).
  absl::StatusOr<OpInfo> Reduce(const void* send, void* recv, size_t count,
                                DType dtype, ReduceOp op, int root,
                                OpOptions options = {});
  template <typename S, typename T>
  absl::StatusOr<OpInfo> Reduce(absl::Span<S> send, absl::Span<T> recv,
                                ReduceOp op, int root,
                                OpOptions options = {}) {
    static_assert(std::is_same_v<std::remove_const_t<S>, T>,
                  "send and recv must have the same element type");
    return Reduce(send.data(), recv.data(), send.size(), DTypeOf<T>::value,
                  op, root, options);
  }

  // Gather to `root`: every rank contributes send_count elements; on
  // success the root's recv (recv_count = world x send_count elements, on
  // every rank) holds rank r's at [r*send_count, (r+1)*send_count). recv
  // is significant on the root only: elsewhere it may be null, and where
  // it is given it may receive this rank's own contribution (zero copy
  // from a HostBuffer stages it there) but nobody else's. In place when
  // send == recv + rank*send_count elements. Each rank sends its
  // contribution straight to the root.
  absl::StatusOr<OpInfo> Gather(const void* send, size_t send_count,
                                void* recv, size_t recv_count, DType dtype,
                                int root, OpOptions options = {});
  template <typename S, typename T>
  absl::StatusOr<OpInfo> Gather(absl::Span<S> send, absl::Span<T> recv,
                                int root, OpOptions options = {}) {
    static_assert(std::is_same_v<std::remove_const_t<S>, T>,
                  "send and recv must have the same element type");
    return Gather(send.data(), send.size(), recv.data(), recv.size(),
                  DTypeOf<T>::value, root, options);
  }

  // Scatter from `root`: the root's send holds send_count = world x
  // recv_count elements (send_count the same on every rank); on success
  // rank r's recv holds the root's [r*recv_count, (r+1)*recv_count). send
  // is read on the root only and may be null elsewhere. The root sends
  // each rank its slice straight.
  absl::StatusOr<OpInfo> Scatter(const void* send, size_t send_count,
                                 void* recv, size_t recv_count, DType dtype,
                                 int root, OpOptions options = {});
  template <typename S, typename T>
  absl::StatusOr<OpInfo> Scatter(absl::Span<S> send, absl::Span<T> recv,
                                 int root, OpOptions options = {}) {
    static_assert(std::is_same_v<std::remove_const_t<S>, T>,
                  "send and recv must have the same element type");
    return Scatter(send.data(), send.size(), recv.data(), recv.size(),
                   DTypeOf<T>::value, root, options);
  }

  // All-to-all: send and recv hold `count` = world x slice elements; on
  // success recv's slice k holds rank k's slice r (this rank's), and slice
  // r is send's slice r. count must be a multiple of the world
  // (INVALID_ARGUMENT naming it). send == recv is in place (zero copy in a
  // HostBuffer); otherwise they must not overlap. Each rank sends each
  // other rank its slice straight: (G-1)/G of the buffer.
  absl::StatusOr<OpInfo> AllToAll(const void* send, void* recv, size_t count,
                                  DType dtype, OpOptions options = {});
  template <typename S, typename T>
  absl::StatusOr<OpInfo> AllToAll(absl::Span<S> send, absl::Span<T> recv,
                                  OpOptions options = {}) {
    static_assert(std::is_same_v<std::remove_const_t<S>, T>,
                  "send and recv must have the same element type");
    if (send.size() != recv.size()) {
      return absl::InvalidArgumentError(
          "all_to_all: send and recv must have the same length");
    }
    return AllToAll(send.data(), recv.data(), send.size(), DTypeOf<T>::value,
                    options);
  }

  // Copies `root`'s buffer into every rank's.
  absl::StatusOr<OpInfo> Broadcast(void* data, size_t count, DType dtype,
                                   int root, OpOptions options = {});
  template <typename T>
  absl::StatusOr<OpInfo> Broadcast(absl::Span<T> data, int root,
                                   OpOptions options = {}) {
    return Broadcast(data.data(), data.size(), DTypeOf<T>::value, root,
                     options);
  }

  // Point to point: `count` elements of `dtype` to rank `to`, and the next
  // message from rank `from` (-1: from any rank; OpInfo::peer says whose)
  // into `data`. Only the two ranks call; the job's collectives are not
  // disturbed (a send/recv takes no number of theirs). A rank's messages
  // to one peer arrive in the order sent, and the receiver's next message
  // from that peer must carry `tag` and exactly the recv's bytes
  // (FAILED_PRECONDITION naming both otherwise; that message is dropped).
  // Send returns once the bytes left the sending worker (the receiving
  // worker holds them until the recv, within its inbox's budget). Errors
  // name the peer: INVALID_ARGUMENT (not another rank of the ring),
  // UNAVAILABLE (its link failed), DEADLINE_EXCEEDED (nothing came, or
  // the bytes did not leave), ABORTED (the membership changed).
  absl::StatusOr<OpInfo> Send(const void* data, size_t count, DType dtype,
                              int to, int tag = 0, OpOptions options = {});
  absl::StatusOr<OpInfo> Recv(void* data, size_t count, DType dtype,
                              int from, int tag = 0, OpOptions options = {});
  template <typename T>
  absl::StatusOr<OpInfo> Send(absl::Span<const T> data, int to, int tag = 0,
                              OpOptions options = {}) {
    return Send(data.data(), data.size(), DTypeOf<std::remove_cv_t<T>>::value,
                to, tag, options);
  }
  template <typename T>
  absl::StatusOr<OpInfo> Recv(absl::Span<T> data, int from, int tag = 0,
                              OpOptions options = {}) {
    return Recv(data.data(), data.size(), DTypeOf<T>::value, from, tag,
                options);
  }

  // On a CUDA device tensor of this process (same host as the worker, CUDA
  // build): the worker maps it through a CUDA IPC handle and reduces it in
  // place on its GPU; nothing passes through this process. Errors as above,
  // plus UNAVAILABLE without CUDA, INVALID_ARGUMENT for host memory and
  // FAILED_PRECONDITION when the worker has no GPU.
  absl::StatusOr<OpInfo> AllReduceDevice(void* device_data, size_t count,
                                         DType dtype, ReduceOp op,
                                         OpOptions options = {});
  absl::StatusOr<OpInfo> BroadcastDevice(void* device_data, size_t count,
                                         DType dtype, int root,
                                         OpOptions options = {});

  // All-gather and reduce-scatter on CUDA device tensors of this process,
  // with the contracts of AllGather and ReduceScatter and the errors of
  // AllReduceDevice. An out-of-place all-gather first copies send into
  // recv (device to device); a reduce-scatter reduces a device scratch copy
  // of send (kept by the client, grown as needed) and copies this rank's
  // slice to recv.
  absl::StatusOr<OpInfo> AllGatherDevice(const void* send, size_t send_count,
                                         void* recv, size_t recv_count,
                                         DType dtype, OpOptions options = {});
  absl::StatusOr<OpInfo> ReduceScatterDevice(const void* send,
                                             size_t send_count, void* recv,
                                             size_t recv_count, DType dtype,
                                             ReduceOp op,
                                             OpOptions options = {});

  // Returns once every rank has called Barrier.
  absl::StatusOr<OpInfo> Barrier(OpOptions options = {});

  // Shared memory for zero-copy collectives (same host only).
  absl::StatusOr<HostBuffer> AllocateHostBuffer(size_t bytes);

  // This worker's rank, world and members (halka/ring.h).
  absl::StatusOr<WorkerInfo> Info();
  // The job's health, as the rendezvous sees it (halka/ring.h).
  absl::StatusOr<halka::RingHealth> RingHealth();

 private:
  // Everything that speaks the wire (the worker's stub, the requests being
  // built, the shared regions) lives in Impl (client.cc).
  class Impl;
  // halka's own tools' access to the wire replies (client/client_proto.h;
  // not part of the SDK).
  friend struct ClientProto;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace halka

#endif  // HALKA_CLIENT_CLIENT_H_
