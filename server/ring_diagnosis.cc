#include "server/ring_diagnosis.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/cost_model.h"
#include "core/host_ring.h"

namespace halka {
namespace {

// "rank 3", "ranks 0-2", "ranks 0-1, 3" for sorted distinct ranks.
std::string RankSet(const std::vector<int>& ranks) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    runs.push_back(j == i ? absl::StrCat(ranks[i])
                          : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(runs, ", "));
}

// Ranks grouped by `key`, groups in order of their first (lowest) rank.
template <typename Key>
std::vector<std::pair<Key, std::vector<int>>> GroupRanks(
    const std::vector<LastOpInput>& ranks,
    const std::function<Key(const LastOpInput&)>& key) {
  std::vector<std::pair<Key, std::vector<int>>> groups;
  for (const LastOpInput& r : ranks) {
    const Key k = key(r);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == k; });
    if (it == groups.end()) {
      groups.push_back({k, {}});
      it = groups.end() - 1;
    }
    it->second.push_back(r.rank);
  }
  return groups;
}

}  // namespace

std::string DiagnoseFailures(std::vector<LastOpInput> ranks) {
  std::sort(ranks.begin(), ranks.end(),
            [](const LastOpInput& a, const LastOpInput& b) {
              return a.rank < b.rank;
            });
  std::vector<LastOpInput> failed, others;
  for (const LastOpInput& r : ranks) (r.failed ? failed : others).push_back(r);
  if (failed.empty()) return "";
  using FailKey = std::pair<uint64_t, std::string>;
  std::vector<std::string> parts;
  for (const auto& [key, who] : GroupRanks<FailKey>(
           failed, [](const LastOpInput& r) {
             return FailKey(r.op_seq, r.error.substr(0, 160));
           })) {
    parts.push_back(absl::StrCat(RankSet(who), "'s last op #", key.first,
                                 " failed (", key.second, ")"));
  }
  std::vector<std::string> at;
  for (const auto& [seq, who] : GroupRanks<uint64_t>(
           others, [](const LastOpInput& r) { return r.op_seq; })) {
    const bool one = who.size() == 1;
    at.push_back(seq == 0 ? absl::StrCat(RankSet(who), one ? " has" : " have",
                                         " ended no op")
                          : absl::StrCat(RankSet(who), one ? " is" : " are",
                                         " at #", seq));
  }
  if (!at.empty()) parts.push_back(absl::StrJoin(at, ", "));
  const auto calls = GroupRanks<uint64_t>(
      ranks, [](const LastOpInput& r) { return r.calls_received; });
  if (calls.size() > 1) {
    std::vector<std::string> c;
    for (const auto& [n, who] : calls) {
      c.push_back(absl::StrCat(RankSet(who), " ", n));
    }
    parts.push_back(absl::StrCat("calls received: ", absl::StrJoin(c, ", ")));
  }
  return absl::StrCat("operations are failing: ", absl::StrJoin(parts, "; "));
}

std::string FormatRate(double bps) {
  return absl::StrFormat("%.1f MB/s", bps / 1e6);
}

namespace {

// What the ranks reported, by rank and by edge, with the ring's order.
struct RingView {
  int g = 0;
  std::vector<int> succ_of, pred_of;
  // view[r][peer]: rank r's figures for its edge with `peer`.
  std::vector<std::map<int, EdgeInput>> view;
  std::vector<const RankInput*> by_rank;

  int pred(int r) const { return pred_of[static_cast<size_t>(r)]; }
  const EdgeInput* get(int r, int peer) const {
    auto& m = view[static_cast<size_t>(r)];
    auto it = m.find(peer);
    return it == m.end() ? nullptr : &it->second;
  }
  double wait_on(int r, int peer) const {
    const EdgeInput* e = get(r, peer);
    return e == nullptr ? 0.0 : e->wait_seconds;
  }
  double reduce_of(int r) const {
    double s = 0;
    for (const auto& [peer, e] : view[static_cast<size_t>(r)]) {
      s += e.reduce_seconds;
    }
    return s;
  }
  // Ring time: after the fingerprint pass (older workers: all of it).
  double ring_seconds(int r) const {
    const RankInput* in = by_rank[static_cast<size_t>(r)];
    if (in == nullptr) return 0.0;
    return in->ring_seconds > 0 ? in->ring_seconds : in->op_seconds;
  }
};

RingView MakeRingView(int g, const std::vector<RankInput>& ranks,
                      const std::vector<int>& ring_order) {
  RingView v;
  v.g = g;
  v.succ_of = RingNeighbours(g, ring_order, 1);
  v.pred_of = RingNeighbours(g, ring_order, -1);
  v.view.resize(static_cast<size_t>(g));
  v.by_rank.assign(static_cast<size_t>(g), nullptr);
  for (const RankInput& r : ranks) {
    if (r.rank < 0 || r.rank >= g) continue;
    v.by_rank[static_cast<size_t>(r.rank)] = &r;
    for (const EdgeInput& e : r.edges) {
      if (e.peer < 0 || e.peer >= g || e.peer == r.rank) continue;
      v.view[static_cast<size_t>(r.rank)][e.peer] = e;
    }
  }
  return v;
}

// Every directed edge either end reported any traffic, wait or error on.
std::vector<EdgeReport> EdgeReports(const RingView& v) {
  const int g = v.g;
  std::vector<EdgeReport> edges;
  for (int from = 0; from < g; ++from) {
    for (int to = 0; to < g; ++to) {
      if (from == to) continue;
      const EdgeInput* rx = v.get(to, from);    // the receiver's view
      const EdgeInput* tx = v.get(from, to);    // the sender's view
      if (rx == nullptr && tx == nullptr) continue;
      EdgeReport e;
      e.from = from;
      e.to = to;
      e.ring = g > 1 && to == v.succ_of[static_cast<size_t>(from)];
      e.bytes = rx != nullptr ? rx->bytes_received : tx->bytes_sent;
      e.wait_seconds = rx != nullptr ? rx->wait_seconds : 0;
      e.wait_p50_seconds = rx != nullptr ? rx->wait_p50_seconds : 0;
      e.wait_p99_seconds = rx != nullptr ? rx->wait_p99_seconds : 0;
      e.errors = (rx != nullptr ? rx->errors : 0) +
                 (tx != nullptr ? tx->errors : 0);
      // Without the sender's own figures (a dead rank) nothing is known
      // about what it added.
      if (e.ring && v.by_rank[static_cast<size_t>(from)] != nullptr) {
        e.added_wait_seconds = std::max(
            0.0, e.wait_seconds - v.wait_on(from, v.pred(from)));
      }
      e.wire_seconds = tx != nullptr ? tx->wire_seconds : 0;
      e.throughput_bps = e.wire_seconds > 0
                             ? static_cast<double>(e.bytes) / e.wire_seconds
                             : 0;
      if (e.bytes == 0 && e.wait_seconds == 0 && e.errors == 0) continue;
      edges.push_back(e);
    }
  }
  return edges;
}

// "; errors on edge 0->1 (2), 3->0 (1)", or "" when no edge had errors.
std::string EdgeErrors(const std::vector<EdgeReport>& edges) {
  std::string errors;
  for (const EdgeReport& e : edges) {
    if (e.errors > 0) {
      absl::StrAppend(&errors, errors.empty() ? "; errors on edge " : ", ",
                      e.from, "->", e.to, " (", e.errors, ")");
    }
  }
  return errors;
}

// The ring edge that adds the most wait (ties: the slower writer).
const EdgeReport* SlowestEdge(const std::vector<const EdgeReport*>& ring) {
  const EdgeReport* slowest = ring[0];
  for (const EdgeReport* e : ring) {
    if (e->added_wait_seconds > slowest->added_wait_seconds ||
        (e->added_wait_seconds == slowest->added_wait_seconds &&
         e->throughput_bps < slowest->throughput_bps)) {
      slowest = e;
    }
  }
  return slowest;
}

// The ranks' medians of stall time, call arrival lag and ring time per op.
struct RankMedians {
  double stall = 0, lag = 0, ring_op = 0;
};

RankMedians MediansOf(const RingView& v) {
  std::vector<double> stalls, lags, per_op_ring;
  for (const RankInput* in : v.by_rank) {
    if (in == nullptr) continue;
    stalls.push_back(in->stall_seconds);
    if (in->arrival_ops > 0) lags.push_back(in->arrival_lag_p50_seconds);
    if (in->ops > 0) per_op_ring.push_back(v.ring_seconds(in->rank) / in->ops);
  }
  return {Median(stalls), Median(lags), Median(per_op_ring)};
}

// The rank that stalls most, if it stalls well beyond the median; else null.
const RankInput* StalledRank(const RingView& v, const RankMedians& m,
                             const DiagnosisOptions& options) {
  const RankInput* stalled = nullptr;
  for (const RankInput* in : v.by_rank) {
    if (in == nullptr) continue;
    if (stalled == nullptr || in->stall_seconds > stalled->stall_seconds) {
      stalled = in;
    }
  }
  if (stalled != nullptr) {
    const double excess = stalled->stall_seconds - m.stall;
    if (excess < options.min_added_wait_s ||
        excess < options.min_share * stalled->op_seconds) {
      stalled = nullptr;
    }
  }
  return stalled;
}

// The rank whose calls arrive latest, if it stands out from the median and
// from every other caller; else null.
const RankInput* LateRank(const RingView& v, const RankMedians& m,
                          const DiagnosisOptions& options) {
  const RankInput* late = nullptr;
  for (const RankInput* in : v.by_rank) {
    if (in == nullptr) continue;
    if (in->arrival_ops >= options.min_arrival_ops &&
        (late == nullptr ||
         in->arrival_lag_p50_seconds > late->arrival_lag_p50_seconds)) {
      late = in;
    }
  }
  if (late != nullptr) {
    const double excess = late->arrival_lag_p50_seconds - m.lag;
    // The next latest caller: a late rank stands out from every other.
    double next_lag = 0;
    for (const RankInput* in : v.by_rank) {
      if (in != nullptr && in != late && in->arrival_ops > 0) {
        next_lag = std::max(next_lag, in->arrival_lag_p50_seconds);
      }
    }
    if (excess < options.min_lag_s ||
        excess < options.min_share * m.ring_op ||
        late->arrival_lag_p50_seconds - next_lag < options.min_lag_s) {
      late = nullptr;
    }
  }
  return late;
}

// d's straggler fields and summary (without the rates), from the stalled
// rank, the late caller and the slowest edge, in that order of precedence.
void Summarize(const RingView& v, const EdgeReport& slowest,
               bool edge_significant, const RankInput* stalled,
               const RankInput* late, const RankMedians& m,
               RingDiagnosis& d) {
  const int s = slowest.from;
  const int succ = slowest.to;
  const std::string edge_sentence = absl::StrFormat(
      "its successor rank %d waited %.2f s of %.2f s in the ring for it, "
      "while rank %d waited %.2f s for rank %d",
      succ, slowest.wait_seconds, v.ring_seconds(succ), s,
      v.wait_on(s, v.pred(s)), v.pred(s));
  auto lag_sentence = [&](const RankInput& in) {
    return absl::StrFormat(
        "its calls arrive %.0f ms after the others' (p50 over the last "
        "minute, p99 %.0f ms, ranks' median %.0f ms)",
        in.arrival_lag_p50_seconds * 1e3, in.arrival_lag_p99_seconds * 1e3,
        m.lag * 1e3);
  };
  if (stalled != nullptr) {
    const int r = stalled->rank;
    d.stalled_rank = r;
    d.straggler_rank = r;
    std::string text = absl::StrFormat(
        "rank %d is the straggler: its process did not run for %.2f s of the "
        "window (ranks' median %.2f s): the host stops, starves or swaps it",
        r, stalled->stall_seconds, m.stall);
    if (late == stalled) {
      d.late_rank = r;
      absl::StrAppend(&text, "; ", lag_sentence(*late));
    }
    if (edge_significant && s == r) absl::StrAppend(&text, "; ", edge_sentence);
    d.summary = text;
  } else if (late != nullptr) {
    const int r = late->rank;
    d.late_rank = r;
    d.straggler_rank = r;
    std::string text = absl::StrFormat(
        "rank %d's calls arrive %.0f ms after the others' (p50 over the last "
        "minute, p99 %.0f ms, ranks' median %.0f ms): its host or its "
        "training step is slow",
        r, late->arrival_lag_p50_seconds * 1e3,
        late->arrival_lag_p99_seconds * 1e3, m.lag * 1e3);
    if (edge_significant && s == r) absl::StrAppend(&text, "; ", edge_sentence);
    d.summary = text;
  } else if (edge_significant) {
    std::vector<double> reduces;
    for (int r = 0; r < v.g; ++r) reduces.push_back(v.reduce_of(r));
    d.straggler_rank = s;
    d.summary = absl::StrFormat(
        "rank %d is the straggler: %s and reduced for %.2f s (median rank "
        "%.2f s); edge %d->%d writes at %s",
        s, edge_sentence, v.reduce_of(s), Median(reduces), s, succ,
        FormatRate(slowest.throughput_bps));
  } else {
    d.summary = absl::StrFormat(
        "no straggler: the most wait one rank adds in the ring is %.3f s "
        "(edge %d->%d), calls arrive %.0f ms after the first (ranks' median "
        "p50)",
        slowest.added_wait_seconds, s, succ, m.lag * 1e3);
  }
}

}  // namespace

RingDiagnosis DiagnoseRing(int g, const std::vector<RankInput>& ranks,
                           DiagnosisOptions options,
                           const std::vector<int>& ring_order) {
  RingDiagnosis d;
  if (g < 1) {
    d.summary = "no members";
    return d;
  }
  const RingView v = MakeRingView(g, ranks, ring_order);
  d.edges = EdgeReports(v);

  std::vector<const EdgeReport*> ring;
  std::vector<double> ring_rates;
  for (const EdgeReport& e : d.edges) {
    if (e.ring && e.bytes > 0) {
      ring.push_back(&e);
      if (e.throughput_bps > 0) ring_rates.push_back(e.throughput_bps);
    }
  }
  const std::string errors = EdgeErrors(d.edges);
  if (ring.empty()) {
    d.summary = absl::StrCat("no ring traffic in the window", errors);
    return d;
  }
  const EdgeReport* slowest = SlowestEdge(ring);
  d.slowest_from = slowest->from;
  d.slowest_to = slowest->to;
  const std::string rates = absl::StrCat(
      "; ring edges write at ", FormatRate(Median(ring_rates)),
      " median while busy (bytes over the time each edge was writing)",
      errors);
  if (g < 2) {
    d.summary = absl::StrCat("no straggler: one rank", rates);
    return d;
  }
  const RankMedians m = MediansOf(v);
  const RankInput* stalled = StalledRank(v, m, options);
  const RankInput* late = LateRank(v, m, options);
  const int s = slowest->from;
  const int succ = slowest->to;
  const double succ_ring = v.ring_seconds(succ);
  const bool edge_significant =
      slowest->added_wait_seconds >= options.min_added_wait_s &&
      (succ_ring <= 0 ||
       slowest->added_wait_seconds >= options.min_share * succ_ring);
  // A rank that is slow inside the ring holds its predecessor's frames
  // back, so the ranks upstream of it end later and call later: a late
  // caller whose lag is less than what the slowest edge adds per operation
  // is that edge's echo, not the cause.
  if (late != nullptr && edge_significant && late->rank != s) {
    const RankInput* succ_in = v.by_rank[static_cast<size_t>(succ)];
    const uint64_t ops = succ_in != nullptr ? succ_in->ops : 0;
    const double added_per_op =
        ops > 0 ? slowest->added_wait_seconds / static_cast<double>(ops) : 0;
    if (added_per_op >= late->arrival_lag_p50_seconds - m.lag) {
      late = nullptr;
    }
  }
  // A stall names the straggler only where it explains at least the wait
  // the slowest edge adds: a rank descheduled for less than another rank's
  // slow edge costs the ring (a loaded host that starved one rank for a
  // moment, perhaps between operations) is not the cause, that edge is.
  // Where the stalled rank sends the slowest edge, the two agree.
  if (stalled != nullptr && edge_significant && stalled->rank != s &&
      stalled->stall_seconds - m.stall < slowest->added_wait_seconds) {
    stalled = nullptr;
  }
  Summarize(v, *slowest, edge_significant, stalled, late, m, d);
  d.has_straggler = d.straggler_rank >= 0;
  absl::StrAppend(&d.summary, rates);
  return d;
}

std::vector<ArrivalLag> ArrivalLags(
    int g, const std::vector<std::vector<ArrivalInput>>& by_rank,
    int64_t since_unix_us) {
  std::vector<ArrivalLag> out(static_cast<size_t>(std::max(g, 0)));
  if (g < 2 || by_rank.size() != static_cast<size_t>(g)) return out;
  // (generation, op_seq) -> each rank's (start, end).
  using Key = std::pair<uint64_t, uint64_t>;
  using Times = std::vector<std::pair<int64_t, int64_t>>;
  std::map<Key, Times> ops;
  for (int r = 0; r < g; ++r) {
    for (const ArrivalInput& a : by_rank[static_cast<size_t>(r)]) {
      Times& v = ops[{a.generation, a.op_seq}];
      if (v.empty()) v.assign(static_cast<size_t>(g), {INT64_MIN, INT64_MIN});
      v[static_cast<size_t>(r)] = {a.start_unix_us, a.end_unix_us};
    }
  }
  auto complete = [](const Times& v) {
    return std::none_of(v.begin(), v.end(), [](const auto& t) {
      return t.first == INT64_MIN;
    });
  };
  std::vector<std::vector<double>> lags(static_cast<size_t>(g));
  for (const auto& [key, v] : ops) {
    auto prev = ops.find({key.first, key.second - 1});
    if (!complete(v) || prev == ops.end() || !complete(prev->second)) {
      continue;
    }
    int64_t first = INT64_MAX, min_idle = INT64_MAX;
    for (int r = 0; r < g; ++r) {
      const size_t i = static_cast<size_t>(r);
      first = std::min(first, v[i].first);
      min_idle = std::min(min_idle, v[i].first - prev->second[i].second);
    }
    if (first < since_unix_us) continue;
    for (int r = 0; r < g; ++r) {
      const size_t i = static_cast<size_t>(r);
      const int64_t lag = v[i].first - first;
      const int64_t idle = v[i].first - prev->second[i].second - min_idle;
      lags[i].push_back(
          static_cast<double>(std::max<int64_t>(0, std::min(lag, idle))) /
          1e6);
    }
  }
  for (int r = 0; r < g; ++r) {
    std::vector<double>& l = lags[static_cast<size_t>(r)];
    ArrivalLag& a = out[static_cast<size_t>(r)];
    a.ops = l.size();
    if (l.empty()) continue;
    std::sort(l.begin(), l.end());
    a.p50_seconds = Median(l);
    a.p99_seconds = l[std::min(l.size() - 1,
                               static_cast<size_t>(0.99 * l.size()))];
  }
  return out;
}

}  // namespace halka
