// Subgroups of halka's torch backend (new_group, new_subgroups inside a
// default group of halka's): the process's default group's connection
// (JobConnection, set by the newest default group) and JoinSubgroup, which
// finds a new group's job ranks and tag through the group's store. A
// subgroup runs on that connection as a halka group (OpOptions::group), a
// sub-ring of the job, not a second cluster. Included by torch_group.h.
#ifndef HALKA_CLIENT_PYTHON_TORCH_SUBGROUP_H_
#define HALKA_CLIENT_PYTHON_TORCH_SUBGROUP_H_

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "halka/client.h"
#include "torch_work.h"

namespace halka::torch_backend {

// The process's default halka group's connection and job rank, which its
// subgroups run on (set by the newest default group).
struct JobConnection {
  std::weak_ptr<Client> client;
  int rank = -1;
};
inline std::mutex& JobMu() {
  static auto* mu = new std::mutex;
  return *mu;
}
inline JobConnection& Job() {
  static auto* job = new JobConnection;
  return *job;
}

// A subgroup as this rank joined it: the default group's connection, the
// job rank of each group rank (torch's), and the tag that tells apart
// groups of the same ranks.
struct Subgroup {
  std::shared_ptr<Client> client;
  std::vector<int> job_ranks;
  uint64_t tag = 0;
};

// Every member publishes its job rank in the group's store, so group rank
// r is job rank job_ranks[r]; the group's first rank draws the tag
// (new_group([0, 1]) twice gives two groups).
inline Subgroup JoinSubgroup(const c10::intrusive_ptr<c10d::Store>& store,
                             int rank, int size) {
  Subgroup sg;
  int job_rank = -1;
  {
    std::lock_guard<std::mutex> l(JobMu());
    sg.client = Job().client.lock();
    job_rank = Job().rank;
  }
  TORCH_CHECK(sg.client != nullptr && job_rank >= 0,
              "ProcessGroup halka: a new group needs the default process "
              "group to be halka's (init_process_group(\"halka\")) and "
              "alive");
  if (rank == 0) {
    std::random_device rd;
    store->set("halka/group_tag",
               Bytes(absl::StrCat((uint64_t{rd()} << 32) | rd())));
  }
  TORCH_CHECK(absl::SimpleAtoi(Str(store->get("halka/group_tag")), &sg.tag),
              "ProcessGroup halka: the group's tag is not a number");
  store->set(absl::StrCat("halka/job_rank/", rank),
             Bytes(absl::StrCat(job_rank)));
  sg.job_ranks.assign(size, -1);
  for (int r = 0; r < size; ++r) {
    int h = -1;
    TORCH_CHECK(
        absl::SimpleAtoi(Str(store->get(absl::StrCat("halka/job_rank/", r))),
                         &h) &&
            h >= 0 &&
            std::find(sg.job_ranks.begin(), sg.job_ranks.end(), h) ==
                sg.job_ranks.end(),
        "ProcessGroup halka: group rank ", r, " has no distinct job rank");
    sg.job_ranks[r] = h;
  }
  return sg;
}

}  // namespace halka::torch_backend

#endif  // HALKA_CLIENT_PYTHON_TORCH_SUBGROUP_H_
