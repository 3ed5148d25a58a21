// Device tensors end to end: the SDK hands a CUDA pointer to the local
// worker, which reduces it in place on the GPU. Runs for real where there is
// a GPU; elsewhere the device tests skip ("no CUDA device") and the
// fallback tests check the errors.
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "tests/testing/run_ranks.h"
#include "worker/core/cuda/cuda_reduce.h"
#include "worker/core/cuda/device_memory.h"
#include "worker/core/reference.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::RunRanks;

TEST(DeviceTensors, RingOnOneGpuMatchesTheHostRing) {
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();  // "no CUDA device: ..."
  const int g = 4;
  LocalCluster::Options o;
  o.workers = g;
  auto cluster = LocalCluster::Start(o).value();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < g; ++r) clients.push_back(cluster->Connect(r).value());
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (Algorithm algo : {Algorithm::kRing, Algorithm::kNaive}) {
        const size_t count = 300007;
        const size_t bytes = count * DTypeSize(dtype);
        std::vector<std::vector<uint8_t>> inputs, host_bufs;
        std::vector<CudaBuffer> dev;
        for (int r = 0; r < g; ++r) {
          inputs.push_back(MakeRankData(dtype, op, count, r, 5));
          dev.push_back(CudaBuffer::Allocate(bytes).value());
          ASSERT_TRUE(CudaCopyToDevice(dev[r].data(), inputs[r].data(), bytes).ok());
        }
        host_bufs = inputs;
        auto dres = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
          OpOptions oo;
          oo.algorithm = algo;
          return clients[r]->AllReduceDevice(dev[r].data(), count, dtype, op, oo);
        });
        auto hres = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
          OpOptions oo;
          oo.algorithm = algo;
          return clients[r]->AllReduce(host_bufs[r].data(), count, dtype, op, oo);
        });
        for (int r = 0; r < g; ++r) {
          ASSERT_TRUE(dres[r].ok()) << dres[r].status();
          ASSERT_TRUE(hres[r].ok()) << hres[r].status();
          std::vector<uint8_t> out(bytes);
          ASSERT_TRUE(CudaCopyToHost(out.data(), dev[r].data(), bytes).ok());
          // Same algorithm, same reduction order: the GPU's bits equal the
          // host ring's (NaN payloads aside; the inputs have none).
          EXPECT_EQ(out, host_bufs[r]) << DTypeName(dtype) << " " << ReduceOpName(op)
                                       << " " << AlgorithmName(algo) << " rank " << r;
        }
      }
    }
  }
}

// The first H200 run failed here: a thread that had made no CUDA call had no
// current context, and the driver's cuMemGetAddressRange refused the
// pointer ("not CUDA device memory"). Every call below is a new thread's
// first CUDA call.
TEST(DeviceTensors, ExportWorksFromFreshThreads) {
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();  // "no CUDA device: ..."
  CudaBuffer buffer = CudaBuffer::Allocate(1 << 20).value();
  constexpr int kThreads = 6;
  std::vector<absl::StatusOr<DeviceHandle>> handles(
      kThreads, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      handles[t] = ExportDevicePointer(static_cast<uint8_t*>(buffer.data()) + 4096 * t);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(handles[t].ok()) << "thread " << t << ": " << handles[t].status();
    EXPECT_EQ(handles[t]->offset, 4096u * t);
    EXPECT_EQ(handles[t]->ipc_handle, handles[0]->ipc_handle);
  }
}

TEST(DeviceTensorsFallback, HostPointerOrNoGpuGivesAClearError) {
  LocalCluster::Options o;
  o.workers = 1;
  auto cluster = LocalCluster::Start(o).value();
  auto client = cluster->Connect(0).value();
  std::vector<float> host(16, 1.0f);
  auto r = client->AllReduceDevice(host.data(), host.size(), DType::kFloat32,
                                   ReduceOp::kSum);
  ASSERT_FALSE(r.ok());
  if (!CudaDeviceCount().ok()) {
    // No driver or no device: the client says so, it does not crash.
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
    EXPECT_THAT(std::string(r.status().message()),
                ::testing::AnyOf(HasSubstr("no CUDA device"), HasSubstr("without CUDA")));
  } else {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
  // Host tensors keep working on the CPU path either way.
  auto ok = client->AllReduce(absl::MakeSpan(host), ReduceOp::kSum);
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(DeviceTensorsFallback, ExplicitUnusableDeviceIsAnErrorAtStart) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a CUDA device is present";
  WorkerOptions o;
  o.rendezvous = "127.0.0.1:1";
  o.cuda_device = 0;
  auto node = WorkerNode::Create(o);
  ASSERT_FALSE(node.ok());
  EXPECT_THAT(std::string(node.status().message()), HasSubstr("--device=0 is unusable"));
}

}  // namespace
}  // namespace halka
