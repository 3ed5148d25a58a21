// Device tensors with the CUDA runtime.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/cuda/cuda_reduce.h"
#include "core/cuda/device_export.h"
#include "core/cuda/device_memory.h"
#include "core/payload.h"

namespace halka {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), ": ",
                                          cudaGetErrorString(e)));
}

#define HALKA_CUDA_RETURN(expr, what)                     \
  do {                                                    \
    absl::Status s_ = CudaError((expr), (what));          \
    if (!s_.ok()) return s_;                              \
  } while (0)

// The driver calls ExportDevicePointer needs, through the runtime's driver
// entry points, so that nothing links libcuda directly (it is absent on
// machines without a GPU). Driver results are CUresult values (0: success).
struct Driver {
  int (*mem_get_address_range)(uintptr_t* base, size_t* size, uintptr_t ptr);
  int (*device_get)(int* device, int ordinal);
  int (*primary_ctx_retain)(void** ctx, int device);
  int (*primary_ctx_release)(int device);
  int (*ctx_push_current)(void* ctx);
  int (*ctx_pop_current)(void** ctx);
  bool ok = false;
};

template <typename Fn>
bool ResolveDriverFn(const char* name, Fn* fn) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || f == nullptr) {
    cudaGetLastError();
    return false;
  }
  *fn = reinterpret_cast<Fn>(f);
  return true;
}

const Driver& TheDriver() {
  static const Driver driver = [] {
    Driver d;
    d.ok =
        ResolveDriverFn("cuMemGetAddressRange", &d.mem_get_address_range) &&
        ResolveDriverFn("cuDeviceGet", &d.device_get) &&
        ResolveDriverFn("cuDevicePrimaryCtxRetain", &d.primary_ctx_retain) &&
        ResolveDriverFn("cuDevicePrimaryCtxRelease", &d.primary_ctx_release) &&
        ResolveDriverFn("cuCtxPushCurrent", &d.ctx_push_current) &&
        ResolveDriverFn("cuCtxPopCurrent", &d.ctx_pop_current);
    return d;
  }();
  return driver;
}

constexpr int kDriverInvalidContext = 201;  // CUDA_ERROR_INVALID_CONTEXT

// The real CUDA calls behind ExportDevicePointerWith (device_export.h).
class RealPointerApi final : public CudaPointerApi {
 public:
  absl::StatusOr<int> DeviceOf(const void* ptr) override {
    cudaPointerAttributes attr;
    const cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::InvalidArgumentError(
          absl::StrCat("device tensors: the pointer is not CUDA device memory (",
                       cudaGetErrorName(e), ")"));
    }
    if (attr.type != cudaMemoryTypeDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device tensors: the pointer is not CUDA device memory (memory type ",
          static_cast<int>(attr.type), ")"));
    }
    return attr.device;
  }

  absl::Status PushContext(int device) override {
    const Driver& d = TheDriver();
    if (!d.ok) {
      return absl::UnavailableError(
          "device tensors: the CUDA driver lacks an entry point it needs");
    }
    int dev = 0;
    void* ctx = nullptr;
    int r = d.device_get(&dev, device);
    if (r == 0) r = d.primary_ctx_retain(&ctx, dev);
    if (r != 0) {
      return absl::InternalError(absl::StrCat(
          "device tensors: no primary context for device ", device,
          " (CUresult ", r, ")"));
    }
    r = d.ctx_push_current(ctx);
    if (r != 0) {
      d.primary_ctx_release(dev);
      return absl::InternalError(absl::StrCat(
          "device tensors: cuCtxPushCurrent failed (CUresult ", r, ")"));
    }
    return absl::OkStatus();
  }

  void PopContext(int device) override {
    const Driver& d = TheDriver();
    void* ctx = nullptr;
    d.ctx_pop_current(&ctx);
    int dev = 0;
    if (d.device_get(&dev, device) == 0) d.primary_ctx_release(dev);
  }

  absl::StatusOr<Range> AllocationOf(const void* ptr) override {
    Range range;
    const int r = TheDriver().mem_get_address_range(
        &range.base, &range.size, reinterpret_cast<uintptr_t>(ptr));
    if (r == kDriverInvalidContext) {
      return absl::InternalError(
          "device tensors: cuMemGetAddressRange: no CUDA context current in "
          "this thread");
    }
    if (r != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device tensors: the pointer is not in a CUDA allocation (CUresult ",
          r, ")"));
    }
    return range;
  }

  absl::StatusOr<std::string> IpcHandle(uintptr_t base) override {
    cudaIpcMemHandle_t handle;
    const cudaError_t e =
        cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return CudaError(e, "cudaIpcGetMemHandle");
    }
    return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
  }

  uint64_t Pid() override { return static_cast<uint64_t>(getpid()); }
};

// Pinned host memory, grown on demand and kept.
class Pinned {
 public:
  ~Pinned() {
    if (p_ != nullptr) cudaFreeHost(p_);
  }
  absl::StatusOr<uint8_t*> Get(size_t bytes) {
    if (bytes > size_) {
      if (p_ != nullptr) cudaFreeHost(p_);
      p_ = nullptr;
      size_ = 0;
      HALKA_CUDA_RETURN(cudaHostAlloc(&p_, bytes, cudaHostAllocDefault),
                        "cudaHostAlloc");
      size_ = bytes;
    }
    return static_cast<uint8_t*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

class Scratch {
 public:
  ~Scratch() {
    if (p_ != nullptr) cudaFree(p_);
  }
  absl::StatusOr<uint8_t*> Get(size_t bytes) {
    if (bytes > size_) {
      if (p_ != nullptr) cudaFree(p_);
      p_ = nullptr;
      size_ = 0;
      HALKA_CUDA_RETURN(cudaMalloc(&p_, bytes), "cudaMalloc");
      size_ = bytes;
    }
    return static_cast<uint8_t*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

class CudaContext;

// Apply's slice: small enough that the CPU's gathering of the next slice
// overlaps the GPU's work on this one, large enough that a slice's copies
// and kernel are not dominated by their launch costs.
constexpr size_t kSliceBytes = size_t{256} << 10;

class DeviceOpBuffer final : public OpBuffer {
 public:
  DeviceOpBuffer(CudaContext* ctx, uint8_t* data) : ctx_(ctx), data_(data) {}
  absl::Status Begin(DType dtype, ReduceOp op, size_t count) override;
  absl::StatusOr<const uint8_t*> HostView(size_t offset, size_t count) override;
  absl::Status Apply(bool reduce, size_t offset, size_t count,
                     const InFrame& frame) override;
  absl::Status FinalizeAvg(size_t offset, size_t count, int divisor) override;
  absl::Status WriteBack(const uint8_t* host, size_t offset,
                         size_t count) override;
  absl::Status End() override;
  std::string Where() const override;

 private:
  // Every entry point first makes the context's device current in the
  // calling thread (cudaSetDevice binds its primary context there): the
  // collectives call from whichever worker thread runs the operation, and a
  // thread that never touched CUDA would otherwise use device 0, or no
  // context at all for driver calls.
  absl::Status Bind() const;

  CudaContext* const ctx_;
  uint8_t* const data_;
  DType dtype_ = DType::kFloat32;
  ReduceOp op_ = ReduceOp::kSum;
  size_t es_ = 4;
  uint8_t* mirror_ = nullptr;
  // The element range whose mirror bytes equal the device's since the last
  // Apply (a copy leaves the payload there, a reduce copies its result
  // back within the same stream synchronisation): HostView of exactly that
  // range -- what the ring and broadcast send right after an Apply -- needs
  // no device-to-host copy. Empty after anything else writes the device.
  size_t fresh_offset_ = 0;
  size_t fresh_count_ = 0;
  bool Fresh(size_t offset, size_t count) const {
    return count > 0 && offset == fresh_offset_ && count == fresh_count_;
  }
  void SetFresh(size_t offset, size_t count) {
    fresh_offset_ = offset;
    fresh_count_ = count;
  }
};

class CudaContext final : public DeviceContext {
 public:
  explicit CudaContext(int device) : device_(device) {}
  ~CudaContext() override {
    cudaSetDevice(device_);
    for (auto& [key, ptr] : opened_) cudaIpcCloseMemHandle(ptr);
    for (cudaStream_t s : streams_) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  }
  absl::Status Init() {
    HALKA_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    for (cudaStream_t& s : streams_) {
      HALKA_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                        "cudaStreamCreate");
    }
    return absl::OkStatus();
  }
  int device() const override { return device_; }

  absl::StatusOr<void*> Resolve(const DeviceHandle& h) override {
    if (h.pid == static_cast<uint64_t>(getpid())) {
      return reinterpret_cast<void*>(h.pointer);
    }
    if (h.ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
      return absl::InvalidArgumentError("device tensor: malformed IPC handle");
    }
    absl::MutexLock lock(&mu_);
    auto it = opened_.find(h.ipc_handle);
    if (it == opened_.end()) {
      cudaIpcMemHandle_t handle;
      std::memcpy(&handle, h.ipc_handle.data(), sizeof(handle));
      HALKA_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
      void* p = nullptr;
      HALKA_CUDA_RETURN(
          cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess),
          "cudaIpcOpenMemHandle");
      it = opened_.emplace(h.ipc_handle, p).first;
    }
    return static_cast<uint8_t*>(it->second) + h.offset;
  }

  std::unique_ptr<OpBuffer> MakeBuffer(void* data) override {
    return std::make_unique<DeviceOpBuffer>(this, static_cast<uint8_t*>(data));
  }

  // Stream 0 serves everything; Apply alternates its slices between the
  // streams so that one slice's host-to-device copy, another's kernel and a
  // third's copy back can run at once (separate copy engines).
  static constexpr int kStreams = 2;
  cudaStream_t stream(int i = 0) const { return streams_[i]; }
  // Waits for every stream; the first error.
  absl::Status SynchronizeAll(const char* what) const {
    absl::Status first;
    for (cudaStream_t s : streams_) {
      absl::Status st = CudaError(cudaStreamSynchronize(s), what);
      if (first.ok()) first = st;
    }
    return first;
  }
  Pinned& mirror() { return mirror_; }
  Pinned& staging() { return staging_; }
  Scratch& scratch() { return scratch_; }

 private:
  const int device_;
  cudaStream_t streams_[kStreams] = {};
  absl::Mutex mu_;
  std::map<std::string, void*> opened_ ABSL_GUARDED_BY(mu_);
  // One operation runs at a time per worker, so one set of staging areas.
  Pinned mirror_;
  Pinned staging_;
  Scratch scratch_;
};

absl::Status DeviceOpBuffer::Bind() const {
  return CudaError(cudaSetDevice(ctx_->device()), "cudaSetDevice");
}

absl::Status DeviceOpBuffer::Begin(DType dtype, ReduceOp op, size_t count) {
  dtype_ = dtype;
  op_ = op;
  es_ = DTypeSize(dtype);
  if (absl::Status b = Bind(); !b.ok()) return b;
  absl::StatusOr<uint8_t*> m = ctx_->mirror().Get(std::max<size_t>(count * es_, 1));
  if (!m.ok()) return m.status();
  mirror_ = *m;
  SetFresh(0, 0);
  return absl::OkStatus();
}

absl::StatusOr<const uint8_t*> DeviceOpBuffer::HostView(size_t offset,
                                                        size_t count) {
  if (absl::Status b = Bind(); !b.ok()) return b;
  const size_t bytes = count * es_;
  if (bytes == 0 || Fresh(offset, count)) return mirror_ + offset * es_;
  HALKA_CUDA_RETURN(cudaMemcpyAsync(mirror_ + offset * es_, data_ + offset * es_,
                                    bytes, cudaMemcpyDeviceToHost,
                                    ctx_->stream()),
                    "device-to-host copy");
  HALKA_CUDA_RETURN(cudaStreamSynchronize(ctx_->stream()), "device-to-host copy");
  return mirror_ + offset * es_;
}

absl::Status DeviceOpBuffer::Apply(bool reduce, size_t offset, size_t count,
                                   const InFrame& frame) {
  if (absl::Status b = Bind(); !b.ok()) return b;
  const size_t bytes = count * es_;
  if (bytes == 0) return absl::OkStatus();
  SetFresh(0, 0);
  // The payload goes through pinned memory (the mirror's range is free: the
  // algorithms never overwrite a range the wire still reads) in slices: the
  // CPU gathers slice k+1 while the GPU copies, reduces and copies back
  // slice k; slices alternate between the context's streams, and every
  // stream is synchronised once at the end, on errors too (no copy may
  // still write the mirror after Apply returns).
  uint8_t* host = mirror_ + offset * es_;
  uint8_t* dev = data_ + offset * es_;
  uint8_t* scratch = nullptr;
  if (reduce) {
    absl::StatusOr<uint8_t*> got = ctx_->scratch().Get(bytes);
    if (!got.ok()) return got.status();
    scratch = *got;
  }
  auto enqueue = [&]() -> absl::Status {
    const size_t slice = std::max(es_, kSliceBytes / es_ * es_);
    int k = 0;
    for (size_t from = 0; from < bytes; from += slice, ++k) {
      const size_t n = std::min(slice, bytes - from);
      // Slices touch disjoint ranges of the mirror, scratch and tensor.
      cudaStream_t s = ctx_->stream(k % CudaContext::kStreams);
      CopyPayloadBytes(frame, from, n, host + from);
      if (!reduce) {
        HALKA_CUDA_RETURN(cudaMemcpyAsync(dev + from, host + from, n,
                                          cudaMemcpyHostToDevice, s),
                          "host-to-device copy");
        continue;
      }
      HALKA_CUDA_RETURN(cudaMemcpyAsync(scratch + from, host + from, n,
                                        cudaMemcpyHostToDevice, s),
                        "host-to-device copy");
      absl::Status r =
          CudaReduceInto(dtype_, op_, dev + from, scratch + from, n / es_, s);
      if (!r.ok()) return r;
      // The result back into the mirror: the range is sent next, and this
      // saves HostView a copy and a synchronisation.
      HALKA_CUDA_RETURN(cudaMemcpyAsync(host + from, dev + from, n,
                                        cudaMemcpyDeviceToHost, s),
                        "device-to-host copy");
    }
    return absl::OkStatus();
  };
  absl::Status status = enqueue();
  absl::Status synced = ctx_->SynchronizeAll(reduce ? "reduce kernel"
                                                    : "host-to-device copy");
  if (!status.ok()) return status;
  if (!synced.ok()) return synced;
  SetFresh(offset, count);
  return absl::OkStatus();
}

absl::Status DeviceOpBuffer::FinalizeAvg(size_t offset, size_t count,
                                         int divisor) {
  if (absl::Status b = Bind(); !b.ok()) return b;
  const bool fresh = Fresh(offset, count);
  SetFresh(0, 0);
  absl::Status s = CudaFinalizeAvg(dtype_, data_ + offset * es_, count, divisor,
                                   ctx_->stream());
  if (!s.ok()) return s;
  if (fresh) {  // keep the mirror equal to the device for the send
    HALKA_CUDA_RETURN(cudaMemcpyAsync(mirror_ + offset * es_,
                                      data_ + offset * es_, count * es_,
                                      cudaMemcpyDeviceToHost, ctx_->stream()),
                      "device-to-host copy");
  }
  HALKA_CUDA_RETURN(cudaStreamSynchronize(ctx_->stream()), "average kernel");
  if (fresh) SetFresh(offset, count);
  return absl::OkStatus();
}

absl::Status DeviceOpBuffer::WriteBack(const uint8_t* host, size_t offset,
                                       size_t count) {
  if (absl::Status b = Bind(); !b.ok()) return b;
  if (count == 0) return absl::OkStatus();
  SetFresh(0, 0);
  HALKA_CUDA_RETURN(cudaMemcpyAsync(data_ + offset * es_, host, count * es_,
                                    cudaMemcpyHostToDevice, ctx_->stream()),
                    "host-to-device copy");
  HALKA_CUDA_RETURN(cudaStreamSynchronize(ctx_->stream()), "host-to-device copy");
  return absl::OkStatus();
}

absl::Status DeviceOpBuffer::End() {
  if (absl::Status b = Bind(); !b.ok()) return b;
  return ctx_->SynchronizeAll("end of operation");
}

std::string DeviceOpBuffer::Where() const {
  return absl::StrCat("cuda:", ctx_->device());
}

}  // namespace

bool DeviceTensorsCompiled() { return true; }

absl::StatusOr<DeviceHandle> ExportDevicePointer(const void* ptr) {
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) return devices.status();
  RealPointerApi api;
  return ExportDevicePointerWith(api, ptr);
}

namespace {

// The device of `ptr`, made current; INVALID_ARGUMENT for host memory.
absl::StatusOr<int> UseDeviceOf(const void* ptr) {
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) return devices.status();
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess ||
      attr.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    return absl::InvalidArgumentError(
        "device tensors: the pointer is not CUDA device memory");
  }
  HALKA_CUDA_RETURN(cudaSetDevice(attr.device), "cudaSetDevice");
  return attr.device;
}

}  // namespace

absl::Status CopyDeviceMemory(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return absl::OkStatus();
  absl::StatusOr<int> device = UseDeviceOf(dst);
  if (!device.ok()) return device.status();
  if (absl::StatusOr<int> from = UseDeviceOf(src); !from.ok()) {
    return from.status();
  }
  HALKA_CUDA_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault),
                    "cudaMemcpy");
  return absl::OkStatus();
}

absl::StatusOr<void*> AllocateDeviceMemory(const void* like, size_t bytes) {
  absl::StatusOr<int> device = UseDeviceOf(like);
  if (!device.ok()) return device.status();
  void* p = nullptr;
  if (cudaMalloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "device tensors: cannot allocate ", bytes, " bytes of scratch on cuda:",
        *device));
  }
  return p;
}

void FreeDeviceMemory(void* ptr) {
  if (ptr != nullptr) cudaFree(ptr);
}

absl::StatusOr<std::unique_ptr<DeviceContext>> DeviceContext::Open(int device) {
  absl::StatusOr<int> n = CudaDeviceCount();
  if (!n.ok()) return n.status();
  if (device < 0 || device >= *n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", device, " does not exist (", *n, " CUDA devices)"));
  }
  auto ctx = std::make_unique<CudaContext>(device);
  absl::Status s = ctx->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<DeviceContext>(std::move(ctx));
}

}  // namespace halka
