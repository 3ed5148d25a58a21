// The SDK's calls on CUDA device tensors (Client::*Device): the worker
// maps the caller's memory through a CUDA IPC handle (same host only) and
// reduces in place; a reduce-scatter runs on a device scratch copy so that
// `send` stays unchanged.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client_impl.h"
#include "client/op_spec.h"
#include "common/clock.h"
#include "core/cuda/device_memory.h"

namespace halka {

absl::StatusOr<OpInfo> Client::Impl::RunDevice(
    absl::StatusOr<v1::OpSpec> checked, void* device_data) {
  if (!checked.ok()) return checked.status();
  v1::OpSpec& spec = *checked;
  if (absl::Status s = CheckGroups(spec); !s.ok()) return s;
  spec.set_issued_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(halka::Now())));
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

}  // namespace halka
