#include "codec/membership_codec.h"

#include <zlib.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/host_ring.h"

namespace halka {
namespace {

constexpr size_t kMaxInflatedBytes = 64u << 20;

// What identifies a member across generations (its rank may change).
std::string Key(const v1::Member& m) {
  return absl::StrCat(m.worker_id(), std::string(1, '\0'), m.address(),
                      std::string(1, '\0'), m.device(), std::string(1, '\0'),
                      m.since_generation(), std::string(1, '\0'), m.host());
}

// The ring's path the rule gives for m's members' hosts (by rank).
HostRing DerivedHostRing(const v1::Membership& m) {
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<size_t>(m.members_size()));
  for (const v1::Member& x : m.members()) hosts.push_back(x.host());
  return HostRingOrder(hosts);
}

// Leaves out m's ring_order and hosts when the reader can derive them.
void LeaveOutHostRing(v1::Membership* m) {
  if (m->ring_order_size() == 0 && m->hosts_size() == 0) return;
  const HostRing r = DerivedHostRing(*m);
  if (!std::equal(r.order.begin(), r.order.end(), m->ring_order().begin(),
                  m->ring_order().end()) ||
      static_cast<int>(r.hosts.size()) != m->hosts_size()) {
    return;
  }
  for (size_t i = 0; i < r.hosts.size(); ++i) {
    const v1::HostGroup& g = m->hosts(static_cast<int>(i));
    if (g.host() != r.hosts[i].host ||
        !std::equal(r.hosts[i].ranks.begin(), r.hosts[i].ranks.end(),
                    g.ranks().begin(), g.ranks().end())) {
      return;
    }
  }
  m->clear_ring_order();
  m->clear_hosts();
  m->set_host_ring_derived(true);
}

// Puts back what LeaveOutHostRing left out.
void DeriveHostRing(v1::Membership* m) {
  if (!m->host_ring_derived()) return;
  const HostRing r = DerivedHostRing(*m);
  m->mutable_ring_order()->Add(r.order.begin(), r.order.end());
  for (const HostGroup& h : r.hosts) {
    v1::HostGroup* g = m->add_hosts();
    g->set_host(h.host);
    g->mutable_ranks()->Add(h.ranks.begin(), h.ranks.end());
  }
  m->clear_host_ring_derived();
}

}  // namespace

std::string DeflateMembership(const v1::Membership& m) {
  v1::Membership plain = m;
  LeaveOutHostRing(&plain);
  for (v1::Member& x : *plain.mutable_members()) x.clear_last_heartbeat_age_s();
  for (v1::Member& x : *plain.mutable_lost()) x.clear_last_heartbeat_age_s();
  const std::string bytes = plain.SerializeAsString();
  uLongf size = compressBound(static_cast<uLong>(bytes.size()));
  std::string out(size, '\0');
  const int rc =
      compress2(reinterpret_cast<Bytef*>(out.data()), &size,
                reinterpret_cast<const Bytef*>(bytes.data()),
                static_cast<uLong>(bytes.size()), Z_DEFAULT_COMPRESSION);
  if (rc != Z_OK) return std::string();  // only on out-of-memory
  out.resize(size);
  return out;
}

absl::StatusOr<v1::Membership> InflateMembership(const std::string& bytes) {
  z_stream z{};
  if (inflateInit(&z) != Z_OK) {
    return absl::InternalError("membership: inflateInit failed");
  }
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  std::string out;
  int rc = Z_OK;
  while (rc == Z_OK) {
    const size_t have = out.size();
    if (have >= kMaxInflatedBytes) break;
    out.resize(std::min(kMaxInflatedBytes, std::max<size_t>(4 * bytes.size(),
                                                             2 * have + 4096)));
    z.next_out = reinterpret_cast<Bytef*>(out.data() + have);
    z.avail_out = static_cast<uInt>(out.size() - have);
    rc = inflate(&z, Z_NO_FLUSH);
    out.resize(out.size() - z.avail_out);
    if (rc == Z_BUF_ERROR && z.avail_in == 0) break;  // truncated input
    if (rc == Z_BUF_ERROR) rc = Z_OK;                 // needs more room
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END) {
    return absl::InvalidArgumentError(absl::StrCat(
        "membership: not a deflated Membership (", bytes.size(),
        " bytes, zlib code ", rc, ")"));
  }
  v1::Membership m;
  if (!m.ParseFromString(out)) {
    return absl::InvalidArgumentError(
        "membership: the inflated bytes are not a Membership");
  }
  DeriveHostRing(&m);
  return m;
}

v1::Membership MakeMembershipDelta(const v1::Membership& base,
                                   const v1::Membership& next) {
  v1::Membership d = next;
  LeaveOutHostRing(&d);  // before the members go: it reads their hosts
  d.clear_members();
  d.set_delta_base(base.generation());
  absl::flat_hash_map<std::string, int> at;
  at.reserve(static_cast<size_t>(base.members_size()));
  for (int i = 0; i < base.members_size(); ++i) {
    at.emplace(Key(base.members(i)), i);  // the first of duplicates
  }
  std::vector<bool> used(static_cast<size_t>(base.members_size()), false);
  int run_from = 0, run_count = 0;  // run_from -1: entries of d.members
  auto flush = [&] {
    if (run_count == 0) return;
    d.add_delta_runs(run_from);
    d.add_delta_runs(run_count);
  };
  for (int i = 0; i < next.members_size(); ++i) {
    const v1::Member& m = next.members(i);
    int from = -1;
    // A copy renumbers the member to its index: only for members at
    // their rank (every ring's are; the check keeps odd views exact).
    if (m.rank() == i) {
      auto it = at.find(Key(m));
      if (it != at.end() && !used[static_cast<size_t>(it->second)]) {
        from = it->second;
      }
    }
    if (from >= 0) {
      used[static_cast<size_t>(from)] = true;
      if (!m.alive()) d.add_delta_down(i);
    } else {
      *d.add_members() = m;
    }
    const bool extends = run_count > 0 &&
                         (from < 0 ? run_from == -1
                                   : run_from >= 0 && run_from + run_count == from);
    if (extends) {
      ++run_count;
    } else {
      flush();
      run_from = from;
      run_count = 1;
    }
  }
  flush();
  return d;
}

absl::StatusOr<v1::Membership> ApplyMembershipDelta(
    const v1::Membership& base, const v1::Membership& delta) {
  if (delta.delta_base() == 0) return delta;
  if (delta.delta_base() != base.generation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "membership delta of generation ", delta.generation(),
        " is against generation ", delta.delta_base(), ", not ",
        base.generation()));
  }
  if (delta.delta_runs_size() % 2 != 0) {
    return absl::InvalidArgumentError("membership delta: odd delta_runs");
  }
  v1::Membership out = delta;
  out.clear_members();
  out.clear_delta_base();
  out.clear_delta_runs();
  out.clear_delta_down();
  int explicit_next = 0;
  for (int r = 0; r < delta.delta_runs_size(); r += 2) {
    const int from = delta.delta_runs(r);
    const int count = delta.delta_runs(r + 1);
    if (count <= 0 || from < -1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "membership delta: bad run (", from, ", ", count, ")"));
    }
    if (from == -1) {
      if (count > delta.members_size() - explicit_next) {
        return absl::InvalidArgumentError(absl::StrCat(
            "membership delta: run of ", count, " new members, ",
            delta.members_size() - explicit_next, " left"));
      }
      for (int k = 0; k < count; ++k) {
        *out.add_members() = delta.members(explicit_next++);
      }
      continue;
    }
    if (count > base.members_size() - from) {
      return absl::InvalidArgumentError(absl::StrCat(
          "membership delta: run (", from, ", ", count, ") beyond the base's ",
          base.members_size(), " members"));
    }
    for (int k = 0; k < count; ++k) {
      const v1::Member& b = base.members(from + k);
      v1::Member* m = out.add_members();
      m->set_rank(out.members_size() - 1);
      m->set_worker_id(b.worker_id());
      m->set_address(b.address());
      m->set_device(b.device());
      m->set_since_generation(b.since_generation());
      m->set_host(b.host());
      m->set_alive(true);
    }
  }
  if (explicit_next != delta.members_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "membership delta: ", delta.members_size() - explicit_next,
        " new members outside every run"));
  }
  for (int rank : delta.delta_down()) {
    if (rank < 0 || rank >= out.members_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "membership delta: down rank ", rank, " outside the ring of ",
          out.members_size()));
    }
    out.mutable_members(rank)->set_alive(false);
  }
  DeriveHostRing(&out);
  return out;
}

LinkModel LinkModelFromProto(const v1::LinkModel& m) {
  return LinkModel{LevelCost{m.local_alpha_us() * 1e-6, m.local_bytes_per_s()},
                   LevelCost{m.net_alpha_us() * 1e-6, m.net_bytes_per_s()},
                   m.measured_generation()};
}

void LinkModelToProto(const LinkModel& m, v1::LinkModel* out) {
  out->set_local_alpha_us(m.local.alpha_s * 1e6);
  out->set_local_bytes_per_s(m.local.bytes_per_s);
  out->set_net_alpha_us(m.net.alpha_s * 1e6);
  out->set_net_bytes_per_s(m.net.bytes_per_s);
  out->set_measured_generation(m.measured_generation);
}

}  // namespace halka
