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
#include "core/cuda/cuda_reduce.h"
#include "core/cuda/device_memory.h"
#include "core/testing/reference.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

using ::testing::HasSubstr;
using halka::testing::RunRanks;

// A LocalCluster of `g` workers and one client per rank.
std::pair<std::unique_ptr<LocalCluster>, std::vector<std::unique_ptr<Client>>>
StartCluster(int g) {
  LocalCluster::Options o;
  o.workers = g;
  auto cluster = LocalCluster::Start(o).value();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < g; ++r) clients.push_back(cluster->Connect(r).value());
  return {std::move(cluster), std::move(clients)};
}

// A device call on host memory fails clearly: INVALID_ARGUMENT where there
// is a GPU; without a driver or device the client says so (UNAVAILABLE).
void ExpectNoDeviceMemoryError(const absl::StatusOr<OpInfo>& r) {
  ASSERT_FALSE(r.ok());
  if (!CudaDeviceCount().ok()) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
    EXPECT_THAT(std::string(r.status().message()),
                ::testing::AnyOf(HasSubstr("no CUDA device"), HasSubstr("without CUDA")));
  } else {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
}

TEST(DeviceTensors, RingOnOneGpuMatchesTheHostRing) {
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();  // "no CUDA device: ..."
  const int g = 4;
  auto started = StartCluster(g);
  std::vector<std::unique_ptr<Client>>& clients = started.second;
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

TEST(DeviceTensors, AllGatherAndReduceScatterMatchTheReference) {
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();  // "no CUDA device: ..."
  const int g = 3;
  auto started = StartCluster(g);
  std::vector<std::unique_ptr<Client>>& clients = started.second;
  const size_t n = 100003;  // elements per slice
  for (DType dtype : kAllDTypes) {
    const size_t es = DTypeSize(dtype);
    for (bool in_place : {false, true}) {
      std::vector<std::vector<uint8_t>> inputs;
      std::vector<CudaBuffer> send, recv;
      for (int r = 0; r < g; ++r) {
        inputs.push_back(MakeRankData(dtype, ReduceOp::kSum, n, r, 6));
        send.push_back(CudaBuffer::Allocate(n * es).value());
        recv.push_back(CudaBuffer::Allocate(g * n * es).value());
        uint8_t* at = in_place ? static_cast<uint8_t*>(recv[r].data()) + r * n * es
                               : static_cast<uint8_t*>(send[r].data());
        ASSERT_TRUE(CudaCopyToDevice(at, inputs[r].data(), n * es).ok());
      }
      auto res = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
        const void* from = in_place ? static_cast<uint8_t*>(recv[r].data()) + r * n * es
                                    : send[r].data();
        return clients[r]->AllGatherDevice(from, n, recv[r].data(), g * n, dtype);
      });
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(res[r].ok()) << res[r].status();
        std::vector<uint8_t> out(g * n * es);
        ASSERT_TRUE(CudaCopyToHost(out.data(), recv[r].data(), out.size()).ok());
        const CheckResult check = CheckAllGather(dtype, inputs, out.data(), n);
        EXPECT_EQ(check.wrong, 0u) << DTypeName(dtype) << " rank " << r << ": " << check.first;
      }
    }
    for (ReduceOp op : kAllReduceOps) {
      std::vector<std::vector<uint8_t>> inputs;
      std::vector<CudaBuffer> send, recv;
      for (int r = 0; r < g; ++r) {
        inputs.push_back(MakeRankData(dtype, op, g * n, r, 8));
        send.push_back(CudaBuffer::Allocate(g * n * es).value());
        recv.push_back(CudaBuffer::Allocate(n * es).value());
        ASSERT_TRUE(CudaCopyToDevice(send[r].data(), inputs[r].data(), g * n * es).ok());
      }
      auto res = RunRanks<absl::StatusOr<OpInfo>>(g, [&](int r) {
        return clients[r]->ReduceScatterDevice(send[r].data(), g * n, recv[r].data(), n,
                                               dtype, op);
      });
      for (int r = 0; r < g; ++r) {
        ASSERT_TRUE(res[r].ok()) << res[r].status();
        std::vector<uint8_t> out(n * es), kept(g * n * es);
        ASSERT_TRUE(CudaCopyToHost(out.data(), recv[r].data(), out.size()).ok());
        ASSERT_TRUE(CudaCopyToHost(kept.data(), send[r].data(), kept.size()).ok());
        const CheckResult check = CheckReduceScatter(dtype, op, inputs, out.data(), r, n);
        EXPECT_EQ(check.wrong, 0u) << DTypeName(dtype) << " " << ReduceOpName(op)
                                   << " rank " << r << ": " << check.first;
        EXPECT_EQ(kept, inputs[r]) << "rank " << r << ": send changed";
      }
    }
  }
}

TEST(DeviceTensorsFallback, SliceCollectivesCheckTheirArgumentsFirst) {
  auto started = StartCluster(1);
  Client* client = started.second[0].get();
  std::vector<float> host(16, 1.0f);
  // Refused by the SDK whatever the machine has: null buffers, bad enums.
  EXPECT_EQ(client->AllGatherDevice(nullptr, 4, host.data(), 4, DType::kFloat32)
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->ReduceScatterDevice(host.data(), 4, nullptr, 4, DType::kFloat32,
                                        ReduceOp::kSum)
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->ReduceScatterDevice(host.data(), 4, host.data(), 4, DType::kFloat32,
                                        static_cast<ReduceOp>(42))
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  // Host memory: no device there (or none at all), said clearly.
  for (auto r : {client->AllGatherDevice(host.data(), 4, host.data() + 4, 4,
                                         DType::kFloat32),
                 client->ReduceScatterDevice(host.data(), 4, host.data() + 8, 4,
                                             DType::kFloat32, ReduceOp::kSum)}) {
    ExpectNoDeviceMemoryError(r);
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
  ExpectNoDeviceMemoryError(client->AllReduceDevice(
      host.data(), host.size(), DType::kFloat32, ReduceOp::kSum));
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
