// The tiny built-in model (the v_turbo golden case with the real Qwen3 tokenizer) that `zimage`
// and the Python module (python/) use when no model is given. Why embedded: a program that pointed
// into its build folder stopped working once copied or installed. The folder is packed into the
// binary at build time (tools/pack_bundle.cpp, builtin_model_data.S.in) and unpacked on first use
// into $XDG_CACHE_HOME/zimage/builtin-<version>-<crc32>/ (else ~/.cache/...), checked on every use,
// or into a temporary folder removed at exit when the cache cannot be written
// (io/fs/bundle_cache.h).
#pragma once

#include <string>

#include "core/status.h"

namespace zimage {

// The built-in model folder, unpacked and verified on the first call (later calls return the same
// path). A failure names both the cache and the temporary folder that were tried.
Result<std::string> builtin_model_dir();

// Removes a temporary copy now (the cache copy stays): for a program about to leave without
// running destructors (the zimage CLI's fast exit). Later calls of builtin_model_dir unpack anew.
void release_builtin_model();

}  // namespace zimage
