#include "transport/tcp/wire_path.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "seal/wire_seal.h"
#include "transport/tcp/wire_link.h"

namespace halka {
namespace {

class WireOffer final : public PathOffer {
 public:
  WireOffer(std::string address, WipedKey key,
            std::shared_ptr<LinkCounters> counters,
            std::shared_ptr<WireFallbacks> fallbacks, std::string congestion)
      : address_(std::move(address)),
        key_(std::move(key)),
        counters_(std::move(counters)),
        fallbacks_(std::move(fallbacks)),
        congestion_(std::move(congestion)) {}

  PathKind kind() const override { return PathKind::kWire; }
  const char* offer_key() const override { return kLinkWireOfferKey; }
  const char* answer_key() const override { return kLinkWireAnswerKey; }
  std::string value() override { return FormatWireOffer(key_.str()); }
  bool Accepts(const std::string& answer) const override {
    int port = 0;
    std::string token;
    return ParseWireAnswer(answer, &port, &token);
  }
  // The connection is made on the sender's thread: the frames wait for it.
  absl::StatusOr<Opened> Open(const std::string& answer,
                              Events events) override {
    int port = 0;
    std::string token;
    if (!ParseWireAnswer(answer, &port, &token)) {
      return absl::InvalidArgumentError("not a wire answer");
    }
    auto failed = [f = std::move(events.failed)](const absl::Status& s) {
      f(absl::Status(s.code(), absl::StrCat("wire link: ", s.message())));
    };
    return Opened{std::make_shared<WireSender>(
                      HostOf(address_), port, std::move(token), key_.str(),
                      std::move(events.ready), std::move(failed),
                      congestion_, counters_),
                  /*ready_now=*/false};
  }
  void OnReady(const absl::Status& status) override {
    if (status.ok()) {
      counters_->wire.accepted.fetch_add(1);
      return;
    }
    counters_->wire.fell_back.fetch_add(1);
    fallbacks_->Note(address_, status);
  }
  void Refused() override { counters_->wire.refused.fetch_add(1); }

 private:
  const std::string address_;
  const WipedKey key_;  // "" on a plaintext channel; wiped when it goes
  const std::shared_ptr<LinkCounters> counters_;
  const std::shared_ptr<WireFallbacks> fallbacks_;
  const std::string congestion_;  // WireSender's (ChooseCongestion)
};

// A wire link's serving end: the token the listener expects, then the
// connection's reader (set once, on the listener's thread), whose tap the
// link's inbox drains and sleeps on (the operation's thread reads the
// link's small frames itself while it waits).
class WireInPath final : public InPath {
 public:
  WireInPath(WireListener* listener, InPathEnd end, bool landing, bool tap,
             std::shared_ptr<LinkCounters> counters)
      : listener_(listener),
        end_(std::move(end)),
        landing_(landing),
        tap_(tap),
        counters_(std::move(counters)) {}
  ~WireInPath() override { Stop(); }

  // The token for the link's connection; "" if the listener is stopped.
  std::string Expect(const WipedKey& key) {
    token_ = listener_->Expect([this, key](int fd) {
      // On the listener's thread, before Forget (Stop) can return.
      const InPathEnd& end = end_;
      receiver_ = std::make_unique<WireReceiver>(
          fd, key.str(),
          end.deliver,
          [end](const absl::Status& s) {
            end.failed(absl::Status(
                s.code(), absl::StrCat("wire link: ", s.message())));
          },
          // All-gather and broadcast chunks land in the operation's buffer.
          landing_ ? end_.inbox->landings() : nullptr, end_.from, counters_,
          // A refused frame ends the stream, from the reader thread.
          end.rejected);
      tapped_ = tap_ ? receiver_->tap() : nullptr;
      if (tapped_ != nullptr) end_.inbox->AddTap(tapped_);
    });
    return token_;
  }

  void Stop() override {
    // After Forget, the listener never hands this link a connection.
    if (!token_.empty()) listener_->Forget(token_);
    token_.clear();
    if (receiver_) receiver_->Stop();
    if (tapped_ != nullptr) end_.inbox->RemoveTap(tapped_.get());
    tapped_ = nullptr;
  }

 private:
  WireListener* const listener_;
  const InPathEnd end_;
  const bool landing_;
  const bool tap_;
  const std::shared_ptr<LinkCounters> counters_;
  std::string token_;
  std::unique_ptr<WireReceiver> receiver_;
  std::shared_ptr<InboxTap> tapped_;
};

class WireAcceptor final : public PathAcceptor {
 public:
  WireAcceptor(WireListener* listener, bool sealed_only, bool landing,
               bool tap, std::shared_ptr<LinkCounters> counters)
      : listener_(listener),
        sealed_only_(sealed_only),
        landing_(landing),
        tap_(tap),
        counters_(std::move(counters)) {}
  PathKind kind() const override { return PathKind::kWire; }
  const char* offer_key() const override { return kLinkWireOfferKey; }
  const char* answer_key() const override { return kLinkWireAnswerKey; }

  Answer Accept(const std::string& value, InPathEnd end) override {
    // The offer carries the key in hex: both are wiped (WipedKey) when they
    // go, the key's copy in the listener's callback too.
    const WipedKey offer(value);
    if (listener_ == nullptr) return {"no: this worker takes no wire links", {}};
    absl::StatusOr<std::string> parsed = ParseWireOffer(offer.str());
    if (!parsed.ok()) return {absl::StrCat("no: ", parsed.status().message()), {}};
    const WipedKey key(*std::move(parsed));
    if (key.empty() && sealed_only_) {
      return {"no: this worker serves TLS: a wire link must be sealed", {}};
    }
    auto path = std::make_unique<WireInPath>(listener_, std::move(end),
                                             landing_, tap_, counters_);
    const std::string token = path->Expect(key);
    if (token.empty()) return {"no: the wire listener is stopped", {}};
    return {FormatWireAnswer(listener_->port(), token), std::move(path)};
  }

 private:
  WireListener* const listener_;
  const bool sealed_only_;
  const bool landing_;
  const bool tap_;
  const std::shared_ptr<LinkCounters> counters_;
};

}  // namespace

std::unique_ptr<PathOffer> MakeWireOffer(
    const std::string& address, bool sealed,
    std::shared_ptr<LinkCounters> counters,
    std::shared_ptr<WireFallbacks> fallbacks, std::string congestion) {
  if (fallbacks->RecentlyFailed(address)) return nullptr;
  absl::StatusOr<std::string> key = std::string();
  if (sealed) key = WireSeal::NewKey();
  if (!key.ok()) return nullptr;
  return std::make_unique<WireOffer>(address, WipedKey(*std::move(key)),
                                     std::move(counters), std::move(fallbacks),
                                     std::move(congestion));
}

std::unique_ptr<PathAcceptor> MakeWireAcceptor(
    WireListener* listener, bool sealed_only, bool landing, bool tap,
    std::shared_ptr<LinkCounters> counters) {
  return std::make_unique<WireAcceptor>(listener, sealed_only, landing, tap,
                                        std::move(counters));
}

}  // namespace halka
