// One halka worker, or one rendezvous, inside the calling process: what
// the Python package's torch.distributed backend starts when no worker
// daemon runs (each trainer process hosts its own worker; rank 0 hosts the
// rendezvous as well). LocalCluster (local_cluster.h) is N of these in one
// process; the daemons (halka-worker, halka-rendezvous) are the same
// servers as processes of their own.
//
//   auto rv = halka::EmbeddedRendezvous::Start("127.0.0.1:0").value();
//   auto w = halka::EmbeddedWorker::Start({.job_id = "j", .rank = 0,
//       .world_size = 2, .rendezvous = rv->address()}).value();  // blocks
//   auto client = halka::Client::Connect(w->address()).value();
#ifndef HALKA_CLIENT_EMBEDDED_H_
#define HALKA_CLIENT_EMBEDDED_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "halka/types.h"

namespace halka {

class WorkerNode;
class RendezvousServer;

class EmbeddedRendezvous {
 public:
  // `listen`: "host:port" (port 0 picks a free one).
  static absl::StatusOr<std::unique_ptr<EmbeddedRendezvous>> Start(
      const std::string& listen);
  ~EmbeddedRendezvous();
  // host:port workers dial.
  const std::string& address() const;

 private:
  EmbeddedRendezvous() = default;
  std::unique_ptr<RendezvousServer> server_;
};

class EmbeddedWorker {
 public:
  struct Options {
    std::string job_id = "default";
    int rank = 0;             // the rank this worker asks for
    int world_size = 1;
    std::string rendezvous;   // host:port
    std::string listen = "127.0.0.1:0";
    absl::Duration op_timeout = kDefaultOpTimeout;
    absl::Duration join_timeout = absl::Seconds(120);
  };
  // Starts serving and joins; returns once the whole job has formed (or
  // with the join's error: DEADLINE_EXCEEDED names who is missing).
  static absl::StatusOr<std::unique_ptr<EmbeddedWorker>> Start(
      const Options& options);
  // Leaves the job (bounded, well under a second) and stops.
  ~EmbeddedWorker();
  // host:port of its API (Client::Connect).
  const std::string& address() const;
  int rank() const;

 private:
  EmbeddedWorker() = default;
  std::unique_ptr<WorkerNode> node_;
};

}  // namespace halka

#endif  // HALKA_CLIENT_EMBEDDED_H_
