#include "core/testing/inproc_transport.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace halka {

class InProcNetwork::Endpoint : public Transport {
 public:
  Endpoint(InProcNetwork* net, int rank) : net_(net), rank_(rank) {}

  absl::Status Send(int to, const FrameMeta& meta,
                    absl::Span<const uint8_t> payload,
                    std::function<void()> on_released) override {
    std::function<void(FrameMeta&)> tamper;
    {
      absl::MutexLock lock(&net_->mu_);
      if (net_->dead_[static_cast<size_t>(rank_)] ||
          net_->dead_[static_cast<size_t>(to)]) {
        on_released();
        return absl::UnavailableError(
            absl::StrCat("in-process link ", rank_, "->", to, " is down"));
      }
      tamper = net_->tamper_[static_cast<size_t>(rank_)];
    }
    auto bytes = std::make_shared<std::vector<uint8_t>>(payload.begin(),
                                                        payload.end());
    on_released();
    InFrame frame;
    frame.meta = meta;
    if (tamper) tamper(frame.meta);
    if (!bytes->empty()) {
      // Split in two uneven pieces so that the engine's handling of
      // payloads spread over several slices is always exercised.
      const size_t cut = bytes->size() / 2 + 1;
      frame.pieces.push_back(absl::MakeConstSpan(bytes->data(), cut));
      if (cut < bytes->size()) {
        frame.pieces.push_back(
            absl::MakeConstSpan(bytes->data() + cut, bytes->size() - cut));
      }
    }
    frame.keepalive = bytes;
    {
      // Held writes (HoldWrites) leave at ReleaseWrites, as a gRPC
      // stream's would: an algorithm that waited in between would wait
      // for its own frames.
      absl::MutexLock lock(&mu_);
      if (holds_ > 0 || releasing_) {
        kept_.push_back(Kept{to, std::move(frame)});
        return absl::OkStatus();
      }
    }
    Pass(to, std::move(frame));
    return absl::OkStatus();
  }

  void Withdraw(const OpId&) override {}  // Send copies and delivers at once
  void Reset(int) override {}

  void HoldWrites() override {
    absl::MutexLock lock(&mu_);
    ++holds_;
  }
  // The kept frames leave in order; a frame sent while they do queues
  // behind them (a gRPC link's queue keeps that order too).
  void ReleaseWrites() override {
    {
      absl::MutexLock lock(&mu_);
      if (--holds_ > 0) return;
      releasing_ = true;
    }
    for (;;) {
      std::vector<Kept> kept;
      {
        absl::MutexLock lock(&mu_);
        if (kept_.empty() || holds_ > 0) {
          releasing_ = false;
          return;
        }
        kept.swap(kept_);
      }
      {
        absl::MutexLock lock(&net_->mu_);
        net_->writes_held_[static_cast<size_t>(rank_)] += kept.size();
      }
      for (Kept& k : kept) Pass(k.to, std::move(k.frame));
    }
  }

 private:
  // Delivers (or, under the network's hold, keeps) a frame that left.
  void Pass(int to, InFrame frame) {
    {
      absl::MutexLock lock(&net_->mu_);
      if (net_->hold_ && net_->hold_(rank_, to, frame.meta)) {
        net_->held_.push_back(Held{rank_, to, std::move(frame)});
        return;
      }
    }
    net_->Deliver(rank_, to, std::move(frame));
  }

  struct Kept {
    int to;
    InFrame frame;
  };
  InProcNetwork* const net_;
  const int rank_;
  absl::Mutex mu_;
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  bool releasing_ ABSL_GUARDED_BY(mu_) = false;  // ReleaseWrites passing
  std::vector<Kept> kept_ ABSL_GUARDED_BY(mu_);
};

InProcNetwork::InProcNetwork(int world_size)
    : world_size_(world_size),
      dead_(static_cast<size_t>(world_size), false),
      writes_held_(static_cast<size_t>(world_size), 0),
      tamper_(static_cast<size_t>(world_size)) {
  for (int r = 0; r < world_size; ++r) {
    inboxes_.push_back(std::make_unique<Inbox>(world_size));
    transports_.push_back(std::make_unique<Endpoint>(this, r));
  }
}

void InProcNetwork::Kill(int rank) {
  {
    absl::MutexLock lock(&mu_);
    dead_[static_cast<size_t>(rank)] = true;
  }
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank) continue;
    inbox(r)->LinkFailed(rank, absl::UnavailableError(absl::StrCat(
                                   "rank ", rank, " was killed")));
  }
}

bool InProcNetwork::IsDead(int rank) const {
  absl::MutexLock lock(&mu_);
  return dead_[static_cast<size_t>(rank)];
}

void InProcNetwork::Deliver(int from, int to, InFrame frame) {
  // In-process test transport: a refused frame (the per-sender cap) is
  // reported like a broken link.
  absl::Status s = inbox(to)->Deliver(from, std::move(frame));
  if (!s.ok()) inbox(to)->LinkFailed(from, s);
}

size_t InProcNetwork::WritesHeld(int rank) const {
  absl::MutexLock lock(&mu_);
  return writes_held_[static_cast<size_t>(rank)];
}

void InProcNetwork::SetHold(HoldFn hold) {
  absl::MutexLock lock(&mu_);
  hold_ = std::move(hold);
}

void InProcNetwork::ReleaseHeld() {
  std::vector<Held> held;
  {
    absl::MutexLock lock(&mu_);
    held.swap(held_);
  }
  for (Held& h : held) Deliver(h.from, h.to, std::move(h.frame));
}

void InProcNetwork::SetTamper(int from,
                              std::function<void(FrameMeta&)> mutate) {
  absl::MutexLock lock(&mu_);
  tamper_[static_cast<size_t>(from)] = std::move(mutate);
}

}  // namespace halka
