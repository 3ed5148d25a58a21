// A halka torch group's lane (torch_group.h): its operations run one by
// one, in issue order, on the lane's thread; and the stop's wait for them,
// which names a lane that holds it.
#ifndef HALKA_CLIENT_PYTHON_TORCH_LANE_H_
#define HALKA_CLIENT_PYTHON_TORCH_LANE_H_

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "torch_work.h"

namespace halka::torch_backend {

// One queued operation: its Work, what runs it, its name (logs).
struct LaneItem {
  c10::intrusive_ptr<HalkaWork> work;
  std::function<absl::Status()> run;
  const char* name = "";
};

struct Lane {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<LaneItem> queue;
  bool stop = false;
  bool busy = false;  // an operation of it runs (WaitIdle)
  const char* running = "(nothing: between operations)";  // the log below
  std::thread thread;

  // After `stop` is set: waits for the running and queued operations
  // (each bounded by its deadline), then joins the thread. A wait that
  // takes long names the lane (`what`), its running operation and its
  // queue on stderr every 5 s since `start`, so a process that does not
  // exit says which operation holds it.
  void Drain(const char* what, int rank, int size,
             std::chrono::steady_clock::time_point start) {
    for (;;) {
      std::unique_lock<std::mutex> l(mu);
      if (cv.wait_for(l, std::chrono::seconds(5),
                      [this] { return !busy && queue.empty(); })) {
        break;
      }
      std::fprintf(stderr,
                   "W [halka torch group, rank %d of %d] still stopping "
                   "after %.0f s: its %s lane runs halka %s (%zu queued "
                   "behind it)\n",
                   rank, size,
                   std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start).count(),
                   what, running, queue.size());
    }
    if (thread.joinable()) thread.join();
  }
};

}  // namespace halka::torch_backend

#endif  // HALKA_CLIENT_PYTHON_TORCH_LANE_H_
