// The pieces of halka's torch.distributed backend (torch_pg.cc) that are
// not the process group itself: the Work it returns, and how torch's
// tensors, dtypes, reduce ops, split sizes and store values map to halka's, with the
// checks that turn a bad call into a RuntimeError naming it. Included by
// torch_pg.cc only (one translation unit: torch headers are slow to
// compile).
#ifndef HALKA_CLIENT_PYTHON_TORCH_WORK_H_
#define HALKA_CLIENT_PYTHON_TORCH_WORK_H_

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "halka/types.h"

namespace halka::torch_backend {

using c10d::OpType;

// What torch calls per collective: on torch >= 2 a c10d::Backend (registered
// for devices "cpu" and "cuda"; torch's ProcessGroup dispatches to it), on
// 1.13 the c10d::ProcessGroup itself.
#if TORCH_VERSION_MAJOR >= 2
using HalkaBackendBase = c10d::Backend;
#else
using HalkaBackendBase = c10d::ProcessGroup;
#endif

// A queued operation: completes its future (the output tensors) on the
// group's thread, or fails it with the operation's error.
class HalkaWork : public c10d::Work {
 public:
  HalkaWork(OpType type, std::vector<at::Tensor> outputs)
      : Work(-1, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override {
    return future_->completed() && !future_->hasError();
  }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError()
               ? future_->exception_ptr()
               : nullptr;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  // Without a timeout (kNoTimeout) the operation's own deadline bounds the
  // wait. With one, a wait that outlasts it throws, naming the operation;
  // the operation goes on (bounded by its deadline) and a later wait or
  // the future still gets its outcome, as with gloo.
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout > std::chrono::milliseconds(0)) {
      std::unique_lock<std::mutex> l(mu_);
      if (!cv_.wait_for(l, timeout, [this] { return finished_; })) {
        TORCH_CHECK(false, what_, ": Timed out after ", timeout.count(),
                    " ms in Work.wait; the operation is still running (it "
                    "ends at its own deadline at the latest)");
      }
    }
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

  void Finish(const absl::Status& status, const std::string& what) {
    if (status.ok()) {
      future_->markCompleted(c10::IValue(outputs_));
    } else {
      // " Timed out " as gloo and torch's own tests word a timeout.
      const bool late = status.code() == absl::StatusCode::kDeadlineExceeded;
      future_->setError(std::make_exception_ptr(std::runtime_error(
          absl::StrCat(what, late ? ": Timed out (" : ": ",
                       absl::StatusCodeToString(status.code()),
                       late ? "): " : ": ", status.message()))));
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      finished_ = true;
    }
    cv_.notify_all();
  }
  void set_what(std::string what) { what_ = std::move(what); }
  // A recv from any source: the torch rank its message came from, set on
  // the group's thread before Finish.
  int sourceRank() const override {
    const int r = source_rank_.load();
    TORCH_CHECK(r >= 0, "ProcessGroup halka: sourceRank() is known once a "
                "recv from any source has completed");
    return r;
  }
  void set_source_rank(int rank) { source_rank_.store(rank); }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::string what_ = "halka operation";  // set before it is queued
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::atomic<int> source_rank_{-1};
};

inline const char* OpName(OpType t) {
  switch (t) {
    case OpType::ALLREDUCE: return "allreduce";
    case OpType::BROADCAST: return "broadcast";
    case OpType::ALLGATHER: return "allgather";
    case OpType::_ALLGATHER_BASE: return "_allgather_base";
    case OpType::REDUCE_SCATTER: return "reduce_scatter";
    case OpType::_REDUCE_SCATTER_BASE: return "_reduce_scatter_base";
    case OpType::BARRIER: return "barrier";
    case OpType::REDUCE: return "reduce";
    case OpType::GATHER: return "gather";
    case OpType::SCATTER: return "scatter";
    case OpType::ALLTOALL_BASE: return "alltoall_base";
    case OpType::ALLTOALL: return "alltoall";
    case OpType::ALLREDUCE_COALESCED: return "allreduce_coalesced";
    case OpType::ALLGATHER_COALESCED: return "allgather_coalesced";
    case OpType::SEND: return "send";
    case OpType::RECV: return "recv";
    case OpType::RECVANYSOURCE: return "recv_anysource";
    default: return "operation";
  }
}

// halka's element type for a torch dtype; nullopt where halka has none.
inline std::optional<DType> HalkaDType(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kChar: return DType::kInt8;
    case at::kByte: return DType::kUInt8;
    case at::kBool: return DType::kBool;
    case at::kShort: return DType::kInt16;
    default: return std::nullopt;
  }
}

// How a tensor's elements travel: as `dtype`, `per_element` of them for
// each of the tensor's elements (numel() x per_element in all).
struct Elements {
  DType dtype;
  size_t per_element;
  size_t count(const at::Tensor& t) const {
    return static_cast<size_t>(t.numel()) * per_element;
  }
};

// For collectives that only move data (broadcast, all-gather, scatter,
// gather, all-to-all): any dtype; one halka has no type for (complex,
// float8, uint16, ...) travels as its bytes.
inline Elements Moved(const at::Tensor& t) {
  if (std::optional<DType> d = HalkaDType(t.scalar_type())) return {*d, 1};
  return {DType::kUInt8, static_cast<size_t>(t.element_size())};
}

// For reductions: halka's type (bool: SUM/MAX or, PROD/MIN and), or a
// complex tensor under SUM or AVG as its real and imaginary parts.
inline Elements Reduced(const at::Tensor& t, ReduceOp op, const char* name) {
  const at::ScalarType s = t.scalar_type();
  if (s == at::kComplexFloat || s == at::kComplexDouble) {
    TORCH_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg,
                "ProcessGroup halka: ", name, " reduces complex tensors with "
                "SUM or AVG only (MIN, MAX and PRODUCT are not defined on "
                "them elementwise)");
    return {s == at::kComplexFloat ? DType::kFloat32 : DType::kFloat64, 2};
  }
  std::optional<DType> d = HalkaDType(s);
  TORCH_CHECK(d.has_value(), "ProcessGroup halka: ", name,
              " does not reduce dtype ", s, " (halka reduces float32, "
              "float64, float16, bfloat16, int64, int32, int16, int8, uint8, "
              "bool, and complex under SUM/AVG)");
  TORCH_CHECK(!(*d == DType::kBool && op == ReduceOp::kAvg),
              "ProcessGroup halka: ", name, ": AVG is not defined for bool");
  return {*d, 1};
}

inline ReduceOp ToOp(const c10d::ReduceOp& op, const char* name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::kSum;
    case c10d::ReduceOp::AVG: return ReduceOp::kAvg;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::kProd;
    default:
      TORCH_CHECK(false, "ProcessGroup halka: ", name,
                  " does not support reduce op ", static_cast<int>(op.op_),
                  " (halka has SUM, AVG, MIN, MAX, PRODUCT)");
  }
}

// The one tensor of a call (its dtype is each operation's to check: Moved,
// Reduced; a non-contiguous one travels through Dense).
inline at::Tensor Single(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "ProcessGroup halka: ", op,
              " takes exactly one tensor per process, got ", tensors.size());
  return tensors[0];
}

// A contiguous tensor with t's elements: t itself, or a copy of a
// non-contiguous t (a view such as t[:, 1]), as gloo accepts them.
inline at::Tensor Dense(const at::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

// After an operation wrote Dense(t): the result into t, where it was a copy.
inline void CopyBack(const at::Tensor& t, const at::Tensor& dense) {
  if (!dense.is_same(t)) t.copy_(dense);
}

// The tensors of a coalesced call, checked: at least one, each contiguous,
// all of the first one's dtype and device.
inline void CheckCoalesced(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(!ts.empty(), "ProcessGroup halka: ", op, " needs tensors");
  for (const at::Tensor& t : ts) {
    TORCH_CHECK(t.is_contiguous() && t.scalar_type() == ts[0].scalar_type() &&
                    t.device() == ts[0].device(),
                "ProcessGroup halka: ", op, ": every tensor must be "
                "contiguous, with the first one's dtype and device");
  }
}

// Every tensor's elements, one after another, in one new flat tensor.
inline at::Tensor Flatten(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : ts) flat.push_back(t.reshape(-1));
  return at::cat(flat);
}

// The inverse: `ts` get `flat`'s elements from element `at` on.
inline void Unflatten(const at::Tensor& flat, int64_t at,
                      const std::vector<at::Tensor>& ts) {
  for (const at::Tensor& t : ts) {
    t.view(-1).copy_(flat.narrow(0, at, t.numel()));
    at += t.numel();
  }
}

// A value in torch's store, as bytes and back.
inline std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
inline std::string Str(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

// Split sizes by rank for a group of g: as given, or equal when empty.
inline std::vector<int64_t> Splits(const std::vector<int64_t>& given,
                                 int64_t rows, int g, const char* side,
                                 const char* op) {
  if (given.empty()) {
    TORCH_CHECK(rows % g == 0, "ProcessGroup halka: ", op, ": the ", side,
                "'s ", rows, " rows do not split evenly over ", g, " ranks");
    return std::vector<int64_t>(static_cast<size_t>(g), rows / g);
  }
  TORCH_CHECK(static_cast<int>(given.size()) == g, "ProcessGroup halka: ",
              op, ": ", side, " split sizes name ", given.size(),
              " ranks, the group has ", g);
  int64_t sum = 0;
  for (int64_t v : given) {
    TORCH_CHECK(v >= 0, "ProcessGroup halka: ", op, ": a negative split size");
    sum += v;
  }
  TORCH_CHECK(sum == rows, "ProcessGroup halka: ", op, ": ", side,
              " split sizes add up to ", sum, " rows, the tensor has ", rows);
  return given;
}

}  // namespace halka::torch_backend

#endif  // HALKA_CLIENT_PYTHON_TORCH_WORK_H_
