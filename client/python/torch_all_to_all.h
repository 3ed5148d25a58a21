// The layout of halka's torch all-to-all (HalkaGroup::AllToAll): every
// rank's split sizes, all-gathered, say where each part goes. Host tensors
// travel as halka's all-to-all of parts padded to the largest part any
// rank sends (Pack, UnpackParts); CUDA tensors as an all-gather of every
// rank's input padded to the largest input (UnpackGathered). Pure tensor
// arithmetic: no client, no queue. Included by torch_group.h.
#ifndef HALKA_CLIENT_PYTHON_TORCH_ALL_TO_ALL_H_
#define HALKA_CLIENT_PYTHON_TORCH_ALL_TO_ALL_H_

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace halka::torch_backend {

struct AllToAllLayout {
  // `counts`: g x g int64, counts[h][dst] what halka rank h sends to torch
  // rank dst; `to_halka`: the halka rank of each torch rank; `me`: this
  // rank's torch rank; `elems_out[src]`: what this rank's output split
  // expects from torch rank src.
  AllToAllLayout(const at::Tensor& counts, const std::vector<int>& to_halka,
                 int me, const std::vector<int64_t>& elems_out)
      : g(static_cast<int>(to_halka.size())),
        me(me),
        c(counts.data_ptr<int64_t>()),
        to_halka(to_halka) {
    for (int h = 0; h < g; ++h) {
      int64_t sum = 0;
      for (int dst = 0; dst < g; ++dst) {
        sum += c[h * g + dst];
        widest_part = std::max(widest_part, c[h * g + dst]);
      }
      widest = std::max(widest, sum);
    }
    for (int src = 0; src < g && fits.ok(); ++src) {
      const int64_t sent = c[to_halka[src] * g + me];
      if (sent != elems_out[static_cast<size_t>(src)]) {
        fits = absl::InvalidArgumentError(absl::StrCat(
            "torch rank ", src, " sends ", sent, " elements to this rank, "
            "whose output split expects ", elems_out[static_cast<size_t>(src)]));
      }
    }
  }

  // `in` (elems_in[dst] elements for torch rank dst, one after another) as
  // g parts of widest_part elements, part k for halka rank k.
  at::Tensor Pack(const at::Tensor& in,
                  const std::vector<int64_t>& elems_in) const {
    at::Tensor parts = at::zeros({g * widest_part}, in.options());
    int64_t from = 0;
    for (int dst = 0; dst < g; ++dst) {
      const int64_t n = elems_in[static_cast<size_t>(dst)];
      parts.narrow(0, to_halka[dst] * widest_part, n)
          .copy_(in.narrow(0, from, n));
      from += n;
    }
    return parts;
  }

  // After the all-to-all, part h of `parts` came from halka rank h: into
  // `out` in torch rank order.
  void UnpackParts(const at::Tensor& parts, const at::Tensor& out) const {
    int64_t at = 0;
    for (int src = 0; src < g; ++src) {
      const int h = to_halka[src];
      const int64_t n = c[h * g + me];
      out.narrow(0, at, n).copy_(parts.narrow(0, h * widest_part, n));
      at += n;
    }
  }

  // After the all-gather of every rank's input padded to `widest`: this
  // rank's part of each into `out` in torch rank order.
  void UnpackGathered(const at::Tensor& flat, const at::Tensor& out) const {
    int64_t at = 0;
    for (int src = 0; src < g; ++src) {
      const int h = to_halka[src];
      int64_t skip = 0;
      for (int dst = 0; dst < me; ++dst) skip += c[h * g + dst];
      const int64_t n = c[h * g + me];
      out.narrow(0, at, n).copy_(flat.narrow(0, h * widest + skip, n));
      at += n;
    }
  }

  const int g;
  const int me;
  const int64_t* const c;  // counts' data, alive as long as counts
  const std::vector<int>& to_halka;
  int64_t widest = 1;       // the largest input any rank sends, in all
  int64_t widest_part = 1;  // the largest part any rank sends to one rank
  absl::Status fits;        // this rank's output split against the counts
};

}  // namespace halka::torch_backend

#endif  // HALKA_CLIENT_PYTHON_TORCH_ALL_TO_ALL_H_
