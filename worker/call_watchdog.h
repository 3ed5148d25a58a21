// Ends server-side calls whose deadline passed: one thread that cancels a
// registered gRPC call (ServerContext::TryCancel) when its time is up, so
// that a blocking Read in a synchronous handler returns. Used to bound
// inline uploads by the operation's deadline, whatever the client does.
// Thread-safe.
#ifndef HALKA_WORKER_CALL_WATCHDOG_H_
#define HALKA_WORKER_CALL_WATCHDOG_H_

#include <cstdint>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace halka {

class CallWatchdog {
 public:
  CallWatchdog();
  ~CallWatchdog();  // cancels nothing; joins the thread
  CallWatchdog(const CallWatchdog&) = delete;
  CallWatchdog& operator=(const CallWatchdog&) = delete;

  // Cancels `ctx` at `deadline` unless disarmed first. Scoped: the
  // destructor disarms; fired() says whether the deadline cancelled it.
  class Armed {
   public:
    Armed(CallWatchdog& dog, grpc::ServerContext* ctx, absl::Time deadline);
    ~Armed();
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;
    bool fired() const;

   private:
    CallWatchdog& dog_;
    const uint64_t id_;
  };

 private:
  struct Entry {
    grpc::ServerContext* ctx;
    absl::Time deadline;
    bool fired = false;
  };
  void Loop();

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace halka

#endif  // HALKA_WORKER_CALL_WATCHDOG_H_
