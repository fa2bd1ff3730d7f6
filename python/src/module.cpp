// zimage._zimage: the native half of the `zimage` package (python/zimage holds the Python half:
// argument handling, PIL / numpy conversion, the diffusers-compatible pipeline).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.h"
#include "builtin/builtin_model.h"
#include "transformer_binding.h"
#include "zimage/zimage.h"

namespace zimage::python {

void raise_status(const Status& status) {
  nb::object make = nb::module_::import_("zimage._errors").attr("from_status");
  nb::object error = make(error_code_slug(status.code()), status.message(), status.field());
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw nb::python_error();
}

}  // namespace zimage::python

NB_MODULE(_zimage, m) {
  namespace nb = nanobind;
  using namespace zimage;
  m.attr("__version__") = kVersion;
  m.def(
      "builtin_model_dir",
      [] {
        Result<std::string> dir = [] {
          nb::gil_scoped_release release;
          return builtin_model_dir();
        }();
        if (!dir.ok()) python::raise_status(dir.status());
        return *dir;
      },
      "The tiny built-in model's folder (the `zimage` program's own), unpacked on first use.");
  m.def(
      "cuda_device_count", [] { return cuda_device_count(); },
      "CUDA devices this process can use (0 without CUDA support, a driver or a GPU).");
  m.def("set_log_verbosity", &set_log_verbosity, nb::arg("level"),
        "Engine messages on stderr: 0 errors, 1 warnings (default), 2 info, 3 debug.");
  python::bind_engine(m);
  python::register_transformer(m);
}
