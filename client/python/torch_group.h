// The machinery of halka's torch.distributed backend (torch_pg.cc holds
// the collectives torch calls): where the worker comes from (HALKA_WORKER
// or an embedded one, the rendezvous address through torch's store), the
// map between torch and halka ranks, the FIFO threads that run a group's
// operations in issue order (collectives, sends, receives: one each), and the helpers the collectives are
// written in (AllReduceNow, BroadcastNow, AllGatherNow, Gather, Scatter,
// AllToAll, Enqueue). Included by torch_pg.cc only: one translation unit,
// because torch's headers are slow to compile.
#ifndef HALKA_CLIENT_PYTHON_TORCH_GROUP_H_
#define HALKA_CLIENT_PYTHON_TORCH_GROUP_H_

#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "halka/client.h"
#include "halka/embedded.h"
#include "halka/types.h"
#include "torch_all_to_all.h"
#include "torch_lane.h"
#include "torch_subgroup.h"
#include "torch_work.h"

namespace halka::torch_backend {

inline std::string RandomJob() {
  std::random_device rd;
  return absl::StrCat("torch-", absl::Hex(rd()), absl::Hex(rd()));
}

class HalkaGroup;

// Every live group, so that the interpreter's exit can stop them first
// (ShutdownAll, from halka.torch's atexit hook). Never destroyed (used at
// exit).
inline std::mutex& LiveGroupsMu() {
  static auto* mu = new std::mutex;
  return *mu;
}
inline std::set<HalkaGroup*>& LiveGroups() {
  static auto* groups = new std::set<HalkaGroup*>;
  return *groups;
}

class HalkaGroup : public HalkaBackendBase {
 public:
  // `subgroup`: a group torch makes inside the default group (new_group,
  // new_subgroups): it runs on the default group's connection as a halka
  // group of the job's ranks (OpOptions::group), not a second cluster.
  HalkaGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank,
             int size, double timeout_s, bool subgroup = false)
      : HalkaBackendBase(rank, size),
        timeout_(timeout_s > 0 ? absl::Seconds(timeout_s)
                               : kDefaultOpTimeout) {
    if (subgroup) {
      // The group's collectives name their roots and slices by group rank
      // (to_halka_ is the identity); sends and receives name job ranks.
      Subgroup sg = JoinSubgroup(store, rank, size);
      client_ = std::move(sg.client);
      group_ = std::move(sg.job_ranks);
      group_tag_ = sg.tag;
      to_halka_.resize(size);
      to_torch_.resize(size);
      for (int r = 0; r < size; ++r) {
        to_halka_[r] = r;
        to_torch_[r] = r;
      }
      peer_ = group_;
    } else {
      const char* daemon = std::getenv("HALKA_WORKER");
      int halka_rank = rank;
      if (daemon != nullptr && *daemon != '\0') {
        client_ = Must(Client::Connect(daemon), "connect to HALKA_WORKER");
        const WorkerInfo info = Must(client_->Info(), "ask the worker");
        TORCH_CHECK(info.world_size == size, "ProcessGroup halka: the worker ",
                    daemon, " is in a job of ", info.world_size,
                    " ranks, the process group has ", size);
        halka_rank = info.rank;
      } else {
        StartEmbedded(store, rank, size);
      }
      store->set(absl::StrCat("halka/rank/", rank),
                 Bytes(absl::StrCat(halka_rank)));
      to_halka_.resize(size);
      to_torch_.assign(size, -1);
      for (int r = 0; r < size; ++r) {
        int h = -1;
        TORCH_CHECK(absl::SimpleAtoi(Str(store->get(absl::StrCat("halka/rank/", r))), &h) &&
                        h >= 0 && h < size && to_torch_[h] < 0,
                    "ProcessGroup halka: torch rank ", r, " has no distinct halka rank");
        to_halka_[r] = h;
        to_torch_[h] = r;
        identity_ = identity_ && h == r;
      }
      peer_ = to_halka_;
      std::lock_guard<std::mutex> l(JobMu());
      Job() = JobConnection{client_, halka_rank};
    }
    for (Lane* lane : {&ops_, &sends_, &recvs_}) {
      lane->thread = std::thread([this, lane] { Loop(*lane); });
    }
    std::lock_guard<std::mutex> l(LiveGroupsMu());
    LiveGroups().insert(this);
  }

  ~HalkaGroup() override {
    Unlist();
    Shutdown();
  }

  // The group's sequence number, as gloo keeps one (torch checks that
  // ranks agree on it, e.g. for a new group's object collectives): 0 when
  // set, one more per collective issued. Every rank issues the same
  // collectives in the same order, so they agree; sends and receives,
  // which only two ranks issue, do not count.
  void setSequenceNumberForGroup() override { seq_.store(0); }
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  // Before the interpreter exits (halka.torch registers it with atexit,
  // on the main thread, with the GIL): stops every live group, failing
  // the operations still queued instead of running them. Otherwise a
  // group torch never destroyed would go on running its queue while
  // Python finalizes, and a lane thread that drops the last reference to
  // a tensor then needs the GIL, which a finalizing interpreter answers
  // by ending the thread (std::terminate: an abort at exit). Holds the
  // list's lock throughout: a group being destroyed meanwhile waits in
  // Unlist, alive, until this is done with it.
  static void ShutdownAll() {
    std::lock_guard<std::mutex> l(LiveGroupsMu());
    // The groups that own a worker first: stopping it ends its subgroups'
    // running operations too (they share it), which would otherwise hold
    // the exit until their deadline.
    for (bool owners : {true, false}) {
      for (HalkaGroup* g : LiveGroups()) {
        if ((g->worker_ != nullptr) == owners) g->Shutdown(/*abandon=*/true);
      }
    }
    LiveGroups().clear();
  }

 protected:
  // Off the list of live groups (idempotent; each destructor calls it
  // first).
  void Unlist() {
    std::lock_guard<std::mutex> l(LiveGroupsMu());
    LiveGroups().erase(this);
  }

  // Stops the group's threads once their queued operations finished (each
  // bounded by its deadline), then the worker. With `abandon` (the
  // process is exiting): the queued operations fail with CANCELLED
  // instead of running, a running one that does not end within 0.5 s is
  // ended by stopping the embedded worker (ABORTED; on a worker daemon it
  // runs to its deadline), and the lanes' threads touch nothing of
  // Python's after their running operation. Idempotent: a second caller waits for the
  // first (std::call_once), without the GIL, which the lane threads may
  // need meanwhile (a DDP hook). The derived class calls it first, so no
  // operation runs on a half-destroyed group.
  void Shutdown(bool abandon = false) {
    if (Py_IsInitialized() && PyGILState_Check()) {
      pybind11::gil_scoped_release release;
      std::call_once(shutdown_once_, [this, abandon] { ShutdownOnce(abandon); });
    } else {
      std::call_once(shutdown_once_, [this, abandon] { ShutdownOnce(abandon); });
    }
  }

  void ShutdownOnce(bool abandon) {
    if (abandon) abandoned_.store(true);
    std::vector<Item> dropped;
    for (Lane* lane : {&ops_, &sends_, &recvs_}) {
      {
        std::lock_guard<std::mutex> l(lane->mu);
        lane->stop = true;
        if (abandon) {
          for (Item& item : lane->queue) dropped.push_back(std::move(item));
          lane->queue.clear();
        }
      }
      lane->cv.notify_all();
    }
    for (Item& item : dropped) {
      item.work->Finish(
          absl::CancelledError("the process is exiting: the operation was "
                               "queued and never ran"),
          absl::StrCat("halka ", item.name, " (rank ", getRank(), " of ",
                       getSize(), ")"));
    }
    dropped.clear();
    if (abandon && !WaitIdle(absl::Milliseconds(500))) {
      worker_.reset();  // ends its running operations (ABORTED)
    }
    Stop();
  }

  // Whether every lane finished its running operation by `wait`.
  bool WaitIdle(absl::Duration wait) {
    const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(wait);
    bool idle = true;
    for (Lane* lane : {&ops_, &sends_, &recvs_}) {
      std::unique_lock<std::mutex> l(lane->mu);
      idle = lane->cv.wait_until(l, until, [lane] { return !lane->busy; }) && idle;
    }
    return idle;
  }

  void Stop() {
    // Each lane ends after its running operation (bounded by its
    // deadline); Lane::Drain names one that takes long.
    const auto start = std::chrono::steady_clock::now();
    ops_.Drain("collectives", getRank(), getSize(), start);
    sends_.Drain("sends", getRank(), getSize(), start);
    recvs_.Drain("receives", getRank(), getSize(), start);
    client_.reset();
    worker_.reset();
    rendezvous_.reset();
  }

  // The halka rank a send or recv names for torch rank `r` (a job rank),
  // and the torch rank of the job rank a message came from (-1: none of
  // this group's).
  int PeerOf(int r) const { return peer_[static_cast<size_t>(r)]; }
  // The tag a message of this group carries: torch's own in the default
  // group; in a subgroup one mixed with the group's tag, so that the
  // group's messages and the default group's (or another group's) between
  // the same two ranks do not match each other's receives.
  int TagOf(int tag) const {
    if (group_.empty()) return tag;
    uint64_t h = group_tag_ ^ (static_cast<uint64_t>(static_cast<uint32_t>(tag)) *
                               0x9e3779b97f4a7c15ull);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return static_cast<int>(static_cast<uint32_t>(h));
  }
  int TorchOfPeer(int job_rank) const {
    auto at = std::find(peer_.begin(), peer_.end(), job_rank);
    return at == peer_.end() ? -1 : static_cast<int>(at - peer_.begin());
  }

  template <typename T>
  static T Must(absl::StatusOr<T> v, const char* what) {
    TORCH_CHECK(v.ok(), "ProcessGroup halka: cannot ", what, ": ",
                v.status().ToString());
    return std::move(*v);
  }

  void StartEmbedded(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                     int size) {
    const char* host_env = std::getenv("HALKA_HOST");
    const std::string host =
        host_env != nullptr && *host_env != '\0' ? host_env : "127.0.0.1";
    if (rank == 0) {
      rendezvous_ = Must(EmbeddedRendezvous::Start(absl::StrCat(host, ":0")),
                         "start the rendezvous");
      store->set("halka/job", Bytes(RandomJob()));
      store->set("halka/rendezvous", Bytes(rendezvous_->address()));
    }
    EmbeddedWorker::Options wo;
    wo.job_id = Str(store->get("halka/job"));
    wo.rendezvous = Str(store->get("halka/rendezvous"));
    wo.rank = rank;
    wo.world_size = size;
    wo.listen = absl::StrCat(host, ":0");
    wo.op_timeout = timeout_;
    wo.join_timeout = timeout_;
    // Blocks until every rank joined (the constructor runs without the GIL).
    worker_ = Must(EmbeddedWorker::Start(wo), "start the embedded worker");
    client_ = Must(Client::Connect(worker_->address()), "connect to the worker");
  }

  // A collective's options: its deadline and, in a subgroup, the group.
  OpOptions Opts(std::chrono::milliseconds timeout) const {
    OpOptions o;
    o.timeout = timeout.count() > 0 ? absl::FromChrono(timeout) : timeout_;
    o.group = group_;
    o.group_tag = group_tag_;
    return o;
  }

  static void SameShape(const at::Tensor& t, const at::Tensor& like,
                        const char* op) {
    TORCH_CHECK(t.scalar_type() == like.scalar_type() &&
                    t.numel() == like.numel() && t.device() == like.device(),
                "ProcessGroup halka: ", op, ": every tensor must have the "
                "input's dtype, size and device");
  }

  // Each of `big` has the world times the elements of `small`'s tensor at
  // the same place, the same dtype and device, and is contiguous.
  void CheckWorldTimes(const std::vector<at::Tensor>& big,
                       const std::vector<at::Tensor>& small,
                       const char* op) const {
    TORCH_CHECK(big.size() == small.size(), "ProcessGroup halka: ", op,
                " needs as many outputs as inputs");
    for (size_t i = 0; i < big.size(); ++i) {
      TORCH_CHECK(big[i].is_contiguous() &&
                      big[i].scalar_type() == small[i].scalar_type() &&
                      big[i].device() == small[i].device() &&
                      big[i].numel() == getSize() * small[i].numel(),
                  "ProcessGroup halka: ", op, ": tensor ", i, " needs ",
                  getSize(), " x the elements of its counterpart, its dtype "
                  "and device, contiguous");
    }
  }

  void CheckRoot(int64_t root, const char* op) const {
    TORCH_CHECK(root >= 0 && root < getSize(), "ProcessGroup halka: ", op,
                " root ", root, " is not a rank of this group of ", getSize());
  }

  // Whether a CUDA tensor's collective goes through host memory: a
  // subgroup's does (a halka group's collectives take host memory; they
  // run beside the job's, which own the worker's device context).
  bool Staged(const at::Tensor& t) const {
    return t.is_cuda() && !group_.empty();
  }
  // Runs call(in, out) on host copies of `in` and `out` (one copy when
  // they are the same tensor) and copies the result into `out` when it
  // succeeded.
  template <typename Call>
  static absl::Status OnHost(const at::Tensor& in, const at::Tensor& out,
                             Call&& call) {
    at::Tensor hin = in.to(at::kCPU);
    at::Tensor hout = in.is_same(out)
                          ? hin
                          : at::empty(out.sizes(), out.options().device(at::kCPU));
    absl::Status s = call(hin, hout);
    if (s.ok()) out.copy_(hout);
    return s;
  }

  // An all-reduce of t in place, on the group's thread (a CUDA tensor's
  // memory stays on the device, except in a subgroup: a host copy).
  absl::Status AllReduceNow(const at::Tensor& t, Elements e, ReduceOp op,
                            const OpOptions& o) {
    if (Staged(t)) {
      return OnHost(t, t, [&](const at::Tensor& h, const at::Tensor&) {
        return AllReduceNow(h, e, op, o);
      });
    }
    const size_t n = e.count(t);
    const DType d = e.dtype;
    return (t.is_cuda() ? client_->AllReduceDevice(t.data_ptr(), n, d, op, o)
                        : client_->AllReduce(t.data_ptr(), n, d, op, o))
        .status();
  }

  // A broadcast of t from halka rank `root`, on the group's thread.
  absl::Status BroadcastNow(const at::Tensor& t, int root,
                            const OpOptions& o) {
    if (Staged(t)) {
      return OnHost(t, t, [&](const at::Tensor& h, const at::Tensor&) {
        return BroadcastNow(h, root, o);
      });
    }
    const Elements e = Moved(t);
    const size_t n = e.count(t);
    const DType d = e.dtype;
    return (t.is_cuda() ? client_->BroadcastDevice(t.data_ptr(), n, d, root, o)
                        : client_->Broadcast(t.data_ptr(), n, d, root, o))
        .status();
  }

  // An all-gather of `in` into `flat` on the group's thread (a CUDA
  // tensor's memory stays on the device, except in a subgroup).
  absl::Status AllGatherNow(const at::Tensor& in, const at::Tensor& flat,
                            const OpOptions& o) {
    if (Staged(in) || Staged(flat)) {
      return OnHost(in, flat, [&](const at::Tensor& hin, const at::Tensor& h) {
        return AllGatherNow(hin, h, o);
      });
    }
    const Elements e = Moved(in);
    const size_t n = e.count(in);
    const size_t total = e.count(flat);
    const DType d = e.dtype;
    return (in.is_cuda()
                ? client_->AllGatherDevice(in.data_ptr(), n, flat.data_ptr(),
                                           total, d, o)
                : client_->AllGather(in.data_ptr(), n, flat.data_ptr(), total,
                                     d, o))
        .status();
  }

  // Queues an all-to-all of `in` (elems_in[d] elements for torch rank d,
  // one after another) into `out` (elems_out[s] from torch rank s): every
  // rank's counts by one all-gather (int64, on the CPU); then, on host
  // tensors, halka's all-to-all with every part padded to the largest
  // part any rank sends (each part straight to its rank), on CUDA tensors
  // an all-gather of every rank's input padded to the largest; then `place`.
  c10::intrusive_ptr<c10d::Work> AllToAll(
      OpType type, at::Tensor in, at::Tensor out,
      std::vector<int64_t> elems_in, std::vector<int64_t> elems_out,
      std::vector<at::Tensor> outputs, OpOptions o,
      std::function<void()> place) {
    const int g = getSize();
    const int me = getRank();
    return Enqueue(type, std::move(outputs), [this, in, out, elems_in,
                                              elems_out, o, place, g, me] {
      at::Tensor mine = at::tensor(elems_in, at::kLong);
      at::Tensor counts = at::empty({g * g}, at::kLong);
      absl::Status s = AllGatherNow(mine, counts, o);
      if (!s.ok()) return s;
      // Every rank runs the data step (the same size everywhere), also one
      // whose output split is wrong: it fails alone, afterwards, and its
      // peers are not left waiting.
      const AllToAllLayout l(counts, to_halka_, me, elems_out);
      if (!in.is_cuda()) {
        at::Tensor parts = l.Pack(in, elems_in);
        const Elements e = Moved(parts);
        s = client_->AllToAll(parts.data_ptr(), parts.data_ptr(),
                              e.count(parts), e.dtype, o)
                .status();
        if (!s.ok()) return s;
        if (!l.fits.ok()) return l.fits;
        l.UnpackParts(parts, out);
        place();
        return absl::OkStatus();
      }
      at::Tensor padded = at::zeros({l.widest}, in.options());
      padded.narrow(0, 0, in.numel()).copy_(in);
      at::Tensor flat = at::empty({g * l.widest}, in.options());
      s = AllGatherNow(padded, flat, o);
      if (!s.ok()) return s;
      if (!l.fits.ok()) return l.fits;
      l.UnpackGathered(flat, out);
      place();
      return absl::OkStatus();
    });
  }

  // Queues a send of t to torch rank `dst`, or a recv into t from torch
  // rank `src` (-1: from any; the work's sourceRank() says whose). The
  // tensor travels through host memory (a CUDA one is copied), as bytes
  // where halka has no element type; a non-contiguous one as a copy.
  c10::intrusive_ptr<c10d::Work> PointToPoint(OpType type, at::Tensor t,
                                              int peer, int tag) {
    const bool send = type == OpType::SEND;
    TORCH_CHECK(peer == -1 || (peer >= 0 && peer < getSize() && peer != getRank()),
                "ProcessGroup halka: ", OpName(type), ": rank ", peer,
                " is not another rank of this group of ", getSize());
    OpOptions o = Opts(std::chrono::milliseconds(0));
    o.group.clear();  // a message names job ranks
    auto work = c10::make_intrusive<HalkaWork>(
        type, std::vector<at::Tensor>{t});
    HalkaWork* w = work.get();  // lives while queued (the item holds it)
    const int halka_peer = peer < 0 ? -1 : PeerOf(peer);
    tag = TagOf(tag);
    return Enqueue(work, type, [this, t, send, halka_peer, tag, o, w] {
      at::Tensor host = t.is_cuda() || !t.is_contiguous()
                            ? t.to(at::kCPU).contiguous()
                            : t;
      const Elements e = Moved(host);
      const size_t n = e.count(host);
      absl::StatusOr<OpInfo> info =
          send ? client_->Send(host.data_ptr(), n, e.dtype, halka_peer, tag, o)
               : client_->Recv(host.data_ptr(), n, e.dtype, halka_peer, tag, o);
      if (!info.ok()) return info.status();
      if (!send) {
        if (!host.is_same(t)) t.copy_(host);
        const int source = TorchOfPeer(info->peer);
        if (source < 0) {
          // A recv from any rank of a subgroup took a message of a rank
          // outside it (a message names no group).
          return absl::FailedPreconditionError(absl::StrCat(
              "recv from any rank took a message of job rank ", info->peer,
              ", which is not in this group"));
        }
        w->set_source_rank(source);
      }
      return absl::OkStatus();
    });
  }

  // Queues an all-gather of `in` into `flat` (halka rank order), then
  // `place` (on the group's thread, after success) puts it where torch
  // wants it; the future's value is `outputs`.
  c10::intrusive_ptr<c10d::Work> Gather(OpType type, at::Tensor in,
                                        at::Tensor flat,
                                        std::vector<at::Tensor> outputs,
                                        OpOptions o,
                                        std::function<void()> place) {
    return Enqueue(type, std::move(outputs),
                   [this, in, flat, o, place = std::move(place)] {
      absl::Status s = AllGatherNow(in, flat, o);
      if (s.ok()) place();
      return s;
    });
  }

  // Queues a reduce-scatter of `send` (halka rank order) into `out`.
  c10::intrusive_ptr<c10d::Work> Scatter(
      OpType type, at::Tensor send, at::Tensor out, ReduceOp op, OpOptions o,
      std::function<void()> place = [] {}) {
    const Elements e = Reduced(out, op, OpName(type));
    return Enqueue(type, {out}, [this, send, out, e, op, o, place] {
      const size_t n = e.count(send);
      const size_t m = e.count(out);
      const DType d = e.dtype;
      if (Staged(send) || Staged(out)) {
        absl::Status s = OnHost(send, out, [&](const at::Tensor& hin,
                                               const at::Tensor& h) {
          return client_->ReduceScatter(hin.data_ptr(), n, h.data_ptr(), m, d,
                                        op, o)
              .status();
        });
        if (s.ok()) place();
        return s;
      }
      const absl::Status s =
          (send.is_cuda()
                  ? client_->ReduceScatterDevice(send.data_ptr(), n,
                                                 out.data_ptr(), m, d, op, o)
                  : client_->ReduceScatter(send.data_ptr(), n, out.data_ptr(),
                                           m, d, op, o))
              .status();
      if (s.ok()) place();
      return s;
    });
  }


  c10::intrusive_ptr<c10d::Work> Enqueue(OpType type,
                                         std::vector<at::Tensor> outputs,
                                         std::function<absl::Status()> run) {
    return Enqueue(c10::make_intrusive<HalkaWork>(type, std::move(outputs)),
                   type, std::move(run));
  }
  c10::intrusive_ptr<c10d::Work> Enqueue(c10::intrusive_ptr<HalkaWork> work,
                                         OpType type,
                                         std::function<absl::Status()> run) {
    work->set_what(absl::StrCat("halka ", OpName(type), " (rank ", getRank(),
                                " of ", getSize(), ")"));
    // Sends and receives have lanes of their own: a recv waiting for its
    // peer holds up neither the collectives nor this rank's sends (torch's
    // batch_isend_irecv posts every recv before any send).
    Lane& lane = type == OpType::SEND                                ? sends_
                 : type == OpType::RECV || type == OpType::RECVANYSOURCE ? recvs_
                                                                     : ops_;
    if (&lane == &ops_) seq_.fetch_add(1);
    {
      std::lock_guard<std::mutex> l(lane.mu);
      if (!lane.stop) {
        lane.queue.push_back({work, std::move(run), OpName(type)});
        lane.cv.notify_all();
        return work;
      }
    }
    // Stopped (destroyed, or the process is exiting): nothing would run it.
    work->Finish(absl::CancelledError("the process group is shut down"),
                 absl::StrCat("halka ", OpName(type), " (rank ", getRank(),
                              " of ", getSize(), ")"));
    return work;
  }

  void Loop(Lane& lane) {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> l(lane.mu);
        lane.cv.wait(l, [&lane] { return lane.stop || !lane.queue.empty(); });
        if (lane.queue.empty()) return;
        item = std::move(lane.queue.front());
        lane.queue.pop_front();
        lane.busy = true;
        lane.running = item.name;
      }
      absl::Status s;
      try {
        s = item.run();
      } catch (const std::exception& e) {
        s = absl::InternalError(e.what());
      }
      if (abandoned_.load()) {
        // The interpreter is exiting: neither the item's tensors nor the
        // future's callbacks may be let go of from this thread (either
        // may need the GIL). Leaked on purpose; the process ends.
        new Item(std::move(item));  // NOLINT: deliberately leaked
      } else {
        item.work->Finish(s, absl::StrCat("halka ", item.name, " (rank ",
                                          getRank(), " of ", getSize(), ")"));
      }
      {
        std::lock_guard<std::mutex> l(lane.mu);
        lane.busy = false;
        lane.running = "(nothing: between operations)";
      }
      lane.cv.notify_all();
    }
  }

  using Item = LaneItem;

  absl::Duration timeout_;
  std::unique_ptr<EmbeddedRendezvous> rendezvous_;
  std::unique_ptr<EmbeddedWorker> worker_;
  std::shared_ptr<Client> client_;  // a subgroup shares the job's
  std::vector<int> group_;  // a subgroup's job ranks, by torch rank; empty
  uint64_t group_tag_ = 0;  // a subgroup's (OpOptions::group_tag)
  std::vector<int> peer_;   // the job rank of each torch rank (send, recv)
  std::vector<int> to_halka_;  // by torch rank
  std::vector<int64_t> to_torch_;  // by halka rank
  bool identity_ = true;           // torch rank == halka rank everywhere
  // Operations run one by one per lane (torch_lane.h), in issue order:
  // the collectives (every rank issues them in the same order, as the
  // worker requires), the sends, the receives.
  Lane ops_, sends_, recvs_;
  std::once_flag shutdown_once_;
  std::atomic<bool> abandoned_{false};  // ShutdownAll: the process exits
  std::atomic<uint64_t> seq_{0};  // getSequenceNumberForGroup
};

}  // namespace halka::torch_backend

#endif  // HALKA_CLIENT_PYTHON_TORCH_GROUP_H_
