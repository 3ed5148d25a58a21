// Workers of this process that a Client of the same process calls
// directly: the operation runs on the caller's thread, over the caller's
// buffer, with no session, no gRPC call and no copy into shared memory.
//
// Why: a trainer that embeds its worker (halka.torch, EmbeddedWorker,
// LocalCluster, `halkactl bench --workers`) otherwise pays two thread
// wake-ups per operation (the caller's request to the session's thread,
// its answer back) and a copy of anything staged: for small buffers that
// is a third to a half of the operation (docs/performance.md).
//
// A worker registers under the address its clients dial (WorkerNode's
// address()) when it starts serving and closes its entry when it stops:
// a call that finds the entry closed fails UNAVAILABLE at once; calls
// already inside finish (the stop aborts their operations) and Close
// waits for them.
//
// Thread-safety: every function and every Entry method from any thread.
#ifndef HALKA_COMMON_IN_PROCESS_H_
#define HALKA_COMMON_IN_PROCESS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "halka/v1/worker.pb.h"

namespace halka {

class InProcessWorker {
 public:
  // As Worker.Run, with the operation's buffer at `data` (`bytes` long)
  // instead of a shared-memory object the request names.
  using RunFn = std::function<absl::Status(const v1::RunRequest& req,
                                           void* data, size_t bytes,
                                           v1::RunReply* reply)>;

  // Lists `run` under `address` until Close (a second worker under the
  // same address replaces the listing; the first keeps its entry).
  static std::shared_ptr<InProcessWorker> Register(const std::string& address,
                                                   RunFn run);
  // The open entry listed under `address`, or null.
  static std::shared_ptr<InProcessWorker> Find(const std::string& address);

  explicit InProcessWorker(RunFn run) : run_(std::move(run)) {}
  InProcessWorker(const InProcessWorker&) = delete;
  InProcessWorker& operator=(const InProcessWorker&) = delete;

  // Runs the call on this thread; nullopt once closed (nothing ran).
  std::optional<absl::Status> Run(const v1::RunRequest& req, void* data,
                                  size_t bytes, v1::RunReply* reply);
  // Refuses new calls from now on and unlists the entry.
  void Close();
  // Waits until no call is inside (after Close: for good).
  void Drain();
  bool closed() const;

 private:
  const RunFn run_;
  std::string address_;  // set once by Register
  int pid_ = 0;          // the process that registered it (a fork's child
                         // does not find it: its worker's threads are gone)
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int inside_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace halka

#endif  // HALKA_COMMON_IN_PROCESS_H_
