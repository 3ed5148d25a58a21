// ExportDevicePointerWith (core/cuda/device_export.h) against a fake
// of the CUDA calls that enforces the driver's rule: a call on an allocation
// (cuMemGetAddressRange, cudaIpcGetMemHandle) fails with "invalid context"
// unless a context is current in the calling thread. Threads start with
// none, as a DDP communication thread does. No GPU or CUDA needed.
#include "core/cuda/device_export.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace halka {
namespace {

class FakeCuda final : public CudaPointerApi {
 public:
  struct Allocation {
    size_t size;
    int device;
  };
  void Add(uintptr_t base, size_t size, int device) {
    allocations_[base] = Allocation{size, device};
  }

  absl::StatusOr<int> DeviceOf(const void* ptr) override {
    const Allocation* a = Find(reinterpret_cast<uintptr_t>(ptr), nullptr);
    if (a == nullptr) {
      return absl::InvalidArgumentError("not CUDA device memory (fake)");
    }
    return a->device;  // like cudaPointerGetAttributes: no context needed
  }
  absl::Status PushContext(int device) override {
    if (fail_push_) return absl::InternalError("push failed (fake)");
    Stack().push_back(device);
    retained_.fetch_add(1);
    return absl::OkStatus();
  }
  void PopContext(int device) override {
    EXPECT_FALSE(Stack().empty()) << "pop without push";
    if (Stack().empty()) return;
    EXPECT_EQ(Stack().back(), device);
    Stack().pop_back();
    retained_.fetch_sub(1);
  }
  absl::StatusOr<Range> AllocationOf(const void* ptr) override {
    if (Stack().empty()) {
      return absl::InternalError("CUDA_ERROR_INVALID_CONTEXT (fake)");
    }
    uintptr_t base = 0;
    const Allocation* a = Find(reinterpret_cast<uintptr_t>(ptr), &base);
    if (a == nullptr) return absl::InvalidArgumentError("no allocation (fake)");
    return Range{base, a->size};
  }
  absl::StatusOr<std::string> IpcHandle(uintptr_t base) override {
    if (Stack().empty()) {
      return absl::InternalError("CUDA_ERROR_INVALID_CONTEXT (fake)");
    }
    if (fail_ipc_) return absl::InternalError("cudaIpcGetMemHandle (fake)");
    std::string handle(64, '\0');
    std::memcpy(handle.data(), &base, sizeof(base));
    return handle;
  }
  uint64_t Pid() override { return 4242; }

  // Contexts this thread has pushed and not popped.
  static std::vector<int>& Stack() {
    static thread_local std::vector<int> stack;
    return stack;
  }
  int retained() const { return retained_.load(); }
  bool fail_ipc_ = false;
  bool fail_push_ = false;

 private:
  const Allocation* Find(uintptr_t p, uintptr_t* base) const {
    auto it = allocations_.upper_bound(p);
    if (it == allocations_.begin()) return nullptr;
    --it;
    if (p - it->first >= it->second.size) return nullptr;
    if (base != nullptr) *base = it->first;
    return &it->second;
  }
  std::map<uintptr_t, Allocation> allocations_;
  std::atomic<int> retained_{0};
};

constexpr uintptr_t kBase = 0x7f0000000000;

TEST(DeviceExport, TheFakeRefusesDriverCallsOnAFreshThread) {
  // Without this, the test below could pass against a fake that has no rule.
  FakeCuda cuda;
  cuda.Add(kBase, 1 << 20, 1);
  absl::Status status;
  std::thread([&] {
    status = cuda.AllocationOf(reinterpret_cast<const void*>(kBase + 64))
                 .status();
  }).join();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("INVALID_CONTEXT"), std::string::npos);
}

TEST(DeviceExport, WorksFromFreshThreadsAndLeavesNoContextBehind) {
  FakeCuda cuda;
  cuda.Add(kBase, 1 << 20, 1);
  cuda.Add(kBase + (2 << 20), 4096, 0);
  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<DeviceHandle>> results(
      kThreads, absl::UnknownError("not run"));
  std::vector<size_t> left_pushed(kThreads, 99);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const uintptr_t p =
          t % 2 == 0 ? kBase + 256 * t : kBase + (2 << 20) + 8 * t;
      results[t] =
          ExportDevicePointerWith(cuda, reinterpret_cast<const void*>(p));
      left_pushed[t] = FakeCuda::Stack().size();
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(results[t].ok()) << "thread " << t << ": " << results[t].status();
    const DeviceHandle& h = *results[t];
    const bool first = t % 2 == 0;
    EXPECT_EQ(h.device, first ? 1 : 0);
    EXPECT_EQ(h.offset, first ? 256u * t : 8u * t);
    EXPECT_EQ(h.pointer, (first ? kBase : kBase + (2 << 20)) + h.offset);
    EXPECT_EQ(h.pid, 4242u);
    uintptr_t base = 0;
    ASSERT_EQ(h.ipc_handle.size(), 64u);
    std::memcpy(&base, h.ipc_handle.data(), sizeof(base));
    EXPECT_EQ(base, first ? kBase : kBase + (2 << 20));
    EXPECT_EQ(left_pushed[t], 0u) << "thread " << t << " kept a context";
  }
  EXPECT_EQ(cuda.retained(), 0);
}

TEST(DeviceExport, BadPointersAndFailuresAreClearErrorsAndPopTheContext) {
  FakeCuda cuda;
  cuda.Add(kBase, 4096, 0);
  int host_value = 0;
  auto host = ExportDevicePointerWith(cuda, &host_value);
  EXPECT_EQ(host.status().code(), absl::StatusCode::kInvalidArgument);
  auto null = ExportDevicePointerWith(cuda, nullptr);
  EXPECT_EQ(null.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(null.status().message().find("null"), std::string::npos);

  cuda.fail_ipc_ = true;
  auto ipc = ExportDevicePointerWith(cuda, reinterpret_cast<const void*>(kBase));
  EXPECT_EQ(ipc.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(ipc.status().message().find("cudaIpcGetMemHandle"),
            std::string::npos);
  EXPECT_TRUE(FakeCuda::Stack().empty());
  EXPECT_EQ(cuda.retained(), 0);

  cuda.fail_ipc_ = false;
  cuda.fail_push_ = true;
  auto push = ExportDevicePointerWith(cuda, reinterpret_cast<const void*>(kBase));
  EXPECT_EQ(push.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(FakeCuda::Stack().empty());
}

}  // namespace
}  // namespace halka
