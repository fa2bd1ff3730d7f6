// A backend that binds weights without holding them: alloc and upload return tensors that have
// the right dtype and shape but no memory behind them, and every compute op fails. Why: `zimage
// info` must run every load-time check `generate` runs (each model's binding code: tensors
// present, shapes, dtypes, no unexpected tensors) on a 20 GB model in seconds and without a GPU.
// Binding the real loaders against this backend keeps the list of expected tensors in one place:
// the loaders themselves (see TextToImage::check_folder).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace zimage {

// Tensors it makes report defined() but have no data: nothing may read or write them.
std::unique_ptr<Backend> make_check_backend();

}  // namespace zimage
