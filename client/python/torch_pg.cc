// halka._halka_torch: the torch.distributed backend "halka" over
// halka::Client, for torch 1.13 (Debian bookworm: a c10d::ProcessGroup) and
// torch 2.x (Debian trixie's 2.6: a c10d::Backend, which torch's
// ProcessGroup dispatches to per device). TORCH_VERSION_MAJOR picks the base
// class (HalkaBackendBase below); the collectives' signatures are the same in
// both. `import halka.torch` registers it.
//
// Where the worker comes from: HALKA_WORKER=unix:/path or host:port names
// a running halka-worker daemon (whose job must have the group's size);
// otherwise each process starts its own worker in-process, rank 0 also
// starts the rendezvous (on HALKA_HOST, default 127.0.0.1), and its address
// and a fresh job id travel through torch's store. Each process publishes
// its halka rank in the store, so torch ranks map to halka ranks (they are
// equal for embedded workers).
//
// Threads: operations are queued and run one by one, in issue order, on
// one of the group's three FIFO threads: the collectives' (every rank
// issues them in the same order, as the worker requires), the sends', the
// receives' (a recv waiting for its peer holds up neither of the others);
// each Work's future completes there, so callers (DDP's hooks)
// overlap communication with computation. Every operation carries a
// deadline: the op's timeout, else init_process_group's timeout.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "halka/client.h"
#include "halka/embedded.h"
#include "halka/types.h"
#include "torch_group.h"
#include "torch_work.h"

namespace halka {
namespace {

namespace py = pybind11;
using namespace torch_backend;  // NOLINT: this file's own pieces

// The tag of monitoredBarrier's messages (one no torch caller passes).
constexpr int kMonitoredBarrierTag = -0x6d62;  // "mb"

class ProcessGroupHalka : public HalkaGroup {
 public:
  using HalkaGroup::HalkaGroup;
  ~ProcessGroupHalka() override {
    Unlist();
    Shutdown();
  }

  const std::string getBackendName() const override { return "halka"; }

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override {
    at::Tensor t = Single(tensors, "allreduce");
    const ReduceOp op = ToOp(opts.reduceOp, "allreduce");
    const OpOptions o = Opts(opts.timeout);
    const Elements e = Reduced(t, op, "allreduce");
    const at::Tensor c = Dense(t);
    return Enqueue(OpType::ALLREDUCE, {t}, [this, t, c, e, op, o] {
      const absl::Status s = AllReduceNow(c, e, op, o);
      if (s.ok()) CopyBack(t, c);
      return s;
    });
  }

  // Point to point: only the two ranks call; a rank's messages to one
  // peer arrive in the order sent, and the recv's tag and size must match
  // the message's (an error naming both otherwise).
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dstRank, int tag) override {
    return PointToPoint(OpType::SEND, Single(tensors, "send"), dstRank, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int srcRank, int tag) override {
    TORCH_CHECK(srcRank >= 0, "ProcessGroup halka: recv from rank ", srcRank);
    return PointToPoint(OpType::RECV, Single(tensors, "recv"), srcRank, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(
      std::vector<at::Tensor>& tensors, int tag) override {
    return PointToPoint(OpType::RECVANYSOURCE, Single(tensors, "recv"), -1,
                        tag);
  }

  // gloo's monitored barrier, on halka's send/recv (torch's Python
  // monitored_barrier refuses every backend but gloo by name: call
  // halka.torch.monitored_barrier, or the group's monitored_barrier). Every
  // rank but 0 sends to rank 0 and waits for its answer; rank 0 takes each
  // rank's message in rank order within the one timeout, and answers all
  // once every rank arrived. A rank that does not arrive is named by rank
  // 0 (the first in rank order, or all of them with waitAllRanks), and
  // the others learn that rank 0 failed (they are not answered). Runs on
  // the calling thread, beside the queued operations.
  void monitoredBarrier(const c10d::BarrierOptions& opts,
                        bool waitAllRanks) override {
    const std::chrono::milliseconds timeout =
        opts.timeout.count() >= 0
            ? opts.timeout
            : std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_));
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const int me = getRank();
    const int tag = TagOf(kMonitoredBarrierTag);
    uint8_t token = 1;
    auto left = [&] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
    };
    auto within = [&](std::chrono::milliseconds ms) {
      OpOptions o;
      o.timeout = absl::FromChrono(std::max(ms, std::chrono::milliseconds(1)));
      return o;
    };
    if (me != 0) {
      absl::Status s =
          client_->Send(&token, 1, DType::kUInt8, PeerOf(0), tag,
                        within(timeout)).status();
      if (s.ok()) {
        s = client_->Recv(&token, 1, DType::kUInt8, PeerOf(0), tag,
                          within(left())).status();
      }
      TORCH_CHECK(s.ok(), "Rank ", me, " successfully reached "
                  "monitoredBarrier, but received errors while waiting for "
                  "send/recv from rank 0. Please check rank 0 logs for faulty "
                  "rank. (halka: ", s.ToString(), ")");
      return;
    }
    std::vector<int> failed;
    std::string first_error;
    for (int r = 1; r < getSize(); ++r) {
      const std::chrono::milliseconds ms = left();
      TORCH_CHECK(ms.count() > 0 || !failed.empty(), "Rank 0 timed out in "
                  "monitoredBarrier after ", timeout.count(), " ms.");
      absl::Status s =
          ms.count() > 0
              ? client_->Recv(&token, 1, DType::kUInt8, PeerOf(r), tag,
                              within(ms)).status()
              : absl::DeadlineExceededError("no time left");
      if (s.ok()) continue;
      TORCH_CHECK(waitAllRanks, "Rank ", r, " failed to pass monitoredBarrier "
                  "in ", timeout.count(), " ms (halka: ", s.ToString(), ")");
      if (failed.empty()) first_error = s.ToString();
      failed.push_back(r);
    }
    TORCH_CHECK(failed.empty(), "Ranks ", absl::StrJoin(failed, ", "),
                " failed to pass monitoredBarrier in ", timeout.count(),
                " ms (halka, the first: ", first_error, ")");
    for (int r = 1; r < getSize(); ++r) {
      absl::Status s = client_->Send(&token, 1, DType::kUInt8, PeerOf(r),
                                     tag, within(timeout)).status();
      TORCH_CHECK(s.ok(), "Rank 0 could not release rank ", r, " from "
                  "monitoredBarrier: ", s.ToString());
    }
  }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override {
    at::Tensor t = Single(tensors, "broadcast");
    CheckRoot(opts.rootRank, "broadcast");
    const int root = to_halka_[opts.rootRank];
    const OpOptions o = Opts(opts.timeout);
    const at::Tensor c = Dense(t);
    return Enqueue(OpType::BROADCAST, {t}, [this, t, c, root, o] {
      const absl::Status s = BroadcastNow(c, root, o);
      if (s.ok()) CopyBack(t, c);
      return s;
    });
  }

  // outputs[0][r] gets torch rank r's input.
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    at::Tensor in = Dense(Single(inputs, "allgather"));
    TORCH_CHECK(outputs.size() == 1 &&
                    static_cast<int>(outputs[0].size()) == getSize(),
                "ProcessGroup halka: allgather needs one list of ", getSize(),
                " output tensors");
    for (const at::Tensor& o : outputs[0]) SameShape(o, in, "allgather");
    std::vector<at::Tensor> outs = outputs[0];
    at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
    return Gather(OpType::ALLGATHER, in, flat, outs, Opts(opts.timeout),
                  [this, outs, flat, n = in.numel()] {
                    for (int h = 0; h < getSize(); ++h) {
                      at::Tensor o = outs[to_torch_[h]];
                      o.copy_(flat.narrow(0, h * n, n).view_as(o));
                    }
                  });
  }

  // output (world x input's size) gets torch rank r's input at slice r.
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts) override {
    std::vector<at::Tensor> ins{input};
    at::Tensor in = Dense(Single(ins, "_allgather_base"));
    at::Tensor out = output;
    TORCH_CHECK(out.is_contiguous() && out.scalar_type() == in.scalar_type() &&
                    out.numel() == getSize() * in.numel(),
                "ProcessGroup halka: _allgather_base needs a contiguous output "
                "of ", getSize(), " x the input's size and dtype");
    if (identity_) {
      return Gather(OpType::_ALLGATHER_BASE, in, out, {out},
                    Opts(opts.timeout), [] {});
    }
    at::Tensor flat = at::empty_like(out);
    return Gather(OpType::_ALLGATHER_BASE, in, flat, {out}, Opts(opts.timeout),
                  [this, out, flat, n = in.numel()] {
                    for (int h = 0; h < getSize(); ++h) {
                      out.view(-1).narrow(0, to_torch_[h] * n, n)
                          .copy_(flat.narrow(0, h * n, n));
                    }
                  });
  }

  // outputs[0] gets the reduction of every rank's inputs[0][rank].
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    at::Tensor out = Single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 &&
                    static_cast<int>(inputs[0].size()) == getSize(),
                "ProcessGroup halka: reduce_scatter needs one list of ",
                getSize(), " input tensors");
    for (const at::Tensor& i : inputs[0]) SameShape(i, out, "reduce_scatter");
    std::vector<at::Tensor> slices;
    for (int h = 0; h < getSize(); ++h) {
      slices.push_back(inputs[0][to_torch_[h]].reshape(-1));
    }
    const at::Tensor c = Dense(out);
    return Scatter(OpType::REDUCE_SCATTER, at::cat(slices), c,
                   ToOp(opts.reduceOp, "reduce_scatter"), Opts(opts.timeout),
                   [out, c] { CopyBack(out, c); });
  }

  // output gets the reduction of every rank's slice rank of input.
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> outs{output};
    at::Tensor out = Single(outs, "_reduce_scatter_base");
    TORCH_CHECK(input.is_contiguous() &&
                    input.scalar_type() == out.scalar_type() &&
                    input.numel() == getSize() * out.numel(),
                "ProcessGroup halka: _reduce_scatter_base needs a contiguous "
                "input of ", getSize(), " x the output's size and dtype");
    at::Tensor send = input.view(-1);
    if (!identity_) {
      send = send.view({getSize(), -1}).index_select(
          0, at::tensor(to_torch_, at::kLong).to(input.device())).view(-1);
    }
    const at::Tensor c = Dense(out);
    return Scatter(OpType::_REDUCE_SCATTER_BASE, send, c,
                   ToOp(opts.reduceOp, "_reduce_scatter_base"),
                   Opts(opts.timeout), [out, c] { CopyBack(out, c); });
  }

  // Rooted collectives and all-to-all: halka's own on host tensors; on
  // CUDA tensors (halka's reduce, gather, scatter and all-to-all take host
  // memory only) composed from the device collectives, which moves more
  // bytes; see the README's PyTorch section.
  //
  // reduce: halka's reduce to the root (host tensors; the others' tensors
  // are not written). A CUDA tensor: an all-reduce on the device, on a copy
  // away from the root.
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override {
    at::Tensor t = Single(tensors, "reduce");
    CheckRoot(opts.rootRank, "reduce");
    const ReduceOp op = ToOp(opts.reduceOp, "reduce");
    const OpOptions o = Opts(opts.timeout);
    const bool root = opts.rootRank == getRank();
    const Elements e = Reduced(t, op, "reduce");
    if (!t.is_cuda()) {
      const at::Tensor src = Dense(t);
      const int hroot = to_halka_[opts.rootRank];
      return Enqueue(OpType::REDUCE, {t}, [this, t, src, root, hroot, e, op, o] {
        void* data = src.data_ptr();
        const absl::Status s =
            client_->Reduce(data, root ? data : nullptr, e.count(src), e.dtype,
                            op, hroot, o)
                .status();
        if (s.ok() && root) CopyBack(t, src);
        return s;
      });
    }
    const at::Tensor target =
        root ? Dense(t) : t.clone(at::MemoryFormat::Contiguous);
    return Enqueue(OpType::REDUCE, {t}, [this, t, root, target, e, op, o] {
      const absl::Status s = AllReduceNow(target, e, op, o);
      if (s.ok() && root) CopyBack(t, target);
      return s;
    });
  }

  // gather: an all-gather; the root places every rank's input in
  // outputs[0] (non-root ranks pass no outputs, as torch requires).
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override {
    at::Tensor in = Dense(Single(inputs, "gather"));
    CheckRoot(opts.rootRank, "gather");
    const bool root = opts.rootRank == getRank();
    std::vector<at::Tensor> outs;
    if (root) {
      TORCH_CHECK(outputs.size() == 1 &&
                      static_cast<int>(outputs[0].size()) == getSize(),
                  "ProcessGroup halka: gather needs one list of ", getSize(),
                  " output tensors on the root");
      for (const at::Tensor& o : outputs[0]) SameShape(o, in, "gather");
      outs = outputs[0];
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                  "ProcessGroup halka: gather takes no output tensors on a "
                  "rank that is not the root");
    }
    auto place = [this, outs](const at::Tensor& flat, int64_t n) {
      if (outs.empty()) return;
      for (int h = 0; h < getSize(); ++h) {
        const at::Tensor& o = outs[to_torch_[h]];
        o.copy_(flat.narrow(0, h * n, n).view_as(o));
      }
    };
    if (!in.is_cuda()) {
      // halka's gather: each rank's input straight to the root.
      at::Tensor flat = root ? at::empty({getSize() * in.numel()}, in.options())
                             : at::Tensor();
      const int hroot = to_halka_[opts.rootRank];
      const OpOptions o = Opts(opts.timeout);
      return Enqueue(OpType::GATHER, std::vector<at::Tensor>(outs),
                     [this, in, flat, hroot, o, place] {
        const Elements e = Moved(in);
        const size_t n = e.count(in);
        const absl::Status s =
            client_->Gather(in.data_ptr(), n,
                            flat.defined() ? flat.data_ptr() : nullptr,
                            n * static_cast<size_t>(getSize()), e.dtype, hroot,
                            o)
                .status();
        if (s.ok() && flat.defined()) place(flat, in.numel());
        return s;
      });
    }
    at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
    return Gather(OpType::GATHER, in, flat, outs, Opts(opts.timeout),
                  [place, flat, n = in.numel()] { place(flat, n); });
  }

  // scatter: halka's scatter (host tensors): the root's inputs, in halka
  // rank order, each straight to its rank. A CUDA tensor: a broadcast of
  // them all on the device, each rank keeping its own.
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override {
    at::Tensor out = Single(outputs, "scatter");
    CheckRoot(opts.rootRank, "scatter");
    const bool root = opts.rootRank == getRank();
    const int64_t n = out.numel();
    const int g = getSize();
    at::Tensor flat;  // halka rank order
    if (root) {
      TORCH_CHECK(inputs.size() == 1 &&
                      static_cast<int>(inputs[0].size()) == g,
                  "ProcessGroup halka: scatter needs one list of ", g,
                  " input tensors on the root");
      for (const at::Tensor& i : inputs[0]) SameShape(i, out, "scatter");
      std::vector<at::Tensor> parts;
      for (int h = 0; h < g; ++h) {
        parts.push_back(inputs[0][to_torch_[h]].reshape(-1));
      }
      flat = at::cat(parts);
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                  "ProcessGroup halka: scatter takes no input tensors on a "
                  "rank that is not the root");
    }
    const int src = to_halka_[opts.rootRank];
    const int me = to_halka_[getRank()];
    const OpOptions o = Opts(opts.timeout);
    if (!out.is_cuda()) {
      const at::Tensor dense = Dense(out);
      return Enqueue(OpType::SCATTER, {out}, [this, flat, out, dense, src, o, g] {
        const Elements e = Moved(dense);
        const size_t each = e.count(dense);
        const absl::Status s =
            client_->Scatter(flat.defined() ? flat.data_ptr() : nullptr,
                             each * static_cast<size_t>(g), dense.data_ptr(),
                             each, e.dtype, src, o)
                .status();
        if (s.ok()) CopyBack(out, dense);
        return s;
      });
    }
    if (!flat.defined()) flat = at::empty({g * n}, out.options());
    return Enqueue(OpType::SCATTER, {out}, [this, flat, out, src, me, o, n] {
      absl::Status s = BroadcastNow(flat, src, o);
      if (s.ok()) out.copy_(flat.narrow(0, me * n, n).view_as(out));
      return s;
    });
  }

  // alltoall_base: split sizes (rows of dim 0; empty: equal) travel by a
  // small all-gather, then every rank's whole input, padded to the largest,
  // by another; each rank copies out the rows sent to it.
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
      const c10d::AllToAllOptions& opts) override {
    std::vector<at::Tensor> ins{input};
    at::Tensor in = Dense(Single(ins, "alltoall_base"));
    TORCH_CHECK(output.is_contiguous() &&
                    output.scalar_type() == in.scalar_type() &&
                    output.device() == in.device(),
                "ProcessGroup halka: alltoall_base needs a contiguous output "
                "of the input's dtype and device");
    const int64_t rows_in = in.dim() == 0 ? 1 : in.size(0);
    const int64_t rows_out = output.dim() == 0 ? 1 : output.size(0);
    const int64_t row = rows_in == 0 ? 0 : in.numel() / rows_in;
    TORCH_CHECK(rows_out == 0 || output.numel() / rows_out == row,
                "ProcessGroup halka: alltoall_base: the output's rows must "
                "have the input's size");
    const std::vector<int64_t> sends =
        Splits(input_splits, rows_in, getSize(), "input", "alltoall_base");
    const std::vector<int64_t> wants =
        Splits(output_splits, rows_out, getSize(), "output", "alltoall_base");
    std::vector<int64_t> elems_in, elems_out;
    for (int64_t v : sends) elems_in.push_back(v * row);
    for (int64_t v : wants) elems_out.push_back(v * row);
    return AllToAll(OpType::ALLTOALL_BASE, in.view(-1), output.view(-1),
                    elems_in, elems_out, {output}, Opts(opts.timeout), [] {});
  }

  // alltoall: the same over lists (inputs[d] goes to torch rank d,
  // outputs[s] comes from torch rank s).
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override {
    TORCH_CHECK(static_cast<int>(inputs.size()) == getSize() &&
                    static_cast<int>(outputs.size()) == getSize(),
                "ProcessGroup halka: alltoall needs ", getSize(),
                " input and ", getSize(), " output tensors");
    std::vector<at::Tensor> parts;
    std::vector<int64_t> elems_in, elems_out;
    int64_t total_out = 0;
    for (int d = 0; d < getSize(); ++d) {
      TORCH_CHECK(inputs[d].scalar_type() == inputs[0].scalar_type() &&
                      inputs[d].device() == inputs[0].device() &&
                      outputs[d].scalar_type() == inputs[0].scalar_type() &&
                      outputs[d].device() == inputs[0].device(),
                  "ProcessGroup halka: alltoall: every tensor must have the "
                  "first input's dtype and device");
      parts.push_back(inputs[d].reshape(-1));
      elems_in.push_back(inputs[d].numel());
      elems_out.push_back(outputs[d].numel());
      total_out += outputs[d].numel();
    }
    at::Tensor out = at::empty({total_out}, inputs[0].options());
    std::vector<at::Tensor> outs = outputs;
    return AllToAll(OpType::ALLTOALL, at::cat(parts), out, elems_in, elems_out,
                    outs, Opts(opts.timeout), [outs, out] {
                      int64_t at = 0;
                      for (const at::Tensor& o : outs) {
                        o.copy_(out.narrow(0, at, o.numel()).view_as(o));
                        at += o.numel();
                      }
                    });
  }

  // allreduce_coalesced: one all-reduce of every tensor's elements.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override {
    CheckCoalesced(tensors, "allreduce_coalesced");
    const ReduceOp op = ToOp(opts.reduceOp, "allreduce_coalesced");
    const Elements e = Reduced(tensors[0], op, "allreduce_coalesced");
    const OpOptions o = Opts(opts.timeout);
    const at::Tensor flat = Flatten(tensors);
    const std::vector<at::Tensor> ts = tensors;
    return Enqueue(OpType::ALLREDUCE_COALESCED, ts, [this, flat, ts, e, op, o] {
      absl::Status s = AllReduceNow(flat, e, op, o);
      if (s.ok()) Unflatten(flat, 0, ts);
      return s;
    });
  }

  // allgather_coalesced: outputs[r][j] gets torch rank r's inputs[j]; one
  // all-gather of every input's elements.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    CheckCoalesced(inputs, "allgather_coalesced");
    TORCH_CHECK(static_cast<int>(outputs.size()) == getSize(),
                "ProcessGroup halka: allgather_coalesced needs one output "
                "list per rank (", getSize(), ")");
    std::vector<at::Tensor> all;
    for (const std::vector<at::Tensor>& list : outputs) {
      TORCH_CHECK(list.size() == inputs.size(), "ProcessGroup halka: "
                  "allgather_coalesced: every output list needs one tensor "
                  "per input");
      for (size_t j = 0; j < list.size(); ++j) {
        SameShape(list[j], inputs[j], "allgather_coalesced");
        all.push_back(list[j]);
      }
    }
    const at::Tensor in = Flatten(inputs);
    const at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
    return Gather(OpType::ALLGATHER_COALESCED, in, flat, all,
                  Opts(opts.timeout),
                  [this, outputs, flat, n = in.numel()] {
                    for (int h = 0; h < getSize(); ++h) {
                      Unflatten(flat, h * n, outputs[to_torch_[h]]);
                    }
                  });
  }

#if TORCH_VERSION_MAJOR >= 2
  // all_gather_into_tensor in a coalescing manager: outputs[i] (world x
  // inputs[i]) gets every rank's inputs[i]; one all-gather.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    CheckCoalesced(inputs, "allgather_into_tensor_coalesced");
    CheckWorldTimes(outputs, inputs, "allgather_into_tensor_coalesced");
    const at::Tensor in = Flatten(inputs);
    const at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
    const std::vector<at::Tensor> outs = outputs;
    return Gather(OpType::COALESCED, in, flat, outs, Opts(opts.timeout),
                  [this, outs, flat, n = in.numel()] {
                    for (int h = 0; h < getSize(); ++h) {
                      int64_t at = h * n;
                      for (const at::Tensor& o : outs) {
                        const int64_t m = o.numel() / getSize();
                        o.view(-1).narrow(0, to_torch_[h] * m, m)
                            .copy_(flat.narrow(0, at, m));
                        at += m;
                      }
                    }
                  });
  }

  // reduce_scatter_tensor in a coalescing manager: outputs[i] gets the
  // reduction of every rank's slice (this rank's) of inputs[i]; one
  // reduce-scatter of the slices laid out rank by rank.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    CheckCoalesced(outputs, "reduce_scatter_tensor_coalesced");
    CheckWorldTimes(inputs, outputs, "reduce_scatter_tensor_coalesced");
    const ReduceOp op = ToOp(opts.reduceOp, "reduce_scatter_tensor_coalesced");
    std::vector<at::Tensor> parts;
    for (int h = 0; h < getSize(); ++h) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        const int64_t m = outputs[i].numel();
        parts.push_back(inputs[i].reshape(-1).narrow(0, to_torch_[h] * m, m));
      }
    }
    const at::Tensor out = at::empty({Flatten(outputs).numel()},
                                     outputs[0].options());
    const std::vector<at::Tensor> outs = outputs;
    return Scatter(OpType::COALESCED, at::cat(parts), out, op,
                   Opts(opts.timeout), [out, outs] { Unflatten(out, 0, outs); });
  }
#endif

  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts) override {
    const OpOptions o = Opts(opts.timeout);
    return Enqueue(OpType::BARRIER, {},
                   [this, o] { return client_->Barrier(o).status(); });
  }
};

}  // namespace
}  // namespace halka

PYBIND11_MODULE(_halka_torch, m) {
  m.doc() = "halka's torch.distributed backend (use `import halka.torch`)";
  m.attr("TORCH_VERSION_MAJOR") = TORCH_VERSION_MAJOR;
  // Registers torch's ProcessGroup, Backend and Store with pybind11 first.
  py::module_::import("torch.distributed");
  py::class_<halka::ProcessGroupHalka, halka::HalkaBackendBase,
             c10::intrusive_ptr<halka::ProcessGroupHalka>>(m, "ProcessGroupHalka")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, double,
                    bool>(),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout_s"), py::arg("subgroup") = false,
           py::call_guard<py::gil_scoped_release>());
  m.def("_shutdown_all", &halka::torch_backend::HalkaGroup::ShutdownAll,
        "Stops every live halka group (halka.torch calls it at exit).");
}
