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
#include "core/host_ring.h"

namespace halka {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

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

RingDiagnosis DiagnoseRing(int g, const std::vector<RankInput>& ranks,
                           DiagnosisOptions options,
                           const std::vector<int>& ring_order) {
  RingDiagnosis d;
  if (g < 1) {
    d.summary = "no members";
    return d;
  }
  const std::vector<int> succ_of = RingNeighbours(g, ring_order, 1);
  const std::vector<int> pred_of = RingNeighbours(g, ring_order, -1);
  auto pred = [&](int r) { return pred_of[static_cast<size_t>(r)]; };
  // view[r][peer]: rank r's figures for its edge with `peer`.
  std::vector<std::map<int, EdgeInput>> view(static_cast<size_t>(g));
  std::vector<const RankInput*> by_rank(static_cast<size_t>(g), nullptr);
  for (const RankInput& r : ranks) {
    if (r.rank < 0 || r.rank >= g) continue;
    by_rank[static_cast<size_t>(r.rank)] = &r;
    for (const EdgeInput& e : r.edges) {
      if (e.peer < 0 || e.peer >= g || e.peer == r.rank) continue;
      view[static_cast<size_t>(r.rank)][e.peer] = e;
    }
  }
  auto get = [&](int r, int peer) -> const EdgeInput* {
    auto& m = view[static_cast<size_t>(r)];
    auto it = m.find(peer);
    return it == m.end() ? nullptr : &it->second;
  };
  auto wait_on = [&](int r, int peer) {
    const EdgeInput* e = get(r, peer);
    return e == nullptr ? 0.0 : e->wait_seconds;
  };
  auto reduce_of = [&](int r) {
    double s = 0;
    for (const auto& [peer, e] : view[static_cast<size_t>(r)]) {
      s += e.reduce_seconds;
    }
    return s;
  };
  
  for (int from = 0; from < g; ++from) {
    for (int to = 0; to < g; ++to) {
      if (from == to) continue;
      const EdgeInput* rx = get(to, from);    // the receiver's view
      const EdgeInput* tx = get(from, to);    // the sender's view
      if (rx == nullptr && tx == nullptr) continue;
      EdgeReport e;
      e.from = from;
      e.to = to;
      e.ring = g > 1 && to == succ_of[static_cast<size_t>(from)];
      e.bytes = rx != nullptr ? rx->bytes_received : tx->bytes_sent;
      e.wait_seconds = rx != nullptr ? rx->wait_seconds : 0;
      e.wait_p50_seconds = rx != nullptr ? rx->wait_p50_seconds : 0;
      e.wait_p99_seconds = rx != nullptr ? rx->wait_p99_seconds : 0;
      e.errors = (rx != nullptr ? rx->errors : 0) +
                 (tx != nullptr ? tx->errors : 0);
      // Without the sender's own figures (a dead rank) nothing is known
      // about what it added.
      if (e.ring && by_rank[static_cast<size_t>(from)] != nullptr) {
        e.added_wait_seconds = std::max(
            0.0, e.wait_seconds - wait_on(from, pred(from)));
      }
      e.wire_seconds = tx != nullptr ? tx->wire_seconds : 0;
      e.throughput_bps = e.wire_seconds > 0
                             ? static_cast<double>(e.bytes) / e.wire_seconds
                             : 0;
      if (e.bytes == 0 && e.wait_seconds == 0 && e.errors == 0) continue;
      d.edges.push_back(e);
    }
  }

  std::vector<const EdgeReport*> ring;
  std::vector<double> ring_rates;
  for (const EdgeReport& e : d.edges) {
    if (e.ring && e.bytes > 0) {
      ring.push_back(&e);
      if (e.throughput_bps > 0) ring_rates.push_back(e.throughput_bps);
    }
  }
  std::string errors;
  for (const EdgeReport& e : d.edges) {
    if (e.errors > 0) {
      absl::StrAppend(&errors, errors.empty() ? "; errors on edge " : ", ",
                      e.from, "->", e.to, " (", e.errors, ")");
    }
  }
  if (ring.empty()) {
    d.summary = absl::StrCat("no ring traffic in the window", errors);
    return d;
  }
  const EdgeReport* slowest = ring[0];
  for (const EdgeReport* e : ring) {
    if (e->added_wait_seconds > slowest->added_wait_seconds ||
        (e->added_wait_seconds == slowest->added_wait_seconds &&
         e->throughput_bps < slowest->throughput_bps)) {
      slowest = e;
    }
  }
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
  // Ring time: after the fingerprint pass (older workers: all of it).
  auto ring_seconds = [&](int r) {
    const RankInput* in = by_rank[static_cast<size_t>(r)];
    if (in == nullptr) return 0.0;
    return in->ring_seconds > 0 ? in->ring_seconds : in->op_seconds;
  };
  std::vector<double> stalls, lags, per_op_ring;
  for (const RankInput* in : by_rank) {
    if (in == nullptr) continue;
    stalls.push_back(in->stall_seconds);
    if (in->arrival_ops > 0) lags.push_back(in->arrival_lag_p50_seconds);
    if (in->ops > 0) per_op_ring.push_back(ring_seconds(in->rank) / in->ops);
  }
  const double median_stall = Median(stalls);
  const double median_lag = Median(lags);
  const double median_ring_op = Median(per_op_ring);
  // The rank that stalls most, and the one whose calls arrive latest.
  const RankInput* stalled = nullptr;
  const RankInput* late = nullptr;
  for (const RankInput* in : by_rank) {
    if (in == nullptr) continue;
    if (stalled == nullptr || in->stall_seconds > stalled->stall_seconds) {
      stalled = in;
    }
    if (in->arrival_ops >= options.min_arrival_ops &&
        (late == nullptr ||
         in->arrival_lag_p50_seconds > late->arrival_lag_p50_seconds)) {
      late = in;
    }
  }
  if (stalled != nullptr) {
    const double excess = stalled->stall_seconds - median_stall;
    if (excess < options.min_added_wait_s ||
        excess < options.min_share * stalled->op_seconds) {
      stalled = nullptr;
    }
  }
  if (late != nullptr) {
    const double excess = late->arrival_lag_p50_seconds - median_lag;
    // The next latest caller: a late rank stands out from every other.
    double next_lag = 0;
    for (const RankInput* in : by_rank) {
      if (in != nullptr && in != late && in->arrival_ops > 0) {
        next_lag = std::max(next_lag, in->arrival_lag_p50_seconds);
      }
    }
    if (excess < options.min_lag_s ||
        excess < options.min_share * median_ring_op ||
        late->arrival_lag_p50_seconds - next_lag < options.min_lag_s) {
      late = nullptr;
    }
  }
  const int s = slowest->from;
  const int succ = slowest->to;
  const double succ_ring = ring_seconds(succ);
  const bool edge_significant =
      slowest->added_wait_seconds >= options.min_added_wait_s &&
      (succ_ring <= 0 ||
       slowest->added_wait_seconds >= options.min_share * succ_ring);
  const std::string edge_sentence = absl::StrFormat(
      "its successor rank %d waited %.2f s of %.2f s in the ring for it, "
      "while rank %d waited %.2f s for rank %d",
      succ, slowest->wait_seconds, succ_ring, s, wait_on(s, pred(s)),
      pred(s));
  auto lag_sentence = [&](const RankInput& in) {
    return absl::StrFormat(
        "its calls arrive %.0f ms after the others' (p50 over the last "
        "minute, p99 %.0f ms, ranks' median %.0f ms)",
        in.arrival_lag_p50_seconds * 1e3, in.arrival_lag_p99_seconds * 1e3,
        median_lag * 1e3);
  };
  // A rank that is slow inside the ring holds its predecessor's frames
  // back, so the ranks upstream of it end later and call later: a late
  // caller whose lag is less than what the slowest edge adds per operation
  // is that edge's echo, not the cause.
  if (late != nullptr && edge_significant && late->rank != s) {
    const RankInput* succ_in = by_rank[static_cast<size_t>(succ)];
    const uint64_t ops = succ_in != nullptr ? succ_in->ops : 0;
    const double added_per_op =
        ops > 0 ? slowest->added_wait_seconds / static_cast<double>(ops) : 0;
    if (added_per_op >= late->arrival_lag_p50_seconds - median_lag) {
      late = nullptr;
    }
  }
  if (stalled != nullptr) {
    const int r = stalled->rank;
    d.stalled_rank = r;
    d.straggler_rank = r;
    std::string text = absl::StrFormat(
        "rank %d is the straggler: its process did not run for %.2f s of the "
        "window (ranks' median %.2f s): the host stops, starves or swaps it",
        r, stalled->stall_seconds, median_stall);
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
        late->arrival_lag_p99_seconds * 1e3, median_lag * 1e3);
    if (edge_significant && s == r) absl::StrAppend(&text, "; ", edge_sentence);
    d.summary = text;
  } else if (edge_significant) {
    std::vector<double> reduces;
    for (int r = 0; r < g; ++r) reduces.push_back(reduce_of(r));
    d.straggler_rank = s;
    d.summary = absl::StrFormat(
        "rank %d is the straggler: %s and reduced for %.2f s (median rank "
        "%.2f s); edge %d->%d writes at %s",
        s, edge_sentence, reduce_of(s), Median(reduces), s, succ,
        FormatRate(slowest->throughput_bps));
  } else {
    d.summary = absl::StrFormat(
        "no straggler: the most wait one rank adds in the ring is %.3f s "
        "(edge %d->%d), calls arrive %.0f ms after the first (ranks' median "
        "p50)",
        slowest->added_wait_seconds, s, succ, median_lag * 1e3);
  }
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
