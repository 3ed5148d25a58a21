// The SDK's client as its own files see it (not a public header): the
// regions this process shares (Registry) and Client::Impl, whose calls are
// split over client.cc (the transfer: shared memory, sessions, inline),
// collectives.cc (the host collectives) and device_calls.cc (device
// tensors).
//
// Thread-safety: Registry under its mutex; Client::Impl as halka/client.h
// says of Client (staging_mu_ and device_mu_ guard the scratch objects).
#ifndef HALKA_CLIENT_CLIENT_IMPL_H_
#define HALKA_CLIENT_CLIENT_IMPL_H_

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/op_spec.h"
#include "client/shm_session.h"
#include "common/grpc_util.h"
#include "common/in_process.h"
#include "common/held_shm.h"
#include "core/cuda/device_memory.h"
#include "halka/client.h"
#include "halka/v1/worker.grpc.pb.h"

namespace halka {

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

// A caller id for OpSpec.caller_id: random and never 0.
uint64_t NewCallerId();

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

  // The worker of this process this client dials (common/in_process.h),
  // looked up until found (then kept: once it stopped, calls fail
  // UNAVAILABLE unless another took its address); null when
  // Options::in_process is off or the transfer is forced.
  std::shared_ptr<InProcessWorker> InProcess();
  // Runs the call on that worker, on this thread, over the caller's
  // buffer where it is the whole operation's (else over in_process_scratch_).
  absl::StatusOr<OpInfo> RunInProcess(InProcessWorker& w, v1::OpSpec spec,
                                      const Io& io);
  absl::Mutex in_process_mu_;
  std::shared_ptr<InProcessWorker> in_process_ ABSL_GUARDED_BY(in_process_mu_);
  absl::Mutex scratch_mu_;  // held for a whole in-process staged call
  std::vector<uint8_t> in_process_scratch_ ABSL_GUARDED_BY(scratch_mu_);

  absl::Mutex device_mu_;  // held for a whole device reduce-scatter
  void* device_scratch_ ABSL_GUARDED_BY(device_mu_) = nullptr;
  size_t device_scratch_size_ ABSL_GUARDED_BY(device_mu_) = 0;
};

}  // namespace halka

#endif  // HALKA_CLIENT_CLIENT_IMPL_H_
