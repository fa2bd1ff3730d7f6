// How the CUDA backend's memory-bound row kernels lay out their work (kernels.h
// set_row_kernel_tuning), and its text form, the ZIMAGE_ROW_KERNELS setting. Kept apart from the
// launchers so the parser builds and is tested without CUDA.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/text.h"

namespace zimage::cuda {

// 0 in a field = the measured default. norm_ppt: 16-byte packs each thread of a block-per-row
// norm holds (1, 2 or 4; more packs per thread = more loads in flight per multiprocessor, fewer
// threads per row). prologue_items: (token, head) items one warp of the head_dim-128 attention
// prologue loads before it computes (1, 2 or 4); 0 = a block per token row for the packed forms
// of 2-byte types while the staging is on (staged_row_kernels, the default; the same bytes as the
// warp kernel's), else 2. norm_ppt changes which thread sums what, so the last bit of a bf16 result
// may move; every launch in the process uses the same setting. row_walk:
// 1 = the flat-index kernels, 2 = the row-walking kernels of the VAE's group norm (channel counts
// of a power-of-two number of 16-byte packs), its nearest upsampling and SwiGLU (widths a multiple
// of the pack): the same sums and expressions, without per-element 64-bit index arithmetic.
struct RowKernelTuning {
  int norm_ppt = 0;
  int prologue_items = 0;
  int row_walk = 0;
};

// "NORM_PPT,PROLOGUE_ITEMS,ROW_WALK", each 0 (default) or as above, e.g. "2,4,2". An error names
// the part that is wrong.
inline Result<RowKernelTuning> parse_row_kernel_tuning(const std::string& text) {
  const std::vector<std::string> parts = split(text, ',');
  const auto bad = [&](const std::string& what) {
    return InvalidArgument("row kernel tuning '" + text + "': " + what +
                           " (NORM_PPT,PROLOGUE_ITEMS,ROW_WALK: 0|1|2|4, 0|1|2|4, 0|1|2)");
  };
  if (parts.size() != 3) return bad("expected three parts");
  const char* names[] = {"packs per thread", "items per warp", "row walk"};
  int v[3] = {};
  for (int i = 0; i < 3; ++i) {
    const std::string& p = parts[static_cast<size_t>(i)];
    const bool ok = p == "0" || p == "1" || p == "2" || (i < 2 && p == "4");
    if (!ok) return bad(std::string(names[i]) + " '" + p + "'");
    v[i] = p[0] - '0';
  }
  return RowKernelTuning{v[0], v[1], v[2]};
}

}  // namespace zimage::cuda
