#include "halka/client.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client_proto.h"
#include "client/op_spec.h"
#include "client/shm_session.h"
#include "common/grpc_util.h"
#include "common/held_shm.h"
#include "halka/v1/worker.grpc.pb.h"
#include "core/cuda/device_memory.h"
#include "core/dtype.h"

namespace halka {
namespace {

// Shared regions this process created, so that a span inside one is handed
// over without a copy.
struct Registry {
  struct Region {
    const uint8_t* base;
    size_t size;
    std::string name;
    std::string capability;  // its owner page's (common/held_shm.h)
  };
  absl::Mutex mu;
  std::vector<Region> regions ABSL_GUARDED_BY(mu);

  bool Find(const void* p, size_t bytes, std::string* name, uint64_t* offset,
            uint64_t* size, std::string* capability) {
    const uint8_t* q = static_cast<const uint8_t*>(p);
    absl::MutexLock lock(&mu);
    for (const Region& r : regions) {
      if (q >= r.base && q + bytes <= r.base + r.size) {
        *name = r.name;
        *offset = static_cast<uint64_t>(q - r.base);
        *size = r.size;
        *capability = r.capability;
        return true;
      }
    }
    return false;
  }
  void Remove(const std::string& name) {
    absl::MutexLock lock(&mu);
    for (size_t i = 0; i < regions.size(); ++i) {
      if (regions[i].name == name) {
        regions.erase(regions.begin() + static_cast<long>(i));
        return;
      }
    }
  }
};

}  // namespace

HostBuffer::HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    this->~HostBuffer();
    data_ = other.data_;
    size_ = other.size_;
    name_ = std::move(other.name_);
    registry_ = std::move(other.registry_);
    other.data_ = nullptr;
    other.size_ = 0;
    other.name_.clear();
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  if (data_ == nullptr) return;
  if (registry_) static_cast<Registry*>(registry_.get())->Remove(name_);
  UnmapOwnedShm(data_, size_);
  shm_unlink(name_.c_str());
  data_ = nullptr;
}

namespace {

// The worker cannot map our shared memory (another host, container or
// /dev/shm: it cannot open the object, so it cannot see that it is ours).
bool CannotShare(const absl::Status& s) {
  return s.code() == absl::StatusCode::kNotFound ||
         s.code() == absl::StatusCode::kPermissionDenied;
}

// Random and never 0 (0: a call without a caller).
uint64_t NewCallerId() {
  std::random_device rd;
  for (;;) {
    const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (id != 0) return id;
  }
}

}  // namespace

class Client::Impl {
 public:
  Impl(const std::string& target, Options options)
      : target_(target),
        options_(options),
        channel_(MakeChannel(target)),
        stub_(v1::Worker::NewStub(channel_)),
        registry_(std::make_shared<Registry>()),
        session_(options.shm_spin) {
    use_shm_ = options.transfer == Transfer::kSharedMemory ||
               (options.transfer == Transfer::kAuto && IsLocalAddress(target));
  }
  ~Impl() {
    FreeDeviceMemory(device_scratch_);
    if (staging_ != nullptr) {
      UnmapOwnedShm(staging_, staging_size_);
      shm_unlink(staging_name_.c_str());
    }
  }

  using Io = OpIo;  // what a call moves (client/op_spec.h)
  absl::StatusOr<OpInfo> Run(v1::OpSpec spec, const Io& io);
  // Streams the input in and the result back (Worker.RunInline).
  absl::StatusOr<OpInfo> RunInline(v1::OpSpec spec, const Io& io);
  // Runs a checked spec (or returns its error) on a device tensor.
  absl::StatusOr<OpInfo> RunDevice(absl::StatusOr<v1::OpSpec> spec,
                                   void* device_data);
  // One Worker.Run call (shared memory, device tensor, or no data); it
  // stamps the request (InFlight).
  absl::StatusOr<OpInfo> RunShm(v1::RunRequest req, const char* transfer);
  // A request on its way, from right before its send until its answer.
  // Marks it with this client's id and next call index (OpSpec.caller_id,
  // call_index), from which the worker tells a call lost on its way, when
  // no other request of this client is in flight; else leaves it unmarked.
  class InFlight {
   public:
    InFlight(Impl& im, v1::OpSpec* spec);
    ~InFlight();
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    Impl& im_;
  };

  std::string target_;
  Options options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  std::shared_ptr<Registry> registry_;
  std::atomic<bool> use_shm_{false};

  absl::Mutex staging_mu_;  // held for a whole staged operation
  void* staging_ ABSL_GUARDED_BY(staging_mu_) = nullptr;
  size_t staging_size_ ABSL_GUARDED_BY(staging_mu_) = 0;
  std::string staging_name_ ABSL_GUARDED_BY(staging_mu_);
  std::string staging_capability_ ABSL_GUARDED_BY(staging_mu_);
  // A staging object of >= `bytes` (a power of two from 1 MiB) in place.
  absl::Status GrowStaging(size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(staging_mu_);

  SessionSlot session_;  // same-host workers (client/shm_session.h)

  // This client's order of its calls (StampCall), and its requests in
  // flight: only a request sent while no other is in flight is stamped.
  const uint64_t caller_id_ = NewCallerId();
  std::atomic<uint64_t> calls_sent_{0};
  // Whether the worker runs a group's collectives (InfoReply.groups): 0 not
  // asked yet, 1 yes, 2 no.
  std::atomic<int> groups_{0};
  // OK for a call of the job; for a group's call, OK once the worker said
  // it runs groups (asked once), else FAILED_PRECONDITION: an older worker
  // would run it as the job's.
  absl::Status CheckGroups(const v1::OpSpec& spec);
  std::atomic<int> in_flight_{0};

  absl::Mutex device_mu_;  // held for a whole device reduce-scatter
  void* device_scratch_ ABSL_GUARDED_BY(device_mu_) = nullptr;
  size_t device_scratch_size_ ABSL_GUARDED_BY(device_mu_) = 0;
};

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& target, Options options) {
  if (target.empty()) {
    return absl::InvalidArgumentError("client: empty worker address");
  }
  return std::unique_ptr<Client>(new Client(std::make_unique<Impl>(target, options)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

namespace {

// The call's own timeout: the operation's plus room for the transfer.
absl::Duration CallTimeout(const v1::OpSpec& spec) {
  const absl::Duration op = spec.timeout_ms() > 0
                                ? absl::Milliseconds(spec.timeout_ms())
                                : kDefaultOpTimeout;
  return op + absl::Seconds(30);
}

void SetCallDeadline(grpc::ClientContext& ctx, const v1::OpSpec& spec) {
  SetTimeout(ctx, CallTimeout(spec));
  ctx.set_wait_for_ready(true);
}

}  // namespace

Client::Impl::InFlight::InFlight(Impl& im, v1::OpSpec* spec) : im_(im) {
  // Calls made at once from several threads reach the worker in an order
  // the indices cannot foresee: the worker would take the later one's
  // arrival for a lost call. They go unstamped (numbered as they arrive).
  // A send or recv takes no number: unstamped, and not counted as a call.
  // A group's call takes no number of the job's: unstamped too.
  if (im.in_flight_.fetch_add(1) == 0 && spec->kind() != v1::SEND &&
      spec->kind() != v1::RECV && spec->group_ranks_size() == 0) {
    spec->set_caller_id(im.caller_id_);
    spec->set_call_index(im.calls_sent_.fetch_add(1) + 1);
  } else {
    spec->clear_caller_id();
    spec->clear_call_index();
  }
}

Client::Impl::InFlight::~InFlight() { im_.in_flight_.fetch_sub(1); }

namespace {

// Takes `mu` (the staging object's) for a call that stages when it is
// free: a call that finds it held goes inline instead of waiting, since the
// call holding it may wait (in the worker) for a peer that waits for this
// one (a group's call and the job's run beside each other). With
// Transfer::kSharedMemory (no inline) it waits.
bool StagingFor(absl::Mutex& mu, bool wait) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (mu.TryLock()) return true;
  if (!wait) return false;
  mu.Lock();
  return true;
}

// A reduce or gather whose root turned out to be this rank, called with a
// null recv: the result had nowhere to go.
absl::StatusOr<OpInfo> CheckRootResult(const OpIo& io, const OpInfo& info) {
  if (io.root_only >= 0 && info.rank == io.root_only && io.recv == nullptr &&
      io.recv_bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this rank (", info.rank,
        ") is the root, but its recv buffer is null: the result was dropped"));
  }
  return info;
}

}  // namespace

absl::StatusOr<OpInfo> Client::Impl::RunShm(v1::RunRequest req,
                                            const char* transfer) {
  const InFlight in_flight(*this, req.mutable_spec());
  v1::RunReply reply;
  const absl::Time deadline = absl::Now() + CallTimeout(req.spec());
  Impl& im = *this;
  std::optional<absl::StatusOr<v1::RunReply>> via;
  bool session_ended = false;
  if (im.options_.session && im.use_shm_) {
    via = im.session_.TryRun(*im.channel_, *im.stub_, req, deadline,
                             &session_ended);
  }
  const bool session = via.has_value();
  if (session) {
    if (!via->ok()) return via->status();
    reply = std::move(**via);
  } else {
    // The call's deadline, whatever trying the session took. After the
    // session ended (its worker stopped or died since the last call), the
    // call does not wait for the worker to come back: a dead worker fails
    // it at once (UNAVAILABLE) instead of at its deadline.
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    ctx.set_wait_for_ready(!session_ended);
    grpc::Status s = im.stub_->Run(&ctx, req, &reply);
    if (!s.ok()) return FromGrpcStatus(s);
  }
  OpInfo info = ToOpInfo(reply.stats());
  info.transfer = transfer;
  info.session = session;
  return info;
}

absl::Status Client::Impl::GrowStaging(size_t bytes) {
  if (staging_size_ >= bytes) return absl::OkStatus();
  if (staging_ != nullptr) {
    UnmapOwnedShm(staging_, staging_size_);
    shm_unlink(staging_name_.c_str());
    staging_ = nullptr;
    staging_size_ = 0;
  }
  size_t want = 1 << 20;
  while (want < bytes) want *= 2;
  staging_name_ = NewHeldShmName();
  auto made = CreateOwnedShm(staging_name_, want);
  if (!made.ok()) return made.status();
  staging_ = made->data;
  staging_size_ = made->size;
  staging_capability_ = std::move(made->capability);
  return absl::OkStatus();
}

absl::Status Client::Impl::CheckGroups(const v1::OpSpec& spec) {
  if (spec.group_ranks_size() == 0 || groups_.load() == 1) {
    return absl::OkStatus();
  }
  if (groups_.load() == 0) {
    grpc::ClientContext ctx;
    SetTimeout(ctx, absl::Seconds(10));
    ctx.set_wait_for_ready(true);
    v1::InfoReply reply;
    grpc::Status s = stub_->GetInfo(&ctx, v1::InfoRequest(), &reply);
    // A worker that cannot say yet (not joined) is asked again next time;
    // the call goes on (it fails there the same way).
    if (!s.ok()) return absl::OkStatus();
    groups_.store(reply.groups() ? 1 : 2);
  }
  if (groups_.load() == 1) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the worker at ", target_, " is older than group collectives "
      "(OpSpec.group_ranks): it would run this call as the whole job's; "
      "upgrade it"));
}

absl::StatusOr<OpInfo> Client::Impl::Run(v1::OpSpec spec, const Io& io) {
  Impl& im = *this;
  if (absl::Status s = CheckGroups(spec); !s.ok()) return s;
  spec.set_issued_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
  const bool reduce_scatter = spec.kind() == v1::REDUCE_SCATTER;
  // The result is this rank's slice of the buffer.
  const bool sliced = reduce_scatter || spec.kind() == v1::SCATTER;
  // Where the result lies in the worker's buffer once it ran as `rank`.
  auto result_offset = [&](int rank) -> absl::StatusOr<size_t> {
    const size_t off =
        sliced ? static_cast<size_t>(rank) * io.recv_bytes : 0;
    if (rank < 0 || off > io.buffer_bytes ||
        io.recv_bytes > io.buffer_bytes - off) {
      return absl::InternalError(absl::StrCat(
          "the worker answered rank ", rank, ", outside the buffer"));
    }
    return off;
  };
  if (im.use_shm_ && io.buffer_bytes > 0) {
    v1::RunRequest req;
    *req.mutable_spec() = spec;
    std::string name, capability;
    uint64_t offset = 0, size = 0;
    // Zero copy when the worker may write the result where the caller
    // wants it and read the input from there: all-reduce and broadcast in
    // place, all-gather or gather into a shared recv buffer, an in-place
    // all-to-all, a recv into one, a send from one (which the worker only
    // reads). A reduce-scatter, reduce or scatter always stages: reduced
    // in place, the caller's (const) input would change, and a scatter's
    // result is a slice of the buffer.
    const bool send = spec.kind() == v1::SEND;
    const void* shared = send ? io.send : io.recv;
    const size_t shared_bytes = send ? io.send_bytes : io.recv_bytes;
    const bool stages = sliced || spec.kind() == v1::REDUCE ||
                        (spec.kind() == v1::ALL_TO_ALL && io.send != io.recv);
    if (!stages && shared != nullptr && shared_bytes == io.buffer_bytes &&
        im.registry_->Find(shared, io.buffer_bytes, &name, &offset, &size,
                           &capability)) {
      if (spec.kind() == v1::ALL_GATHER || spec.kind() == v1::GATHER) {
        PlaceContribution(io, req.mutable_spec());
      }
      req.set_shm_name(name);
      req.set_shm_offset(offset);
      req.set_shm_size(size);
      req.set_shm_capability(capability);
      absl::StatusOr<OpInfo> info = RunShm(req, "shm");
      if (info.ok()) info->zero_copy = true;
      if (info.ok() || !CannotShare(info.status()) ||
          im.options_.transfer == Transfer::kSharedMemory) {
        return info;
      }
      // The worker cannot see our shared memory (another host or
      // container): fall through to inline from now on.
      im.use_shm_ = false;
    } else if (spec.kind() != v1::SEND && spec.kind() != v1::RECV &&
               StagingFor(im.staging_mu_,
                          im.options_.transfer == Transfer::kSharedMemory)) {
      // Not a send or recv: the staging object is held for the whole call,
      // and a recv may wait long for its peer while this client's other
      // threads run collectives; those go inline unless zero-copy, as does
      // a call that finds another holding the staging object (StagingFor).
      struct Unlock {
        absl::Mutex& mu;
        ~Unlock() { mu.Unlock(); }
      } unlock{im.staging_mu_};
      im.staging_mu_.AssertHeld();
      if (absl::Status s = im.GrowStaging(io.buffer_bytes); !s.ok()) return s;
      // An all-gather's contribution goes to slice 0 (input_slice 0).
      if (io.send_bytes > 0) std::memcpy(im.staging_, io.send, io.send_bytes);
      req.set_shm_name(im.staging_name_);
      req.set_shm_offset(0);
      req.set_shm_size(im.staging_size_);
      req.set_shm_capability(im.staging_capability_);
      absl::StatusOr<OpInfo> info = RunShm(req, "shm-staged");
      if (info.ok()) info = CheckRootResult(io, *info);
      if (info.ok() && io.recv_bytes > 0 &&
          (io.root_only < 0 || info->rank == io.root_only)) {
        absl::StatusOr<size_t> off = result_offset(info->rank);
        if (!off.ok()) return off.status();
        std::memcpy(io.recv, static_cast<uint8_t*>(im.staging_) + *off,
                    io.recv_bytes);
      }
      if (info.ok() || !CannotShare(info.status()) ||
          im.options_.transfer == Transfer::kSharedMemory) {
        return info;
      }
      im.use_shm_ = false;
    }
  }
  if (io.buffer_bytes == 0) {
    v1::RunRequest req;
    *req.mutable_spec() = spec;
    return RunShm(req, "none");
  }
  return RunInline(std::move(spec), io);
}

absl::StatusOr<OpInfo> Client::Impl::RunInline(v1::OpSpec spec,
                                               const Io& io) {
  const InFlight in_flight(*this, &spec);
  grpc::ClientContext ctx;
  SetCallDeadline(ctx, spec);
  auto stream = stub_->RunInline(&ctx);
  const uint8_t* p = static_cast<const uint8_t*>(io.send);
  for (size_t off = 0; off < io.send_bytes || off == 0;
       off += kInlineChunkBytes) {
    v1::InlineRequest msg;
    if (off == 0) *msg.mutable_spec() = spec;
    if (io.send_bytes > 0) {
      msg.set_data(p + off, std::min(kInlineChunkBytes, io.send_bytes - off));
    }
    if (!stream->Write(msg)) break;
    if (io.send_bytes == 0) break;
  }
  stream->WritesDone();
  // The worker replies after the whole upload: a result that aliases the
  // input (an in-place reduce-scatter) overwrites nothing still to be sent.
  v1::InlineReply reply;
  size_t got = 0;
  OpInfo info;
  bool done = false;
  while (stream->Read(&reply)) {
    if (got + reply.data().size() > io.recv_bytes) {
      ctx.TryCancel();
      return absl::DataLossError(
          "inline reply carries more data than the result holds");
    }
    if (io.recv != nullptr) {  // null: a root without recv (CheckRootResult)
      std::memcpy(static_cast<uint8_t*>(io.recv) + got, reply.data().data(),
                  reply.data().size());
    }
    got += reply.data().size();
    if (reply.done()) {
      info = ToOpInfo(reply.stats());
      done = true;
    }
  }
  grpc::Status s = stream->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  // A reduce or gather answers only its root.
  const size_t due =
      io.root_only < 0 || info.rank == io.root_only ? io.recv_bytes : 0;
  if (!done || got != due) {
    return absl::DataLossError(
        absl::StrCat("inline reply carried ", got, " of ", due, " bytes"));
  }
  if (absl::StatusOr<OpInfo> checked = CheckRootResult(io, info);
      !checked.ok()) {
    return checked.status();
  }
  info.transfer = "inline";
  return info;
}

absl::StatusOr<OpInfo> Client::Impl::RunDevice(
    absl::StatusOr<v1::OpSpec> checked, void* device_data) {
  if (!checked.ok()) return checked.status();
  v1::OpSpec& spec = *checked;
  if (absl::Status s = CheckGroups(spec); !s.ok()) return s;
  spec.set_issued_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
  if (!IsLocalAddress(target_) &&
      options_.transfer != Transfer::kSharedMemory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device tensors need a worker on this host; ", target_,
        " is not a local address"));
  }
  v1::RunRequest req;
  *req.mutable_spec() = spec;
  if (std::max(spec.count(), spec.recv_count()) > 0) {
    absl::StatusOr<DeviceHandle> h = ExportDevicePointer(device_data);
    if (!h.ok()) return h.status();
    v1::DeviceTensor* t = req.mutable_device_tensor();
    t->set_device(h->device);
    t->set_ipc_handle(h->ipc_handle);
    t->set_offset(h->offset);
    t->set_pid(h->pid);
    t->set_pointer(h->pointer);
  }
  absl::StatusOr<OpInfo> info = RunShm(req, "cuda-ipc");
  if (info.ok()) info->zero_copy = true;
  return info;
}

absl::StatusOr<OpInfo> Client::AllReduceDevice(void* device_data, size_t count,
                                               DType dtype, ReduceOp op,
                                               OpOptions options) {
  return impl_->RunDevice(AllReduceSpec(count, dtype, op, options),
                          device_data);
}

absl::StatusOr<OpInfo> Client::BroadcastDevice(void* device_data, size_t count,
                                               DType dtype, int root,
                                               OpOptions options) {
  return impl_->RunDevice(BroadcastSpec(count, dtype, root, options),
                          device_data);
}

absl::StatusOr<OpInfo> Client::AllGatherDevice(const void* send,
                                               size_t send_count, void* recv,
                                               size_t recv_count, DType dtype,
                                               OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec =
      SliceSpec(v1::ALL_GATHER, send, send_count, recv, recv_count, dtype,
                ReduceOp::kSum, options);
  if (!spec.ok()) return spec.status();
  const OpIo io = SliceIo(send, send_count, recv, recv_count, dtype);
  if (!InPlaceSlice(io, &*spec) && io.send_bytes <= io.recv_bytes) {
    if (absl::Status s = CopyDeviceMemory(recv, send, io.send_bytes); !s.ok()) {
      return s;
    }
  }
  return impl_->RunDevice(std::move(spec), recv);
}

absl::StatusOr<OpInfo> Client::ReduceScatterDevice(
    const void* send, size_t send_count, void* recv, size_t recv_count,
    DType dtype, ReduceOp op, OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec =
      SliceSpec(v1::REDUCE_SCATTER, send, send_count, recv, recv_count, dtype,
                op, options);
  if (!spec.ok()) return spec.status();
  const OpIo io = SliceIo(send, send_count, recv, recv_count, dtype);
  if (io.buffer_bytes == 0) return impl_->RunDevice(std::move(spec), nullptr);
  // The worker reduces in place: a scratch copy keeps `send` unchanged.
  Impl& im = *impl_;
  absl::MutexLock lock(&im.device_mu_);
  if (im.device_scratch_size_ < io.buffer_bytes) {
    FreeDeviceMemory(im.device_scratch_);
    im.device_scratch_ = nullptr;
    im.device_scratch_size_ = 0;
    absl::StatusOr<void*> made = AllocateDeviceMemory(send, io.buffer_bytes);
    if (!made.ok()) return made.status();
    im.device_scratch_ = *made;
    im.device_scratch_size_ = io.buffer_bytes;
  }
  if (absl::Status s =
          CopyDeviceMemory(im.device_scratch_, send, io.send_bytes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<OpInfo> info =
      im.RunDevice(std::move(spec), im.device_scratch_);
  if (!info.ok()) return info;
  const size_t off = static_cast<size_t>(info->rank) * io.recv_bytes;
  if (info->rank < 0 || off > io.buffer_bytes ||
      io.recv_bytes > io.buffer_bytes - off) {
    return absl::InternalError(absl::StrCat(
        "the worker answered rank ", info->rank, ", outside the buffer"));
  }
  if (absl::Status s = CopyDeviceMemory(
          recv, static_cast<uint8_t*>(im.device_scratch_) + off,
          io.recv_bytes);
      !s.ok()) {
    return s;
  }
  info->zero_copy = false;
  return info;
}

absl::StatusOr<HostBuffer> Client::AllocateHostBuffer(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("host buffer of 0 bytes");
  HostBuffer b;
  b.name_ = NewHeldShmName();
  auto made = CreateOwnedShm(b.name_, bytes);
  if (!made.ok()) return made.status();
  b.data_ = made->data;
  b.size_ = made->size;
  b.registry_ = impl_->registry_;
  {
    absl::MutexLock lock(&impl_->registry_->mu);
    impl_->registry_->regions.push_back(
        Registry::Region{static_cast<const uint8_t*>(b.data_), b.size_, b.name_,
                         std::move(made->capability)});
  }
  return b;
}

absl::StatusOr<OpInfo> ClientProto::Run(Client& client, const v1::OpSpec& spec,
                                         const OpIo& io) {
  return client.impl_->Run(spec, io);
}

// Client::Info and Client::RingHealth convert these (client_proto.cc).
absl::StatusOr<v1::InfoReply> ClientProto::Info(Client& client) {
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(10));
  ctx.set_wait_for_ready(true);
  v1::InfoReply reply;
  grpc::Status s =
      client.impl_->stub_->GetInfo(&ctx, v1::InfoRequest(), &reply);
  if (!s.ok()) return FromGrpcStatus(s);
  return reply;
}

absl::StatusOr<v1::RingHealth> ClientProto::RingHealth(Client& client) {
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(10));
  v1::RingHealth reply;
  grpc::Status s = client.impl_->stub_->GetRingHealth(
      &ctx, v1::RingHealthRequest(), &reply);
  if (!s.ok()) return FromGrpcStatus(s);
  return reply;
}

absl::StatusOr<WorkerInfo> Client::Info() {
  absl::StatusOr<v1::InfoReply> r = ClientProto::Info(*this);
  if (!r.ok()) return r.status();
  return ToWorkerInfo(*r);
}

absl::StatusOr<RingHealth> Client::RingHealth() {
  absl::StatusOr<v1::RingHealth> r = ClientProto::RingHealth(*this);
  if (!r.ok()) return r.status();
  return ToRingHealth(*r);
}

}  // namespace halka
