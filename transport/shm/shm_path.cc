#include "transport/shm/shm_path.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "core/shm_ring.h"
#include "transport/shm/shm_link.h"

namespace halka {
namespace {

class ShmRingOffer final : public PathOffer {
 public:
  ShmRingOffer(std::shared_ptr<ShmRing> ring,
           std::shared_ptr<LinkCounters> counters)
      : ring_(std::move(ring)), counters_(std::move(counters)) {}
  // A ring that was never answered (the stream ended first) goes with its
  // name.
  ~ShmRingOffer() override { Settled(); }

  PathKind kind() const override { return PathKind::kShm; }
  const char* offer_key() const override { return kLinkShmOfferKey; }
  const char* answer_key() const override { return kLinkShmAnswerKey; }
  std::string value() override { return FormatShmOffer(*ring_); }
  bool Accepts(const std::string& answer) const override {
    return answer == "ok";
  }
  absl::StatusOr<Opened> Open(const std::string&, Events) override {
    return Opened{std::make_shared<ShmSender>(ring_), /*ready_now=*/true};
  }
  void OnReady(const absl::Status&) override {
    counters_->shm.accepted.fetch_add(1);
  }
  void Refused() override { counters_->shm.refused.fetch_add(1); }
  void Settled() override {
    if (!unlinked_) ring_->Unlink();
    unlinked_ = true;
  }

 private:
  const std::shared_ptr<ShmRing> ring_;
  const std::shared_ptr<LinkCounters> counters_;
  bool unlinked_ = false;
};

// A mapped ring's reader, and the inbox tap through which the operation's
// thread takes its records itself while it waits (one wake-up per record
// instead of two, none for a record that is already there).
class ShmInPath final : public InPath {
 public:
  ShmInPath(std::shared_ptr<ShmRing> ring, InPathEnd end)
      : end_(std::move(end)),
        receiver_(std::move(ring), end_.deliver, end_.rejected, end_.failed) {
    end_.inbox->AddTap(receiver_.tap());
  }
  ~ShmInPath() override { Stop(); }
  void Stop() override {
    if (stopped_) return;
    stopped_ = true;
    receiver_.Stop();  // delivers what was written, then joins
    end_.inbox->RemoveTap(receiver_.tap().get());
  }

 private:
  const InPathEnd end_;
  ShmReceiver receiver_;
  bool stopped_ = false;
};

class ShmRingAcceptor final : public PathAcceptor {
 public:
  ShmRingAcceptor(bool enabled, absl::Duration spin)
      : enabled_(enabled), spin_(spin) {}
  PathKind kind() const override { return PathKind::kShm; }
  const char* offer_key() const override { return kLinkShmOfferKey; }
  const char* answer_key() const override { return kLinkShmAnswerKey; }
  Answer Accept(const std::string& value, InPathEnd end) override {
    if (!enabled_) return {"no: this worker takes no shared-memory links", {}};
    absl::StatusOr<std::shared_ptr<ShmRing>> ring = AcceptShmOffer(value);
    if (!ring.ok()) return {absl::StrCat("no: ", ring.status().message()), {}};
    (*ring)->set_spin_before_sleep(spin_);
    return {"ok", std::make_unique<ShmInPath>(*std::move(ring), std::move(end))};
  }

 private:
  const bool enabled_;
  const absl::Duration spin_;
};

}  // namespace

std::unique_ptr<PathOffer> MakeShmOffer(
    size_t ring_bytes, const std::string& address,
    std::shared_ptr<LinkCounters> counters) {
  if (ring_bytes == 0 || !PeerMayShareHost(address)) return nullptr;
  absl::StatusOr<std::shared_ptr<ShmRing>> ring = ShmRing::Create(ring_bytes);
  if (!ring.ok()) return nullptr;  // the link runs without it
  return std::make_unique<ShmRingOffer>(*std::move(ring), std::move(counters));
}

std::unique_ptr<PathAcceptor> MakeShmAcceptor(bool enabled,
                                              absl::Duration spin) {
  return std::make_unique<ShmRingAcceptor>(enabled, spin);
}

}  // namespace halka
