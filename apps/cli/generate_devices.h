// `zimage generate --devices`: a batch split over several engines (split_batch in zimage.h),
// the parts run at once, the images joined in order. Why a file apart: cmd_generate.cpp stays
// about flags and files; this is the only place where several engines run at once in the CLI.
#pragma once

#include <string>
#include <vector>

#include "zimage/zimage.h"

namespace zimage::cli {

// Runs parts[k] on engines[k] at once (parts.size() <= engines.size()). `hooks` go to every
// part except on_progress, which only part 0 reports (one progress bar; part 0 is the largest).
// All or nothing: the first failing part in order, its error naming the engine and device.
Result<std::vector<GenerateResult>> generate_parts(const std::vector<Engine*>& engines,
                                                   const std::vector<std::string>& devices,
                                                   const std::vector<GenerateRequest>& parts,
                                                   const GenerateHooks& hooks);

// generate_parts, the images joined in part order into one result: its timings are part 0's
// (total_s: the slowest part's), its device lists every engine's ("cuda:0 ...; cuda:1 ...").
Result<GenerateResult> generate_joined(const std::vector<Engine*>& engines,
                                       const std::vector<std::string>& devices,
                                       const std::vector<GenerateRequest>& parts,
                                       const GenerateHooks& hooks);

}  // namespace zimage::cli
