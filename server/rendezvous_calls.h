// The rendezvous's two kinds of waiting call, as gRPC callback reactors:
// a Join waiting for its ring, and a Watch stream that is handed each new
// membership. Private to server/: rendezvous_service.cc creates them,
// rendezvous_publish.cc answers them.
#ifndef HALKA_SERVER_RENDEZVOUS_CALLS_H_
#define HALKA_SERVER_RENDEZVOUS_CALLS_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "halka/v1/rendezvous.pb.h"
#include "server/rendezvous_service.h"

namespace halka {

// A Join waiting for its ring. No thread waits: the service answers it
// when a generation gives it a rank, its wait runs out, it is cancelled, or
// the service stops; whoever removes it from joins_ answers it.
class RendezvousService::JoinCall final : public grpc::ServerUnaryReactor {
 public:
  JoinCall(RendezvousService* service, grpc::ByteBuffer* reply)
      : service_(service), reply_(reply) {}
  JoinArgs args;
  absl::Time deadline;
  bool compact = false;  // the reply's ring deflated (compact_membership)

  // The reply is the generation's JoinReply followed by this member's
  // rank: serialised protobuf messages concatenate as a merge, so the
  // shared bytes are never copied or re-encoded per member.
  void Answer(const grpc::Slice& shared, int rank) {
    v1::JoinReply own;
    own.set_rank(rank);
    const grpc::Slice parts[2] = {shared, grpc::Slice(own.SerializeAsString())};
    *reply_ = grpc::ByteBuffer(parts, 2);
    answered_ = true;
    Finish(grpc::Status::OK);
  }
  void OnCancel() override { service_->CancelJoin(this); }
  void OnDone() override {
    // The reply was sent: the member's heartbeat clock starts now.
    if (answered_) service_->JoinReturned(args);
    delete this;
  }

 private:
  RendezvousService* const service_;
  grpc::ByteBuffer* const reply_;
  bool answered_ = false;
};

// One Watch stream: the newest membership not yet written waits in next_
// (a watcher that falls behind skips generations, it never queues them).
// A watcher that takes deltas gets each update against the generation of
// the message written before it (the one it will hold), when the service
// has that delta; else the whole membership.
class RendezvousService::WatchCall final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `known`: the generation the watcher holds (0: none).
  WatchCall(RendezvousService* service, std::string job_id,
            std::string worker_id, std::string peer, bool deltas,
            uint64_t known)
      : service_(service), job_id(std::move(job_id)),
        worker_id(std::move(worker_id)), peer(std::move(peer)),
        deltas(deltas), written_(known) {}
  const std::string job_id;
  const std::string worker_id;
  const std::string peer;
  const bool deltas;
  bool counted = false;  // holds a place in service_->watches_

  // The generation the watcher will hold before the next update (0: none):
  // what a delta for this stream is against.
  uint64_t Base() {
    absl::MutexLock lock(&mu_);
    return written_;
  }
  // `delta` (may be empty) is against generation `base`.
  void Offer(uint64_t generation, const grpc::Slice& whole, uint64_t base,
             const grpc::Slice& delta) {
    {
      absl::MutexLock lock(&mu_);
      if (ended_ || generation == offered_) return;
      offered_ = generation;
      const bool use_delta =
          deltas && delta.size() > 0 && base != 0 && base == written_;
      const grpc::Slice& bytes = use_delta ? delta : whole;
      if (writing_) {
        next_ = grpc::ByteBuffer(&bytes, 1);
        next_generation_ = generation;
        return;
      }
      writing_ = true;
      current_ = grpc::ByteBuffer(&bytes, 1);
      written_ = generation;
    }
    StartWrite(&current_);
  }
  void End(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return;
      ended_ = true;
      if (writing_) {
        end_ = status;  // OnWriteDone finishes
        return;
      }
    }
    Finish(status);
  }
  void OnWriteDone(bool ok) override {
    enum { kIdle, kWrite, kFinish } then = kIdle;
    grpc::Status finish;
    {
      absl::MutexLock lock(&mu_);
      if (!ok && !ended_) {
        ended_ = true;
        end_ = grpc::Status::CANCELLED;
      }
      if (end_.has_value()) {
        finish = *end_;
        end_.reset();
        writing_ = false;
        then = kFinish;
      } else if (next_.has_value()) {
        current_ = std::move(*next_);
        next_.reset();
        written_ = next_generation_;
        then = kWrite;
      } else {
        writing_ = false;
      }
    }
    if (then == kWrite) StartWrite(&current_);
    if (then == kFinish) Finish(finish);
  }
  void OnCancel() override { End(grpc::Status::CANCELLED); }
  // The call keeps itself until OnDone (the service's list may let go of
  // it earlier, and a refused call is on no list).
  void Hold(std::shared_ptr<WatchCall> self) { self_ = std::move(self); }
  void OnDone() override {
    service_->DropWatch(this);
    std::shared_ptr<WatchCall> last = std::move(self_);
  }

 private:
  RendezvousService* const service_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t offered_ ABSL_GUARDED_BY(mu_) = 0;
  // The generation of the write in flight (or the last one; at first the
  // one the watcher knows), and of next_.
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ByteBuffer current_;  // the write in flight
  std::shared_ptr<WatchCall> self_;
  std::optional<grpc::ByteBuffer> next_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
};

}  // namespace halka

#endif  // HALKA_SERVER_RENDEZVOUS_CALLS_H_
