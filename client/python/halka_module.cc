// halka._halka: the C++ SDK (halka::Client, halka::LocalCluster) for
// Python. Tensors arrive as (address, element count, dtype) from the
// package's Python layer (halka/__init__.py), which takes them from NumPy
// arrays and torch tensors without copying; every call releases the GIL.
// A failed call raises the halka.Error subclass of its status code
// (halka/_errors.py) with the worker's message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>

#include <cstdint>
#include <memory>
#include <string>

#include "fatal_backtrace.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client_proto.h"
#include "common/job_state.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "halka/types.h"

namespace py = pybind11;

namespace halka {
namespace {

// A failed absl::Status on its way to Python.
struct StatusException {
  absl::Status status;
};

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) throw StatusException{v.status()};
  return std::move(*v);
}

OpOptions Options(double timeout_s, int algorithm) {
  OpOptions o;
  if (timeout_s > 0) o.timeout = absl::Seconds(timeout_s);
  o.algorithm = static_cast<Algorithm>(algorithm);
  return o;
}

void* Ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

DType ToDType(int code) {
  for (DType d : kAllDTypes) {
    if (static_cast<int>(d) == code) return d;
  }
  throw StatusException{
      absl::InvalidArgumentError(absl::StrCat("unknown dtype code ", code))};
}

ReduceOp ToOp(int code) {
  for (ReduceOp o : kAllReduceOps) {
    if (static_cast<int>(o) == code) return o;
  }
  throw StatusException{
      absl::InvalidArgumentError(absl::StrCat("unknown op code ", code))};
}

// Runs `call` without the GIL and returns its OpInfo (or raises).
template <typename F>
OpInfo Run(F call) {
  absl::StatusOr<OpInfo> info;
  {
    py::gil_scoped_release release;
    info = call();
  }
  return Check(std::move(info));
}

class PyClient {
 public:
  explicit PyClient(std::shared_ptr<Client> c, std::vector<int> group = {})
      : c_(std::move(c)), group_(std::move(group)) {}
  static std::shared_ptr<PyClient> Connect(const std::string& target) {
    return std::make_shared<PyClient>(Check(Client::Connect(target)));
  }
  // The same connection, its collectives on a group of the job's ranks
  // (OpOptions::group).
  std::shared_ptr<PyClient> WithGroup(std::vector<int> ranks,
                                      uint64_t tag) const {
    if (ranks.empty()) {
      throw StatusException{
          absl::InvalidArgumentError("a group needs at least one rank")};
    }
    auto view = std::make_shared<PyClient>(c_, std::move(ranks));
    view->group_tag_ = tag;
    return view;
  }
  OpOptions Opts(double timeout_s, int algorithm) const {
    OpOptions o = Options(timeout_s, algorithm);
    o.group = group_;
    o.group_tag = group_tag_;
    return o;
  }

  OpInfo AllReduce(uintptr_t p, size_t n, int dtype, int op, bool device,
                   double timeout_s, int algorithm) {
    const DType d = ToDType(dtype);
    const ReduceOp o = ToOp(op);
    const OpOptions opt = Opts(timeout_s, algorithm);
    return Run([&] {
      return device ? c_->AllReduceDevice(Ptr(p), n, d, o, opt)
                    : c_->AllReduce(Ptr(p), n, d, o, opt);
    });
  }
  OpInfo Broadcast(uintptr_t p, size_t n, int dtype, int root, bool device,
                   double timeout_s, int algorithm) {
    const DType d = ToDType(dtype);
    const OpOptions opt = Opts(timeout_s, algorithm);
    return Run([&] {
      return device ? c_->BroadcastDevice(Ptr(p), n, d, root, opt)
                    : c_->Broadcast(Ptr(p), n, d, root, opt);
    });
  }
  OpInfo AllGather(uintptr_t send, size_t send_n, uintptr_t recv,
                   size_t recv_n, int dtype, bool device, double timeout_s) {
    const DType d = ToDType(dtype);
    const OpOptions opt = Opts(timeout_s, 0);
    return Run([&] {
      return device ? c_->AllGatherDevice(Ptr(send), send_n, Ptr(recv), recv_n,
                                          d, opt)
                    : c_->AllGather(Ptr(send), send_n, Ptr(recv), recv_n, d,
                                    opt);
    });
  }
  OpInfo ReduceScatter(uintptr_t send, size_t send_n, uintptr_t recv,
                       size_t recv_n, int dtype, int op, bool device,
                       double timeout_s) {
    const DType d = ToDType(dtype);
    const ReduceOp o = ToOp(op);
    const OpOptions opt = Opts(timeout_s, 0);
    return Run([&] {
      return device ? c_->ReduceScatterDevice(Ptr(send), send_n, Ptr(recv),
                                              recv_n, d, o, opt)
                    : c_->ReduceScatter(Ptr(send), send_n, Ptr(recv), recv_n,
                                        d, o, opt);
    });
  }
  // Rooted collectives and all-to-all on host memory (0: no buffer).
  OpInfo Reduce(uintptr_t send, uintptr_t recv, size_t n, int dtype, int op,
                int root, double timeout_s, int algorithm) {
    const DType d = ToDType(dtype);
    const ReduceOp o = ToOp(op);
    const OpOptions opt = Opts(timeout_s, algorithm);
    return Run([&] { return c_->Reduce(Ptr(send), Ptr(recv), n, d, o, root, opt); });
  }
  OpInfo Gather(uintptr_t send, size_t send_n, uintptr_t recv, size_t recv_n,
                int dtype, int root, double timeout_s) {
    const DType d = ToDType(dtype);
    const OpOptions opt = Opts(timeout_s, 0);
    return Run([&] {
      return c_->Gather(Ptr(send), send_n, Ptr(recv), recv_n, d, root, opt);
    });
  }
  OpInfo Scatter(uintptr_t send, size_t send_n, uintptr_t recv, size_t recv_n,
                 int dtype, int root, double timeout_s) {
    const DType d = ToDType(dtype);
    const OpOptions opt = Opts(timeout_s, 0);
    return Run([&] {
      return c_->Scatter(Ptr(send), send_n, Ptr(recv), recv_n, d, root, opt);
    });
  }
  OpInfo AllToAll(uintptr_t send, uintptr_t recv, size_t n, int dtype,
                  double timeout_s) {
    const DType d = ToDType(dtype);
    const OpOptions opt = Opts(timeout_s, 0);
    return Run([&] { return c_->AllToAll(Ptr(send), Ptr(recv), n, d, opt); });
  }
  // Point to point on host memory (a device tensor goes through the host).
  // In a group's view, peers are group ranks: sent to and taken from the
  // job rank the group names (a message has no group: a recv from any
  // rank may take a non-member's, and OpInfo.peer is then -1).
  OpInfo Send(uintptr_t data, size_t n, int dtype, int to, int tag,
              double timeout_s) {
    const DType d = ToDType(dtype);
    const OpOptions opt = Options(timeout_s, 0);
    const int peer = JobRank(to);
    return Run([&] { return c_->Send(Ptr(data), n, d, peer, tag, opt); });
  }
  OpInfo Recv(uintptr_t data, size_t n, int dtype, int from, int tag,
              double timeout_s) {
    const DType d = ToDType(dtype);
    const OpOptions opt = Options(timeout_s, 0);
    const int peer = from < 0 ? from : JobRank(from);
    OpInfo info =
        Run([&] { return c_->Recv(Ptr(data), n, d, peer, tag, opt); });
    if (!group_.empty()) {
      auto at = std::find(group_.begin(), group_.end(), info.peer);
      info.peer = at == group_.end() ? -1 : static_cast<int>(at - group_.begin());
    }
    return info;
  }
  OpInfo Barrier(double timeout_s) {
    const OpOptions opt = Opts(timeout_s, 0);
    return Run([&] { return c_->Barrier(opt); });
  }
  std::string InfoJson() {
    absl::StatusOr<v1::InfoReply> r;
    {
      py::gil_scoped_release release;
      r = ClientProto::Info(*c_);
    }
    return Check(JobJson(Check(std::move(r))));
  }
  std::string HealthJson() {
    absl::StatusOr<v1::RingHealth> h;
    {
      py::gil_scoped_release release;
      h = ClientProto::RingHealth(*c_);
    }
    return Check(JobJson(Check(std::move(h))));
  }

 private:
  // A group rank's job rank (the job's view: itself).
  int JobRank(int rank) const {
    if (group_.empty()) return rank;
    if (rank < 0 || rank >= static_cast<int>(group_.size())) {
      throw StatusException{absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " is not a rank of this group of ", group_.size()))};
    }
    return group_[static_cast<size_t>(rank)];
  }
  std::shared_ptr<Client> c_;
  const std::vector<int> group_;
  uint64_t group_tag_ = 0;
};

class PyLocalCluster {
 public:
  PyLocalCluster(int workers, double op_timeout_s, size_t chunk_bytes,
                 double heartbeat_timeout_s) {
    LocalCluster::Options o;
    o.workers = workers;
    if (op_timeout_s > 0) o.op_timeout = absl::Seconds(op_timeout_s);
    if (chunk_bytes > 0) o.chunk_bytes = chunk_bytes;
    if (heartbeat_timeout_s > 0) {
      o.heartbeat_timeout = absl::Seconds(heartbeat_timeout_s);
    }
    absl::StatusOr<std::unique_ptr<LocalCluster>> c;
    {
      py::gil_scoped_release release;
      c = LocalCluster::Start(o);
    }
    c_ = Check(std::move(c));
  }
  LocalCluster& get() {
    if (c_ == nullptr) {
      throw StatusException{
          absl::FailedPreconditionError("the local cluster is closed")};
    }
    return *c_;
  }
  void CheckRank(int rank) {
    if (rank < 0 || rank >= get().size() || get().worker(rank) == nullptr) {
      throw StatusException{absl::InvalidArgumentError(
          absl::StrCat("no live rank ", rank, " in a cluster of ",
                       get().size()))};
    }
  }
  void Close() {
    py::gil_scoped_release release;
    c_.reset();
  }

 private:
  std::unique_ptr<LocalCluster> c_;
};

}  // namespace
}  // namespace halka

PYBIND11_MODULE(_halka, m) {
  m.attr("native_backtrace") = halka::InstallFatalBacktraceFromEnv();
  using halka::OpInfo;
  using halka::PyClient;
  using halka::PyLocalCluster;
  m.doc() = "halka's C++ SDK (use the halka package, not this module)";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const halka::StatusException& e) {
      py::object make = py::module_::import("halka._errors").attr("from_status");
      py::object err = make(static_cast<int>(e.status.code()),
                            std::string(e.status.message()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())),
                      err.ptr());
    }
  });

  py::class_<OpInfo>(m, "OpInfo")
      .def_readonly("op_seq", &OpInfo::op_seq)
      .def_readonly("algorithm", &OpInfo::algorithm)
      .def_readonly("bytes_sent", &OpInfo::bytes_sent)
      .def_readonly("bytes_received", &OpInfo::bytes_received)
      .def_readonly("seconds", &OpInfo::seconds)
      .def_readonly("rank", &OpInfo::rank)
      .def_readonly("world_size", &OpInfo::world_size)
      .def_readonly("generation", &OpInfo::generation)
      .def_readonly("zero_copy", &OpInfo::zero_copy)
      .def_readonly("transfer", &OpInfo::transfer)
      .def_readonly("peer", &OpInfo::peer)
      .def_readonly("model_seconds", &OpInfo::model_seconds)
      .def("__repr__", [](const OpInfo& i) {
        return absl::StrCat("OpInfo(op_seq=", i.op_seq, ", algorithm='",
                            i.algorithm, "', rank=", i.rank, ", world_size=",
                            i.world_size, ", transfer='", i.transfer,
                            "', seconds=", i.seconds, ")");
      });

  py::class_<PyClient, std::shared_ptr<PyClient>>(m, "Client")
      .def_static("connect", &PyClient::Connect, py::arg("target"))
      .def("all_reduce", &PyClient::AllReduce)
      .def("broadcast", &PyClient::Broadcast)
      .def("all_gather", &PyClient::AllGather)
      .def("reduce_scatter", &PyClient::ReduceScatter)
      .def("reduce", &PyClient::Reduce)
      .def("gather", &PyClient::Gather)
      .def("scatter", &PyClient::Scatter)
      .def("all_to_all", &PyClient::AllToAll)
      .def("barrier", &PyClient::Barrier)
      .def("send", &PyClient::Send)
      .def("recv", &PyClient::Recv)
      .def("with_group", &PyClient::WithGroup)
      .def("info_json", &PyClient::InfoJson)
      .def("ring_health_json", &PyClient::HealthJson);

  py::class_<PyLocalCluster>(m, "LocalCluster")
      .def(py::init<int, double, size_t, double>())
      .def("size", [](PyLocalCluster& c) { return c.get().size(); })
      .def("rendezvous_address",
           [](PyLocalCluster& c) { return c.get().rendezvous_address(); })
      .def("worker_address",
           [](PyLocalCluster& c, int rank) {
             c.CheckRank(rank);
             return c.get().worker_address(rank);
           })
      .def("kill_worker",
           [](PyLocalCluster& c, int rank) {
             c.CheckRank(rank);
             py::gil_scoped_release release;
             c.get().KillWorker(rank);
           })
      .def("close", &PyLocalCluster::Close);
}
