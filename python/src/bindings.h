// The parts of the Python extension `zimage._zimage` (python/CMakeLists.txt builds every .cpp of
// this folder into one module). Each topic has its own file with a bind_* function that
// module.cpp calls: engine_binding.cpp (zimage.Engine's core) and transformer_binding.cpp (the
// DiT forward for zimage.torch, declared in transformer_binding.h).
#pragma once

#include <nanobind/nanobind.h>

#include "zimage/status.h"

namespace zimage::python {

namespace nb = nanobind;

// Raises the zimage exception for a failed status (zimage.InvalidArgument, zimage.NotFound, ...,
// built by zimage._errors.from_status with the message, code and field). Needs the GIL.
[[noreturn]] void raise_status(const Status& status);

void bind_engine(nb::module_& m);

}  // namespace zimage::python
