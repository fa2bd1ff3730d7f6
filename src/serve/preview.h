// Live previews for jobs (docs/SERVER.md, "Live previews"): the engine hook that turns each
// preview the engine computes into a small PNG kept on the job, which the event stream and
// A1111's /sdapi/v1/progress serve. The engine computes previews only while the job's flag is on.
#pragma once

#include "serve/job.h"
#include "serve/metrics.h"
#include "zimage/zimage.h"

namespace zimage::serve {

// Sets hooks.on_preview and hooks.preview_enabled for one engine run of `job`; `steps_before`
// counts the denoising steps of the job's earlier runs (A1111's n_iter).
void add_preview_hooks(Job& job, int steps_before, Metrics& metrics, GenerateHooks& hooks);

}  // namespace zimage::serve
