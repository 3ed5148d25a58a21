#include "server/ring_diagnosis.h"

#include <algorithm>
#include <functional>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace halka {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int Mod(int a, int n) { return ((a % n) + n) % n; }

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
                           DiagnosisOptions options) {
  RingDiagnosis d;
  if (g < 1) {
    d.summary = "no members";
    return d;
  }
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
  auto op_seconds = [&](int r) {
    const RankInput* in = by_rank[static_cast<size_t>(r)];
    return in == nullptr ? 0.0 : in->op_seconds;
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
      e.ring = g > 1 && to == Mod(from + 1, g);
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
            0.0, e.wait_seconds - wait_on(from, Mod(from - 1, g)));
      }
      // A ring edge's rate counts only the wait this hop adds (the wait
      // passed on from upstream is not its fault); other edges count all.
      const double busy =
          (e.ring ? e.added_wait_seconds : e.wait_seconds) +
          (tx != nullptr ? tx->send_seconds : 0);
      e.throughput_bps = busy > 0 ? static_cast<double>(e.bytes) / busy : 0;
      if (e.bytes == 0 && e.wait_seconds == 0 && e.errors == 0) continue;
      d.edges.push_back(e);
    }
  }

  std::vector<const EdgeReport*> ring;
  std::vector<double> ring_rates;
  for (const EdgeReport& e : d.edges) {
    if (e.ring && e.bytes > 0) {
      ring.push_back(&e);
      ring_rates.push_back(e.throughput_bps);
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
  const double median_rate = Median(ring_rates);
  const int s = slowest->from;
  const int succ = slowest->to;
  const double succ_ops = op_seconds(succ);
  const bool significant =
      slowest->added_wait_seconds >= options.min_added_wait_s &&
      (succ_ops <= 0 ||
       slowest->added_wait_seconds >= options.min_share * succ_ops);
  if (significant && g > 1) {
    d.has_straggler = true;
    d.straggler_rank = s;
    std::vector<double> reduces;
    for (int r = 0; r < g; ++r) reduces.push_back(reduce_of(r));
    d.summary = absl::StrFormat(
        "rank %d is the straggler: its successor rank %d waited %.2f s of "
        "%.2f s for it, while rank %d waited %.2f s for rank %d and reduced "
        "for %.2f s (median rank %.2f s); edge %d->%d carries %s vs %s "
        "median%s",
        s, succ, slowest->wait_seconds, succ_ops, s,
        wait_on(s, Mod(s - 1, g)), Mod(s - 1, g), reduce_of(s),
        Median(reduces), s, succ, FormatRate(slowest->throughput_bps),
        FormatRate(median_rate), errors);
  } else {
    d.summary = absl::StrFormat(
        "no straggler: the most wait one rank adds is %.3f s (edge %d->%d, "
        "%s); ring edges carry %s median%s",
        slowest->added_wait_seconds, s, succ,
        FormatRate(slowest->throughput_bps), FormatRate(median_rate), errors);
  }
  return d;
}

}  // namespace halka
