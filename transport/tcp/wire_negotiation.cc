// The gRPC side of a wire link's negotiation (transport/tcp/wire_link.h):
// the offer's text (the seal and its key), and WireFallbacks, the peers
// whose wire link failed within the last minute (no wire offered to them).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/log.h"
#include "transport/tcp/wire_link.h"

namespace halka {

std::string FormatWireOffer(const std::string& key) {
  if (key.empty()) return "-";
  std::string hex = WireHex(key);
  std::string offer = absl::StrCat(WireSeal::kName, ":", hex);
  WipeKey(&hex);
  return offer;
}

absl::StatusOr<std::string> ParseWireOffer(const std::string& offer) {
  if (offer == "-") return std::string();
  const size_t colon = offer.find(':');
  if (colon == std::string::npos ||
      offer.compare(0, colon, WireSeal::kName) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this worker seals wire links with ", WireSeal::kName,
        " and takes no other offer"));
  }
  std::string hex = offer.substr(colon + 1);
  std::string key = WireUnhex(hex);
  WipeKey(&hex);
  if (key.size() != WireSeal::kKeyBytes) {
    WipeKey(&key);
    return absl::InvalidArgumentError("malformed key");
  }
  return key;
}

void WireFallbacks::Note(const std::string& address, const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    auto [it, first] = last_.emplace(address, halka::Now());
    it->second = halka::Now();
    if (!first) return;
  }
  const std::string line = absl::StrCat(
      "wire link to ", address,
      " not made, its frames take the gRPC stream (no wire offered to it "
      "for a minute): ",
      why.message());
  if (log_ != nullptr) {
    log_->Warning(line);
  } else {
    LogWarning(line);
  }
}

bool WireFallbacks::RecentlyFailed(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = last_.find(address);
  return it != last_.end() && halka::Now() - it->second < absl::Minutes(1);
}

}  // namespace halka
