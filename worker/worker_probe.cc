// WorkerNode's probe of its ring links (one file of the class; the node's
// lifecycle is worker_node.cc): Membership.probe_links asks it, a thread
// of its own probes (worker/link_probe.h) and hands the result to the
// rendezvous link, and Join waits for the model the probe makes.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codec/membership_codec.h"
#include "common/clock.h"
#include "worker/link_probe.h"
#include "worker/worker_node.h"

namespace halka {

bool WorkerNode::AwaitMeasuredModel(uint64_t formed) {
  const absl::Time t0 = halka::Now();
  if (!book_->AwaitNewerGeneration(formed, t0 + kProbeJoinWait)) {
    log_.Warning(absl::StrCat(
        "the job's link model was not published within ",
        absl::FormatDuration(kProbeJoinWait),
        " of the ring forming: serving without it (auto counts until it "
        "comes)"));
    return false;
  }
  const v1::Membership latest = book_->Latest();
  log_.Info(absl::StrFormat(
      "the job's link model after %.0f ms: %s",
      absl::ToDoubleMilliseconds(halka::Now() - t0),
      latest.has_link_model()
          ? DescribeLinkModel(LinkModelFromProto(latest.link_model()))
          : std::string("none (auto counts)")));
  return true;
}

void WorkerNode::RequestProbe(uint64_t generation) {
  absl::MutexLock lock(&probe_mu_);
  if (probe_stop_ || generation <= probe_wanted_) return;
  probe_wanted_ = generation;
  if (!probe_thread_.joinable()) {
    probe_thread_ = std::thread([this] { ProbeLoop(); });
  }
}

void WorkerNode::ProbeLoop() {
  for (;;) {
    uint64_t want;
    {
      absl::MutexLock lock(&probe_mu_);
      auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(probe_mu_) {
        return probe_stop_ || probe_wanted_ > probe_done_;
      };
      probe_mu_.Await(absl::Condition(&due));
      if (probe_stop_) return;
      want = probe_wanted_;
    }
    // That generation's ring, once the caller's first call after the
    // change built it; a newer ask or the stop ends the wait.
    std::shared_ptr<Ring> ring;
    for (;;) {
      ring = book_->Current();
      if (ring != nullptr && ring->generation >= want) break;
      ring.reset();
      absl::MutexLock lock(&probe_mu_);
      auto moved = [this, want]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(probe_mu_) {
        return probe_stop_ || probe_wanted_ != want;
      };
      probe_mu_.AwaitWithTimeout(absl::Condition(&moved),
                                 absl::Milliseconds(20));
      if (probe_stop_) return;
      if (probe_wanted_ != want) break;
    }
    // A generation the rendezvous moved past is not probed (its reports
    // would be ignored), and a probe stops once it moves on.
    auto cancelled = [this, want] {
      absl::MutexLock lock(&probe_mu_);
      return probe_stop_ || book_->latest_generation() != want;
    };
    if (ring != nullptr && ring->generation == want && !cancelled()) {
      const absl::Time t0 = halka::Now();
      v1::LinkProbe probe = ProbeRingLinks(*ring, LinkProbeOptions{}, cancelled);
      ring.reset();
      log_.Info(absl::StrFormat(
          "probed the ring links of generation %d in %.0f ms: local %d "
          "edge(s), alpha %.1f us, %.3f GB/s; net %d edge(s), alpha %.1f us, "
          "%.3f GB/s%s",
          want, absl::ToDoubleMilliseconds(halka::Now() - t0),
          probe.local_edges(), probe.local_alpha_us(),
          probe.local_bytes_per_s() / 1e9, probe.net_edges(),
          probe.net_alpha_us(), probe.net_bytes_per_s() / 1e9,
          probe.error().empty() ? "" : absl::StrCat("; ", probe.error())));
      link_->ReportLinkProbe(std::move(probe));
    }
    absl::MutexLock lock(&probe_mu_);
    probe_done_ = std::max(probe_done_, want);
  }
}

}  // namespace halka
