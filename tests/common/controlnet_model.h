// The ControlNet golden cases' model folder: v_turbo's text encoder, tokenizer, VAE and
// scheduler with the cases' tiny 30-layer transformer (golden/controlnet/cn_model), as symlinks
// in a per-process folder. A folder left by an earlier process with the same pid (pids are
// reused) is replaced; this process's folder is removed at exit.
#pragma once

#include <string>

namespace zimage::test {

// ZIMAGE_GOLDEN_DIR/controlnet: the cases and cn_model/.
std::string controlnet_golden_root();
// The folder above, made on first use.
const std::string& controlnet_model_dir();

}  // namespace zimage::test
