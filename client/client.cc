#include "halka/client.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "common/held_shm.h"
#include "halka/v1/worker.grpc.pb.h"
#include "worker/core/cuda/device_memory.h"
#include "worker/core/dtype.h"

namespace halka {
namespace {

// Shared regions this process created, so that a span inside one is handed
// over without a copy.
struct Registry {
  struct Region {
    const uint8_t* base;
    size_t size;
    std::string name;
  };
  absl::Mutex mu;
  std::vector<Region> regions ABSL_GUARDED_BY(mu);

  bool Find(const void* p, size_t bytes, std::string* name, uint64_t* offset,
            uint64_t* size) {
    const uint8_t* q = static_cast<const uint8_t*>(p);
    absl::MutexLock lock(&mu);
    for (const Region& r : regions) {
      if (q >= r.base && q + bytes <= r.base + r.size) {
        *name = r.name;
        *offset = static_cast<uint64_t>(q - r.base);
        *size = r.size;
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

std::string NewShmName() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  return absl::StrCat("/", kHeldShmPrefix, getpid(), "-", salt % 1000000,
                      "-", counter.fetch_add(1));
}

// Creates and maps a shared object of `bytes` (at least one page), held
// under a shared flock for as long as it is mapped (common/held_shm.h).
absl::StatusOr<std::pair<void*, size_t>> CreateShm(const std::string& name,
                                                   size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = std::max(page, (bytes + page - 1) / page * page);
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot create shm object ", name, ": ", std::strerror(errno)));
  }
  // Closes and removes the half-made object.
  auto fail = [&](absl::string_view what, int err) {
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot ", what, " shm object ", name, ": ", std::strerror(err)));
  };
  if (flock(fd, LOCK_SH) != 0) return fail("lock", errno);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return fail(absl::StrCat("size (", size, " bytes)"), errno);
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("map", errno);
  close(fd);  // the mapping keeps the file, and the lock, open
  return std::make_pair(p, size);
}

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
  munmap(data_, size_);
  shm_unlink(name_.c_str());
  data_ = nullptr;
}

class Client::Impl {
 public:
  Impl(const std::string& target, Options options)
      : target_(target),
        options_(options),
        stub_(v1::Worker::NewStub(MakeChannel(target))),
        registry_(std::make_shared<Registry>()) {
    use_shm_ = options.transfer == Transfer::kSharedMemory ||
               (options.transfer == Transfer::kAuto && IsLocalAddress(target));
  }
  ~Impl() {
    if (staging_ != nullptr) {
      munmap(staging_, staging_size_);
      shm_unlink(staging_name_.c_str());
    }
  }

  std::string target_;
  Options options_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  std::shared_ptr<Registry> registry_;
  std::atomic<bool> use_shm_{false};

  absl::Mutex staging_mu_;  // held for a whole staged operation
  void* staging_ ABSL_GUARDED_BY(staging_mu_) = nullptr;
  size_t staging_size_ ABSL_GUARDED_BY(staging_mu_) = 0;
  std::string staging_name_ ABSL_GUARDED_BY(staging_mu_);
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

OpInfo FromStats(const v1::OpStats& s) {
  OpInfo info;
  info.op_seq = s.op_seq();
  info.algorithm = s.algorithm();
  info.bytes_sent = s.bytes_sent();
  info.bytes_received = s.bytes_received();
  info.seconds = s.seconds();
  info.rank = s.rank();
  info.world_size = s.world_size();
  info.generation = s.generation();
  return info;
}

// The call's own deadline: the operation's plus room for the transfer.
void SetCallDeadline(grpc::ClientContext& ctx, const v1::OpSpec& spec) {
  const absl::Duration op = spec.timeout_ms() > 0
                                ? absl::Milliseconds(spec.timeout_ms())
                                : kDefaultOpTimeout;
  SetTimeout(ctx, op + absl::Seconds(30));
  ctx.set_wait_for_ready(true);
}

}  // namespace

absl::StatusOr<OpInfo> Client::RunShm(const v1::RunRequest& req,
                                      const char* transfer) {
  v1::RunReply reply;
  grpc::ClientContext ctx;
  SetCallDeadline(ctx, req.spec());
  grpc::Status s = impl_->stub_->Run(&ctx, req, &reply);
  if (!s.ok()) return FromGrpcStatus(s);
  OpInfo info = FromStats(reply.stats());
  info.transfer = transfer;
  return info;
}

absl::StatusOr<OpInfo> Client::Run(v1::OpSpec spec, void* data, size_t bytes) {
  Impl& im = *impl_;
  spec.set_issued_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
  if (im.use_shm_ && bytes > 0) {
    v1::RunRequest req;
    *req.mutable_spec() = spec;
    std::string name;
    uint64_t offset = 0, size = 0;
    if (im.registry_->Find(data, bytes, &name, &offset, &size)) {
      req.set_shm_name(name);
      req.set_shm_offset(offset);
      req.set_shm_size(size);
      absl::StatusOr<OpInfo> info = RunShm(req, "shm");
      if (info.ok()) info->zero_copy = true;
      if (info.ok() || info.status().code() != absl::StatusCode::kNotFound ||
          im.options_.transfer == Transfer::kSharedMemory) {
        return info;
      }
      // The worker cannot see our shared memory (another host or
      // container): fall through to inline from now on.
      im.use_shm_ = false;
    } else {
      absl::MutexLock lock(&im.staging_mu_);
      if (im.staging_size_ < bytes) {
        if (im.staging_ != nullptr) {
          munmap(im.staging_, im.staging_size_);
          shm_unlink(im.staging_name_.c_str());
          im.staging_ = nullptr;
          im.staging_size_ = 0;
        }
        size_t want = 1 << 20;
        while (want < bytes) want *= 2;
        im.staging_name_ = NewShmName();
        auto made = CreateShm(im.staging_name_, want);
        if (!made.ok()) return made.status();
        im.staging_ = made->first;
        im.staging_size_ = made->second;
      }
      std::memcpy(im.staging_, data, bytes);
      req.set_shm_name(im.staging_name_);
      req.set_shm_offset(0);
      req.set_shm_size(im.staging_size_);
      absl::StatusOr<OpInfo> info = RunShm(req, "shm-staged");
      if (info.ok()) std::memcpy(data, im.staging_, bytes);
      if (info.ok() || info.status().code() != absl::StatusCode::kNotFound ||
          im.options_.transfer == Transfer::kSharedMemory) {
        return info;
      }
      im.use_shm_ = false;
    }
  }
  if (bytes == 0) {
    v1::RunRequest req;
    *req.mutable_spec() = spec;
    return RunShm(req, "none");
  }
  // Inline: stream the tensor in, stream the result back.
  grpc::ClientContext ctx;
  SetCallDeadline(ctx, spec);
  auto stream = im.stub_->RunInline(&ctx);
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t off = 0; off < bytes || off == 0; off += kInlineChunkBytes) {
    v1::InlineRequest msg;
    if (off == 0) *msg.mutable_spec() = spec;
    msg.set_data(p + off, std::min(kInlineChunkBytes, bytes - off));
    if (!stream->Write(msg)) break;
    if (bytes == 0) break;
  }
  stream->WritesDone();
  v1::InlineReply reply;
  size_t got = 0;
  OpInfo info;
  bool done = false;
  while (stream->Read(&reply)) {
    if (got + reply.data().size() > bytes) {
      ctx.TryCancel();
      return absl::DataLossError("inline reply carries more data than sent");
    }
    std::memcpy(static_cast<uint8_t*>(data) + got, reply.data().data(),
                reply.data().size());
    got += reply.data().size();
    if (reply.done()) {
      info = FromStats(reply.stats());
      done = true;
    }
  }
  grpc::Status s = stream->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  if (!done || got != bytes) {
    return absl::DataLossError(absl::StrCat("inline reply carried ", got,
                                            " of ", bytes, " bytes"));
  }
  info.transfer = "inline";
  return info;
}

namespace {

// The validated spec of an all-reduce or a broadcast.
absl::StatusOr<v1::OpSpec> AllReduceSpec(size_t count, DType dtype,
                                         ReduceOp op,
                                         const OpOptions& options) {
  if (!IsValidDType(static_cast<int>(dtype)) ||
      !IsValidReduceOp(static_cast<int>(op))) {
    return absl::InvalidArgumentError("all_reduce: invalid dtype or op");
  }
  v1::OpSpec spec;
  spec.set_kind(v1::ALL_REDUCE);
  spec.set_dtype(static_cast<v1::DType>(dtype));
  spec.set_count(count);
  spec.set_op(static_cast<v1::ReduceOp>(op));
  spec.set_algorithm(static_cast<v1::Algorithm>(options.algorithm));
  spec.set_timeout_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(options.timeout)));
  return spec;
}

absl::StatusOr<v1::OpSpec> BroadcastSpec(size_t count, DType dtype, int root,
                                         const OpOptions& options) {
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError("broadcast: invalid dtype");
  }
  v1::OpSpec spec;
  spec.set_kind(v1::BROADCAST);
  spec.set_dtype(static_cast<v1::DType>(dtype));
  spec.set_count(count);
  spec.set_root(root);
  spec.set_timeout_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(options.timeout)));
  return spec;
}

}  // namespace

absl::StatusOr<OpInfo> Client::AllReduce(void* data, size_t count,
                                         DType dtype, ReduceOp op,
                                         OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec = AllReduceSpec(count, dtype, op, options);
  if (!spec.ok()) return spec.status();
  return Run(*spec, data, count * DTypeSize(dtype));
}

absl::StatusOr<OpInfo> Client::Broadcast(void* data, size_t count, DType dtype,
                                         int root, OpOptions options) {
  absl::StatusOr<v1::OpSpec> spec = BroadcastSpec(count, dtype, root, options);
  if (!spec.ok()) return spec.status();
  return Run(*spec, data, count * DTypeSize(dtype));
}

absl::StatusOr<OpInfo> Client::RunDevice(absl::StatusOr<v1::OpSpec> checked,
                                         void* device_data) {
  if (!checked.ok()) return checked.status();
  v1::OpSpec& spec = *checked;
  spec.set_issued_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
  if (!IsLocalAddress(impl_->target_) &&
      impl_->options_.transfer != Transfer::kSharedMemory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device tensors need a worker on this host; ", impl_->target_,
        " is not a local address"));
  }
  v1::RunRequest req;
  *req.mutable_spec() = spec;
  if (spec.count() > 0) {
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
  return RunDevice(AllReduceSpec(count, dtype, op, options), device_data);
}

absl::StatusOr<OpInfo> Client::BroadcastDevice(void* device_data, size_t count,
                                               DType dtype, int root,
                                               OpOptions options) {
  return RunDevice(BroadcastSpec(count, dtype, root, options), device_data);
}

absl::StatusOr<OpInfo> Client::Barrier(OpOptions options) {
  v1::OpSpec spec;
  spec.set_kind(v1::BARRIER);
  spec.set_timeout_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(options.timeout)));
  return Run(spec, nullptr, 0);
}

absl::StatusOr<HostBuffer> Client::AllocateHostBuffer(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("host buffer of 0 bytes");
  HostBuffer b;
  b.name_ = NewShmName();
  auto made = CreateShm(b.name_, bytes);
  if (!made.ok()) return made.status();
  b.data_ = made->first;
  b.size_ = made->second;
  b.registry_ = impl_->registry_;
  {
    absl::MutexLock lock(&impl_->registry_->mu);
    impl_->registry_->regions.push_back(
        Registry::Region{static_cast<const uint8_t*>(b.data_), b.size_, b.name_});
  }
  return b;
}

absl::StatusOr<v1::InfoReply> Client::Info() {
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(10));
  ctx.set_wait_for_ready(true);
  v1::InfoReply reply;
  grpc::Status s = impl_->stub_->GetInfo(&ctx, v1::InfoRequest(), &reply);
  if (!s.ok()) return FromGrpcStatus(s);
  return reply;
}

absl::StatusOr<v1::RingHealth> Client::RingHealth() {
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(10));
  v1::RingHealth reply;
  grpc::Status s =
      impl_->stub_->GetRingHealth(&ctx, v1::RingHealthRequest(), &reply);
  if (!s.ok()) return FromGrpcStatus(s);
  return reply;
}

}  // namespace halka
