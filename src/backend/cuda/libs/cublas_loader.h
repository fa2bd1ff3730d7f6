// cuBLAS and cuBLASLt, loaded with dlopen while the CUDA driver starts, not by the dynamic linker
// before main().
//
// Why: libcublasLt's static constructors take 70-90 ms (and ~200 MB of heap) in every process that
// links the library, `zimage version` included, on this project's 2-core development machine,
// serially before main() and so before everything a new process does. The backend waits ~0.3 s
// for the driver (cuInit and the context) anyway; CudaBackend::create loads the libraries on a
// thread of its own during that wait. GNU ld has no delay-loading, so the few cuBLAS and cuBLASLt
// entry points the backend calls are defined in cublas_loader.cpp as forwarders into the loaded
// libraries; the compiler checks each against its declaration in cuBLAS's headers, and a library
// that cannot be loaded makes every forwarder return CUBLAS_STATUS_NOT_INITIALIZED.
#pragma once

#include "core/status.h"

namespace zimage::cuda {

// Loads libcublasLt and libcublas (the major version the program was built against) once; later
// and concurrent calls wait for the first and return its result: Ok, or NotFound naming the
// library or symbol that is missing. Thread-safe, never throws.
Status load_cublas() noexcept;

}  // namespace zimage::cuda
