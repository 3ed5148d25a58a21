// `halkactl health`'s table (FormatHealth, bench.h): the verdict first,
// then the members with their hosts and ring positions, the ring's path
// over hosts, links, edges, ranks and the diagnosis.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/halkactl/bench.h"
#include "halka/ring.h"

namespace halka {

namespace {

// What a member does now: idle, its operation and where it waits, or lost.
std::string MemberNow(const Member& m, const WorkerTelemetry& t) {
  if (!m.alive) {
    return absl::StrFormat("lost (last heard %.1f s ago)",
                           m.last_heartbeat_age_s);
  }
  if (t.current_op.empty()) return "idle";
  std::string now = absl::StrCat(t.current_op, " ", t.phase, " step ", t.step);
  if (t.awaited_rank >= 0) {
    absl::StrAppend(&now, absl::StrFormat(", waits for rank %d for %.1f s",
                                          t.awaited_rank, t.waiting_for_s));
  }
  return now;
}

// Each rank's ring position (RingHealth::ring_order; rank order when it
// is not a permutation of the members' ranks).
std::vector<int> Positions(const RingHealth& h) {
  const size_t g = h.members.size();
  std::vector<int> pos(g, -1);
  bool valid = h.ring_order.size() == g;
  for (size_t p = 0; valid && p < g; ++p) {
    const int r = h.ring_order[p];
    valid = r >= 0 && static_cast<size_t>(r) < g && pos[static_cast<size_t>(r)] < 0;
    if (valid) pos[static_cast<size_t>(r)] = static_cast<int>(p);
  }
  for (size_t r = 0; !valid && r < g; ++r) pos[r] = static_cast<int>(r);
  return pos;
}

// One row per member (its rank, ring position and host), then the hang
// explainer: who waits for whom, where, for how long.
std::string FormatMembers(const RingHealth& h) {
  const std::vector<int> pos = Positions(h);
  int host_w = 0;  // the host column, when a member named one
  for (const Member& m : h.members) {
    host_w = std::max(host_w, static_cast<int>(m.host.size()));
  }
  if (host_w > 0) host_w = std::max(host_w, 4);
  auto host_col = [host_w](const std::string& host) {
    return host_w == 0 ? std::string()
                       : absl::StrFormat("%-*s ", host_w, host);
  };
  std::string out = absl::StrFormat(
      "%4s %4s  %-14s %s%-22s %-5s %7s %6s %6s %10s %10s %8s  %s\n", "rank",
      "pos", "worker", host_col("host"), "address", "alive", "hb_age", "ok",
      "failed", "sent_MB", "recv_MB", "wait_s", "now");
  const WorkerTelemetry none;
  for (size_t i = 0; i < h.members.size(); ++i) {
    const Member& m = h.members[i];
    const WorkerTelemetry& t = i < h.telemetry.size() ? h.telemetry[i] : none;
    const int p = m.rank >= 0 && static_cast<size_t>(m.rank) < pos.size()
                      ? pos[static_cast<size_t>(m.rank)]
                      : -1;
    absl::StrAppend(
        &out,
        absl::StrFormat("%4d %4d  %-14s %s%-22s %-5s %6.1fs %6d %6d %10.1f "
                        "%10.1f %8.3f  %s\n",
                        m.rank, p, m.worker_id, host_col(m.host), m.address,
                        m.alive ? "yes" : "NO", m.last_heartbeat_age_s,
                        t.ops_completed, t.ops_failed, t.bytes_sent / 1e6,
                        t.bytes_received / 1e6, t.wait_seconds,
                        MemberNow(m, t)));
  }
  for (size_t i = 0; i < h.members.size() && i < h.telemetry.size(); ++i) {
    const WorkerTelemetry& t = h.telemetry[i];
    if (!h.members[i].alive || t.current_op.empty() || t.awaited_rank < 0) {
      continue;
    }
    absl::StrAppend(&out, absl::StrFormat(
                              "rank %d waits for rank %d: %s, %s step %d, "
                              "chunk %d of %d, for %.1f s\n",
                              h.members[i].rank, t.awaited_rank, t.current_op,
                              t.phase, t.step, t.chunk, t.chunks,
                              t.waiting_for_s));
  }
  return out;
}

// Payload bytes per link, as each worker counts them.
std::string FormatLinks(const RingHealth& h) {
  std::string links;
  for (size_t i = 0; i < h.telemetry.size() && i < h.members.size(); ++i) {
    for (const LinkTelemetry& l : h.telemetry[i].links) {
      const std::string peer =
          l.peer < h.world_size ? absl::StrCat("rank ", l.peer)
                                : absl::StrCat("ps ", l.peer - h.world_size);
      absl::StrAppend(&links, absl::StrFormat("  rank %d <-> %-8s sent %10.1f "
                                              "MB  received %10.1f MB\n",
                                              h.members[i].rank, peer,
                                              l.bytes_sent / 1e6,
                                              l.bytes_received / 1e6));
    }
  }
  return links.empty() ? "" : absl::StrCat("links (payload bytes):\n", links);
}

std::string FormatEdges(const RingHealth& h) {
  if (h.edges.empty()) return "";
  std::string out = absl::StrCat(
      "edges (last minute; * = ring edge, wait = receiver blocked on sender "
      "in the data phases, wire = sender's link writing, MB/s = MB / "
      "wire):\n",
      absl::StrFormat("  %-9s %10s %8s %10s %9s %9s %8s %8s %6s\n", "edge",
                      "MB", "wire_s", "MB/s", "wait_s", "added_s", "p50_ms",
                      "p99_ms", "errors"));
  for (const EdgeHealth& e : h.edges) {
    const std::string name =
        absl::StrCat(e.ring ? "*" : " ", e.from, "->", e.to);
    const bool slowest = e.from == h.diagnosis.slowest_from &&
                         e.to == h.diagnosis.slowest_to;
    absl::StrAppend(
        &out, absl::StrFormat(
                  "  %-9s %10.1f %8.3f %10.1f %9.3f %9.3f %8.2f %8.2f %6d%s\n",
                  name, e.bytes / 1e6, e.wire_seconds, e.throughput_bps / 1e6,
                  e.wait_seconds, e.added_wait_seconds,
                  e.wait_p50_seconds * 1e3, e.wait_p99_seconds * 1e3,
                  e.errors, slowest ? "  <- slowest" : ""));
  }
  return out;
}

std::string FormatRanks(const RingHealth& h) {
  if (h.ranks.empty()) return "";
  std::string out = absl::StrCat(
      "ranks (last minute; lag = how long after the first rank its calls "
      "reached the ring):\n",
      absl::StrFormat("  %4s %10s %10s %6s %9s %9s\n", "rank", "lag_p50_ms",
                      "lag_p99_ms", "ops", "stall_s", "ring_s"));
  for (const RankHealth& r : h.ranks) {
    absl::StrAppend(&out, absl::StrFormat(
                              "  %4d %10.1f %10.1f %6d %9.3f %9.3f\n", r.rank,
                              r.arrival_lag_p50_seconds * 1e3,
                              r.arrival_lag_p99_seconds * 1e3, r.arrival_ops,
                              r.stall_seconds, r.ring_seconds));
  }
  return out;
}

// The ring's path over hosts, when it has more than one: "ring over 2
// hosts: A [0 2 4 6] -> B [1 3 5 7] -> A".
std::string FormatRingPath(const RingHealth& h) {
  if (h.hosts.size() < 2) return "";
  constexpr size_t kListed = 16;
  std::vector<std::string> parts;
  for (size_t i = 0; i < h.hosts.size() && i < kListed; ++i) {
    const HostGroup& g = h.hosts[i];
    parts.push_back(absl::StrCat(g.host.empty() ? "?" : g.host, " [",
                                 absl::StrJoin(g.ranks, " "), "]"));
  }
  if (h.hosts.size() > kListed) {
    parts.push_back(absl::StrCat("... ", h.hosts.size() - kListed, " more"));
  }
  return absl::StrCat("ring over ", h.hosts.size(), " hosts: ",
                      absl::StrJoin(parts, " -> "), " -> ",
                      h.hosts[0].host.empty() ? "?" : h.hosts[0].host, "\n");
}

// The first line, with the whole verdict: "job J: healthy, generation 7, 8
// members on 2 hosts", or "job J: FAILING, generation 7: <why>".
std::string FormatVerdict(const RingHealth& h) {
  if (h.failing) {
    std::string why = h.diagnosis.failure.empty() ? "operations are failing"
                                                  : h.diagnosis.failure;
    std::replace(why.begin(), why.end(), '\n', ' ');
    const std::string state =
        h.job_state == JobState::kHealthy
            ? ""
            : absl::StrCat(" (", JobStateName(h.job_state), ")");
    return absl::StrFormat("job %s: FAILING%s, generation %d: %s\n", h.job_id,
                           state, h.generation, why);
  }
  const std::string hosts =
      h.hosts.empty() ? ""
                      : absl::StrCat(" on ", h.hosts.size(),
                                     h.hosts.size() == 1 ? " host" : " hosts");
  return absl::StrFormat("job %s: %s, generation %d, %d members%s\n",
                         h.job_id, JobStateName(h.job_state), h.generation,
                         h.world_size, hosts);
}

}  // namespace

std::string FormatHealth(const RingHealth& h) {
  std::string out = FormatVerdict(h);
  absl::StrAppend(&out, FormatMembers(h), FormatRingPath(h));
  if (!h.link_model.empty()) {
    absl::StrAppend(&out, "link model (auto ranks by it): ", h.link_model,
                    "\n");
  }
  if (!h.change.empty()) {
    absl::StrAppend(&out, "last membership change: ", h.change, "\n");
  }
  if (h.max_world_size > h.min_world_size) {
    absl::StrAppend(&out, absl::StrFormat("elastic: %d..%d members\n",
                                          h.min_world_size, h.max_world_size));
  }
  absl::StrAppend(&out, FormatLinks(h));
  if (!h.last_algorithm.empty()) {
    absl::StrAppend(&out, absl::StrFormat(
                              "last operations: algorithm %s, chunk %d bytes",
                              h.last_algorithm, h.last_chunk_bytes));
    if (h.last_model_seconds > 0) {
      absl::StrAppend(&out, absl::StrFormat(
                                "; the last took %.3f ms, the link model "
                                "predicted %.3f ms",
                                h.last_op_seconds * 1e3,
                                h.last_model_seconds * 1e3));
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, FormatEdges(h), FormatRanks(h));
  if (!h.diagnosis.summary.empty()) {
    absl::StrAppend(&out, "diagnosis: ", h.diagnosis.summary, "\n");
  }
  return out;
}
}  // namespace halka
