// RendezvousState's measured link model (one file of the class; see
// RendezvousOptions::probe_links): which generation asks its members to
// probe their ring links, their reports, and the model made of them.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/rendezvous_state.h"

namespace halka {
namespace {

// A level from the reports that measured it: the medians of their alpha
// and rate; not known (rate 0) when none did.
LevelCost MedianLevel(const std::vector<const LevelCost*>& levels) {
  std::vector<double> alpha, rate;
  for (const LevelCost* l : levels) {
    alpha.push_back(l->alpha_s);
    rate.push_back(l->bytes_per_s);
  }
  return LevelCost{Median(alpha), Median(rate)};
}

}  // namespace

std::string RendezvousState::ProbeKey(const Job& job) {
  std::string key;
  for (const Member& m : job.members) {
    absl::StrAppend(&key, m.rank, "=", m.worker_id, "@", m.address, "/",
                    m.host, ";");
  }
  return key;
}

bool RendezvousState::ProbePending(const Job& job) const {
  return options_.probe_links && !options_.link_model.has_value() &&
         job.generation > 0 && job.measured_for != ProbeKey(job);
}

std::optional<LinkModel> RendezvousState::ModelOf(const Job& job) const {
  if (options_.link_model.has_value()) return options_.link_model;
  if (options_.probe_links) return job.measured;
  return std::nullopt;
}

std::string RendezvousState::ReportLinkProbe(const std::string& job_id,
                                             const std::string& worker_id,
                                             const LinkProbeReport& report,
                                             absl::Time now) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return "";
  Job& job = it->second;
  const Member* m = Find(job, worker_id);
  if (m == nullptr || !m->alive || !job.active ||
      report.generation != job.generation || !ProbePending(job)) {
    return "";
  }
  if (job.probes_generation != job.generation) {
    job.probes.clear();
    job.probes_generation = job.generation;
    job.first_probe = now;
  }
  job.probes[worker_id] = report;
  // Only live members of this generation report here, and a member lost
  // changes the generation (and so starts the reports over): every live
  // member has reported when there are as many reports.
  if (static_cast<int>(job.probes.size()) < Live(job)) return "";
  return FinishProbe(job_id, job, now);
}

void RendezvousState::SweepProbe(const std::string& job_id, Job& job,
                                 absl::Time now, bool heard) {
  // A job this rendezvous does not hear (cut off, or ended) is left alone,
  // as Sweep leaves its members.
  if (!heard || !job.active || !options_.probe_links ||
      options_.link_model.has_value()) {
    return;
  }
  if (ProbePending(job)) {
    if (job.probes_generation == job.generation && !job.probes.empty() &&
        now - job.first_probe >= options_.probe_wait) {
      // Some member never reported (it predates the probe, or its probe
      // hangs): the model is what came.
      FinishProbe(job_id, job, now);
    }
    return;
  }
  if (options_.probe_every <= absl::ZeroDuration() ||
      now - job.measured_at < options_.probe_every) {
    return;
  }
  // Measured long enough ago: the next generation (same members) asks
  // again.
  const uint64_t before = job.generation;
  ++job.generation;
  job.lost.clear();
  job.measured_for.clear();
  job.change = absl::StrCat(
      "generation ", before, "->", job.generation, ": the link model ",
      job.measured ? absl::StrCat("measured at generation ",
                                  job.measured->measured_generation)
                   : std::string("probe"),
      " is older than ", absl::FormatDuration(options_.probe_every),
      ": the members probe their links again");
  events_.push_back(absl::StrCat("job ", job_id, ": ", job.change));
}

std::string RendezvousState::FinishProbe(const std::string& job_id, Job& job,
                                         absl::Time now) {
  std::vector<const LevelCost*> local, net;
  std::string failed;
  int failures = 0;
  for (const auto& [id, r] : job.probes) {
    if (!r.error.empty()) {
      if (failures++ == 0) failed = absl::StrCat(id, ": ", r.error);
      continue;
    }
    if (r.local_edges > 0 && r.local.known()) local.push_back(&r.local);
    if (r.net_edges > 0 && r.net.known()) net.push_back(&r.net);
  }
  const size_t reports = job.probes.size();
  const uint64_t probed = job.generation;
  job.probes.clear();
  job.first_probe = absl::InfiniteFuture();
  // These members are measured (or tried): no more asking until they
  // change.
  job.measured_for = ProbeKey(job);
  job.measured_at = now;
  std::string failures_text;
  if (failures > 0) {
    failures_text = absl::StrCat("; ", failures, " probe(s) failed, first ",
                                 failed);
  }
  // The next generation (same members and ranks) says the probe is over,
  // with the model, or without a new one: the members waiting for it
  // (WorkerNode::Join) go on, and no cached view of this generation says
  // otherwise.
  ++job.generation;
  job.lost.clear();
  if (local.empty() && net.empty()) {
    job.change = absl::StrCat(
        "generation ", probed, "->", job.generation, ": the link probes of ",
        reports, " of ", Live(job), " members measured no link", failures_text,
        "; auto keeps ",
        job.measured ? "the model measured before" : "its counting rules");
  } else {
    LinkModel model;
    model.local = MedianLevel(local);
    model.net = MedianLevel(net);
    model.measured_generation = probed;
    job.measured = model;
    job.change = absl::StrCat(
        "generation ", probed, "->", job.generation,
        ": link model measured on generation ", probed, " by ", reports,
        " of ", Live(job), " members (medians; local from ", local.size(),
        ", net from ", net.size(), "): ", DescribeLinkModel(model),
        failures_text);
  }
  std::string line = absl::StrCat("job ", job_id, ": ", job.change);
  events_.push_back(line);
  return line;
}

}  // namespace halka
