// Device tensors with the CUDA runtime.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/core/cuda/cuda_reduce.h"
#include "worker/core/cuda/device_memory.h"
#include "worker/core/payload.h"

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

// cuMemGetAddressRange through the runtime's driver entry point, so that
// nothing links libcuda directly (it is absent on machines without a GPU).
using GetAddressRangeFn = int (*)(uintptr_t* base, size_t* size, uintptr_t ptr);

absl::StatusOr<std::pair<uintptr_t, size_t>> AllocationOf(const void* ptr) {
  static GetAddressRangeFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      f = nullptr;
    }
    return reinterpret_cast<GetAddressRangeFn>(f);
  }();
  if (fn == nullptr) {
    return absl::UnavailableError("device tensors: no CUDA driver entry point "
                                  "for cuMemGetAddressRange");
  }
  uintptr_t base = 0;
  size_t size = 0;
  if (fn(&base, &size, reinterpret_cast<uintptr_t>(ptr)) != 0) {
    return absl::InvalidArgumentError(
        "device tensors: the pointer is not CUDA device memory");
  }
  return std::make_pair(base, size);
}

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
  CudaContext* const ctx_;
  uint8_t* const data_;
  DType dtype_ = DType::kFloat32;
  ReduceOp op_ = ReduceOp::kSum;
  size_t es_ = 4;
  uint8_t* mirror_ = nullptr;
};

class CudaContext final : public DeviceContext {
 public:
  explicit CudaContext(int device) : device_(device) {}
  ~CudaContext() override {
    cudaSetDevice(device_);
    for (auto& [key, ptr] : opened_) cudaIpcCloseMemHandle(ptr);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  absl::Status Init() {
    HALKA_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    HALKA_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                      "cudaStreamCreate");
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

  cudaStream_t stream() const { return stream_; }
  Pinned& mirror() { return mirror_; }
  Pinned& staging() { return staging_; }
  Scratch& scratch() { return scratch_; }

 private:
  const int device_;
  cudaStream_t stream_ = nullptr;
  absl::Mutex mu_;
  std::map<std::string, void*> opened_ ABSL_GUARDED_BY(mu_);
  // One operation runs at a time per worker, so one set of staging areas.
  Pinned mirror_;
  Pinned staging_;
  Scratch scratch_;
};

absl::Status DeviceOpBuffer::Begin(DType dtype, ReduceOp op, size_t count) {
  dtype_ = dtype;
  op_ = op;
  es_ = DTypeSize(dtype);
  HALKA_CUDA_RETURN(cudaSetDevice(ctx_->device()), "cudaSetDevice");
  absl::StatusOr<uint8_t*> m = ctx_->mirror().Get(std::max<size_t>(count * es_, 1));
  if (!m.ok()) return m.status();
  mirror_ = *m;
  return absl::OkStatus();
}

absl::StatusOr<const uint8_t*> DeviceOpBuffer::HostView(size_t offset,
                                                        size_t count) {
  const size_t bytes = count * es_;
  if (bytes == 0) return mirror_ + offset * es_;
  HALKA_CUDA_RETURN(cudaMemcpyAsync(mirror_ + offset * es_, data_ + offset * es_,
                                    bytes, cudaMemcpyDeviceToHost,
                                    ctx_->stream()),
                    "device-to-host copy");
  HALKA_CUDA_RETURN(cudaStreamSynchronize(ctx_->stream()), "device-to-host copy");
  return mirror_ + offset * es_;
}

absl::Status DeviceOpBuffer::Apply(bool reduce, size_t offset, size_t count,
                                   const InFrame& frame) {
  const size_t bytes = count * es_;
  if (bytes == 0) return absl::OkStatus();
  // Gather the payload's pieces into pinned memory: the mirror's range is
  // free (the algorithms never overwrite a range the wire still reads).
  uint8_t* host = mirror_ + offset * es_;
  ApplyPayload(dtype_, op_, /*reduce=*/false, host, frame);
  cudaStream_t s = ctx_->stream();
  if (!reduce) {
    HALKA_CUDA_RETURN(cudaMemcpyAsync(data_ + offset * es_, host, bytes,
                                      cudaMemcpyHostToDevice, s),
                      "host-to-device copy");
  } else {
    absl::StatusOr<uint8_t*> scratch = ctx_->scratch().Get(bytes);
    if (!scratch.ok()) return scratch.status();
    HALKA_CUDA_RETURN(cudaMemcpyAsync(*scratch, host, bytes,
                                      cudaMemcpyHostToDevice, s),
                      "host-to-device copy");
    absl::Status r = CudaReduceInto(dtype_, op_, data_ + offset * es_,
                                    *scratch, count, s);
    if (!r.ok()) return r;
  }
  HALKA_CUDA_RETURN(cudaStreamSynchronize(s), "reduce kernel");
  return absl::OkStatus();
}

absl::Status DeviceOpBuffer::FinalizeAvg(size_t offset, size_t count,
                                         int divisor) {
  absl::Status s = CudaFinalizeAvg(dtype_, data_ + offset * es_, count, divisor,
                                   ctx_->stream());
  if (!s.ok()) return s;
  HALKA_CUDA_RETURN(cudaStreamSynchronize(ctx_->stream()), "average kernel");
  return absl::OkStatus();
}

absl::Status DeviceOpBuffer::WriteBack(const uint8_t* host, size_t offset,
                                       size_t count) {
  if (count == 0) return absl::OkStatus();
  HALKA_CUDA_RETURN(cudaMemcpyAsync(data_ + offset * es_, host, count * es_,
                                    cudaMemcpyHostToDevice, ctx_->stream()),
                    "host-to-device copy");
  HALKA_CUDA_RETURN(cudaStreamSynchronize(ctx_->stream()), "host-to-device copy");
  return absl::OkStatus();
}

absl::Status DeviceOpBuffer::End() {
  HALKA_CUDA_RETURN(cudaStreamSynchronize(ctx_->stream()), "end of operation");
  return absl::OkStatus();
}

std::string DeviceOpBuffer::Where() const {
  return absl::StrCat("cuda:", ctx_->device());
}

}  // namespace

bool DeviceTensorsCompiled() { return true; }

absl::StatusOr<DeviceHandle> ExportDevicePointer(const void* ptr) {
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) return devices.status();
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess ||
      attr.type != cudaMemoryTypeDevice) {
    cudaGetLastError();  // clear the sticky-free error state
    return absl::InvalidArgumentError(
        "device tensors: the pointer is not CUDA device memory");
  }
  auto range = AllocationOf(ptr);
  if (!range.ok()) return range.status();
  cudaIpcMemHandle_t handle;
  HALKA_CUDA_RETURN(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(range->first)),
                    "cudaIpcGetMemHandle");
  DeviceHandle h;
  h.device = attr.device;
  h.ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  h.offset = reinterpret_cast<uintptr_t>(ptr) - range->first;
  h.pid = static_cast<uint64_t>(getpid());
  h.pointer = reinterpret_cast<uintptr_t>(ptr);
  return h;
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
