#include "core/landing.h"

#include <iterator>
#include <set>

namespace halka {

LandingBoard::Key LandingBoard::KeyOf(int from, const FrameMeta& m) {
  return Key(from, m.generation, m.op_seq, static_cast<uint8_t>(m.phase),
             m.step, m.segment, m.offset, m.count,
             static_cast<uint8_t>(m.dtype));
}

void LandingBoard::AddSource(int from) {
  absl::MutexLock lock(&mu_);
  ++sources_[from];
}

void LandingBoard::RemoveSource(int from) {
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(from);
  if (it != sources_.end() && --it->second <= 0) sources_.erase(it);
}

std::shared_ptr<Landing> LandingBoard::Offer(int from, const FrameMeta& expect,
                                             uint8_t* dst, size_t bytes) {
  if (dst == nullptr || expect.kind != FrameKind::kData) return nullptr;
  absl::MutexLock lock(&mu_);
  if (sources_.find(from) == sources_.end()) return nullptr;
  auto landing = std::make_shared<Landing>(dst, bytes);
  if (!offered_.emplace(KeyOf(from, expect), landing).second) return nullptr;
  offered_count_.store(offered_.size(), std::memory_order_release);
  return landing;
}

void LandingBoard::Withdraw(
    absl::Span<const std::shared_ptr<Landing>> landings) {
  if (landings.empty()) return;
  {
    std::set<const Landing*> mine;
    for (const auto& l : landings) mine.insert(l.get());
    absl::MutexLock lock(&mu_);
    for (auto it = offered_.begin(); it != offered_.end();) {
      it = mine.count(it->second.get()) > 0 ? offered_.erase(it)
                                            : std::next(it);
    }
    offered_count_.store(offered_.size(), std::memory_order_release);
  }
  // Claimed ones are off the board already: a reader may be inside one.
  for (const auto& l : landings) l->Revoke();
}

std::shared_ptr<Landing> LandingBoard::Claim(int from, const FrameMeta& meta,
                                             size_t payload_bytes) {
  // A group's frames land nowhere: the board is the job's (a group's
  // operation numbers its own, and would match the job's offers).
  if (meta.kind != FrameKind::kData || meta.group != 0) return nullptr;
  absl::MutexLock lock(&mu_);
  auto it = offered_.find(KeyOf(from, meta));
  if (it == offered_.end() || it->second->bytes() != payload_bytes) {
    return nullptr;
  }
  std::shared_ptr<Landing> landing = std::move(it->second);
  offered_.erase(it);
  offered_count_.store(offered_.size(), std::memory_order_release);
  return landing;
}

size_t LandingBoard::offered() const {
  absl::MutexLock lock(&mu_);
  return offered_.size();
}

}  // namespace halka
