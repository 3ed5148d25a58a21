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
#include "client/client_impl.h"
#include "client/client_proto.h"
#include "client/op_spec.h"
#include "client/shm_session.h"
#include "common/clock.h"
#include "common/grpc_util.h"
#include "common/held_shm.h"
#include "halka/v1/worker.grpc.pb.h"
#include "core/cuda/device_memory.h"
#include "core/dtype.h"

namespace halka {

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

}  // namespace

// Random and never 0 (0: a call without a caller).
uint64_t NewCallerId() {
  std::random_device rd;
  for (;;) {
    const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (id != 0) return id;
  }
}

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
  const absl::Time deadline = halka::Now() + CallTimeout(req.spec());
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

namespace {

// Whether a call's worker buffer differs from its result's memory (a
// reduce-scatter's or scatter's slice, a reduce's root-only result, an
// all-to-all out of place): then it is staged and the result copied out.
bool Stages(const v1::OpSpec& spec, const OpIo& io) {
  return spec.kind() == v1::REDUCE_SCATTER || spec.kind() == v1::SCATTER ||
         spec.kind() == v1::REDUCE ||
         (spec.kind() == v1::ALL_TO_ALL && io.send != io.recv);
}

// A staged call's result, from the worker's buffer `base` into io.recv:
// the whole result, or this rank's slice of a sliced one; nothing on a
// rank other than a root-only result's root.
absl::Status CopyOutResult(const v1::OpSpec& spec, const OpIo& io,
                           const OpInfo& info, const uint8_t* base) {
  if (io.recv_bytes == 0 || (io.root_only >= 0 && info.rank != io.root_only)) {
    return absl::OkStatus();
  }
  const bool sliced =
      spec.kind() == v1::REDUCE_SCATTER || spec.kind() == v1::SCATTER;
  const size_t off =
      sliced ? static_cast<size_t>(std::max(info.rank, 0)) * io.recv_bytes : 0;
  if (info.rank < 0 || off > io.buffer_bytes ||
      io.recv_bytes > io.buffer_bytes - off) {
    return absl::InternalError(absl::StrCat(
        "the worker answered rank ", info.rank, ", outside the buffer"));
  }
  std::memcpy(io.recv, base + off, io.recv_bytes);
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<InProcessWorker> Client::Impl::InProcess() {
  if (!options_.in_process || options_.transfer != Transfer::kAuto) {
    return nullptr;
  }
  absl::MutexLock lock(&in_process_mu_);
  if (in_process_ == nullptr || in_process_->closed()) {
    // A worker that stopped stays this client's (its calls then fail
    // UNAVAILABLE at once), unless another serves its address now.
    std::shared_ptr<InProcessWorker> found = InProcessWorker::Find(target_);
    if (found != nullptr) in_process_ = std::move(found);
  }
  return in_process_;
}

absl::StatusOr<OpInfo> Client::Impl::RunInProcess(InProcessWorker& w,
                                                  v1::OpSpec spec,
                                                  const Io& io) {
  const bool send = spec.kind() == v1::SEND;
  void* own = send ? const_cast<void*>(io.send) : io.recv;
  const size_t own_bytes = send ? io.send_bytes : io.recv_bytes;
  const bool staged = io.buffer_bytes > 0 &&
                      (Stages(spec, io) || own == nullptr ||
                       own_bytes != io.buffer_bytes);
  // A staged call's buffer: this client's scratch when free, else its own.
  std::vector<uint8_t> mine;
  std::vector<uint8_t>* scratch = nullptr;
  const bool have_scratch = staged && scratch_mu_.TryLock();
  struct Unlock {
    absl::Mutex& mu;
    bool held;
    ~Unlock() {
      if (held) mu.Unlock();
    }
  } unlock{scratch_mu_, have_scratch};
  void* data = own;
  if (staged) {
    scratch = have_scratch ? &in_process_scratch_ : &mine;
    if (scratch->size() < io.buffer_bytes) scratch->resize(io.buffer_bytes);
    if (io.send_bytes > 0) std::memcpy(scratch->data(), io.send, io.send_bytes);
    data = scratch->data();
  } else if (spec.kind() == v1::ALL_GATHER || spec.kind() == v1::GATHER) {
    PlaceContribution(io, &spec);
  }
  v1::RunRequest req;
  *req.mutable_spec() = std::move(spec);
  const InFlight in_flight(*this, req.mutable_spec());
  v1::RunReply reply;
  std::optional<absl::Status> ran =
      w.Run(req, data, io.buffer_bytes, &reply);
  if (!ran.has_value()) {
    return absl::UnavailableError(absl::StrCat(
        "the worker at ", target_, " (in this process) is stopping"));
  }
  if (!ran->ok()) return *ran;
  OpInfo info = ToOpInfo(reply.stats());
  info.transfer = "in-process";
  info.zero_copy = !staged;
  if (staged) {
    if (absl::StatusOr<OpInfo> checked = CheckRootResult(io, info);
        !checked.ok()) {
      return checked.status();
    }
    if (absl::Status s = CopyOutResult(req.spec(), io, info, scratch->data());
        !s.ok()) {
      return s;
    }
  }
  return info;
}

absl::StatusOr<OpInfo> Client::Impl::Run(v1::OpSpec spec, const Io& io) {
  Impl& im = *this;
  if (absl::Status s = CheckGroups(spec); !s.ok()) return s;
  spec.set_issued_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(halka::Now())));
  if (std::shared_ptr<InProcessWorker> w = InProcess()) {
    return RunInProcess(*w, std::move(spec), io);
  }
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
    if (!Stages(spec, io) && shared != nullptr && shared_bytes == io.buffer_bytes &&
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
      if (info.ok()) {
        absl::Status s = CopyOutResult(
            spec, io, *info, static_cast<const uint8_t*>(im.staging_));
        if (!s.ok()) return s;
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
