// The drop-in transformer's part of the Python module (python/src/transformer_binding.cpp): the
// module init calls register_transformer(m) once.
#pragma once

#include <nanobind/nanobind.h>

namespace zimage::python {

// Adds class `Transformer` (include/zimage/transformer.h) to `m`.
void register_transformer(nanobind::module_& m);

}  // namespace zimage::python
