// See cublas_loader.h for why cuBLAS is loaded here rather than linked.
#include "backend/cuda/libs/cublas_loader.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

namespace zimage::cuda {
namespace {

// clang-format off: one entry point a line
#define ZI_CUBLASLT_ENTRY_POINTS(X)       \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtGetVersion)                   \
  X(cublasLtMatmul)                       \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmulAlgoCapGetAttribute)    \
  X(cublasLtMatmulAlgoCheck)              \
  X(cublasLtMatmulAlgoConfigGetAttribute) \
  X(cublasLtMatmulAlgoConfigSetAttribute) \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)
#define ZI_CUBLAS_SIMPLE_ENTRY_POINTS(X) \
  X(cublasCreate_v2)                     \
  X(cublasDestroy_v2)                    \
  X(cublasSetStream_v2)                  \
  X(cublasSetWorkspace_v2)               \
  X(cublasGetStatusName)                 \
  X(cublasGetStatusString)
#define ZI_CUBLAS_SPELLED_ENTRY_POINTS(X) X(cublasGemmEx) X(cublasGemmStridedBatchedEx)
#define ZI_CUBLAS_ENTRY_POINTS(X) ZI_CUBLAS_SIMPLE_ENTRY_POINTS(X) ZI_CUBLAS_SPELLED_ENTRY_POINTS(X)
// clang-format on

// The C entry points' types. cuBLAS's headers add C++ overloads of the two Ex GEMMs (taking the
// legacy cudaDataType compute type), so those two are spelled out.
template <typename F>
using Fn = F*;
using GemmEx = cublasStatus_t(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void*, const void*, cudaDataType, int, const void*,
                              cudaDataType, int, const void*, void*, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
using GemmStridedBatchedEx = cublasStatus_t(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int, int, int, const void*, const void*, cudaDataType,
                                            int, long long int, const void*, cudaDataType, int,
                                            long long int, const void*, void*, cudaDataType, int,
                                            long long int, int, cublasComputeType_t,
                                            cublasGemmAlgo_t);
template <typename T>
struct TypeOf {
  using type = T;
};
#define ZI_TYPE_cublasGemmEx TypeOf<Fn<GemmEx>>
#define ZI_TYPE_cublasGemmStridedBatchedEx TypeOf<Fn<GemmStridedBatchedEx>>

struct Table {
#define ZI_POINTER(name) decltype(&::name) name = nullptr;
#define ZI_POINTER_SPELLED(name) ZI_TYPE_##name::type name = nullptr;
  ZI_CUBLASLT_ENTRY_POINTS(ZI_POINTER)
  ZI_CUBLAS_SIMPLE_ENTRY_POINTS(ZI_POINTER)
  ZI_CUBLAS_SPELLED_ENTRY_POINTS(ZI_POINTER_SPELLED)
#undef ZI_POINTER_SPELLED
#undef ZI_POINTER
};

#define ZI_STRINGIFY2(x) #x
#define ZI_STRINGIFY(x) ZI_STRINGIFY2(x)

struct Loaded {
  std::once_flag once;
  Table table;
  bool ok = false;
  std::string error;
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

// Opens `soname` (found as the dynamic linker would: LD_LIBRARY_PATH, then the program's
// RUNPATH) or explains why not.
void* open_library(const char* soname, std::string& error) {
  void* h = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = ::dlerror();
    error = std::string("cannot load ") + soname + ": " + (why ? why : "unknown error") +
            " (is the CUDA toolkit's or the nvidia-cublas wheel's library on LD_LIBRARY_PATH?)";
  }
  return h;
}

void load_once(Loaded& l) {
  const char* lt_name = "libcublasLt.so." ZI_STRINGIFY(CUBLAS_VER_MAJOR);
  const char* blas_name = "libcublas.so." ZI_STRINGIFY(CUBLAS_VER_MAJOR);
  void* lt = open_library(lt_name, l.error);
  if (lt == nullptr) return;
  void* blas = open_library(blas_name, l.error);
  if (blas == nullptr) return;
  Table& t = l.table;
#define ZI_RESOLVE(handle, library, name)                              \
  t.name = reinterpret_cast<decltype(t.name)>(::dlsym(handle, #name)); \
  if (t.name == nullptr) {                                             \
    l.error = std::string(library) + " has no " #name                  \
                                     " (a cuBLAS older than the one "  \
                                     "the program was built with?)";   \
    return;                                                            \
  }
#define ZI_RESOLVE_LT(name) ZI_RESOLVE(lt, lt_name, name)
#define ZI_RESOLVE_BLAS(name) ZI_RESOLVE(blas, blas_name, name)
  ZI_CUBLASLT_ENTRY_POINTS(ZI_RESOLVE_LT)
  ZI_CUBLAS_ENTRY_POINTS(ZI_RESOLVE_BLAS)
#undef ZI_RESOLVE_BLAS
#undef ZI_RESOLVE_LT
#undef ZI_RESOLVE
  l.ok = true;
}

// The table once loaded, or nullptr (the forwarders then report CUBLAS_STATUS_NOT_INITIALIZED).
const Table* table() noexcept {
  Loaded& l = loaded();
  try {
    std::call_once(l.once, [&l] { load_once(l); });
  } catch (...) {  // std::system_error from call_once, bad_alloc from the message
    return nullptr;
  }
  return l.ok ? &l.table : nullptr;
}

}  // namespace

Status load_cublas() noexcept {
  if (table() != nullptr) return Status::Ok();
  const std::string& why = loaded().error;
  // NotFound, not Unsupported: a GPU is there (the backend asks after finding one), so device
  // "auto" reports this rather than falling back to the CPU (api/backend_choice.cpp).
  return NotFound(why.empty() ? std::string("cuBLAS could not be loaded") : why);
}

}  // namespace zimage::cuda

// The forwarders: the definitions of the functions cuBLAS's headers declare, for this program.
using zimage::cuda::table;
#define ZI_FORWARD(name, ...) \
  const auto* t = table();    \
  return t == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : t->name(__VA_ARGS__)

extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  ZI_FORWARD(cublasLtCreate, lightHandle);
}
cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  ZI_FORWARD(cublasLtDestroy, lightHandle);
}
size_t CUBLASWINAPI cublasLtGetVersion(void) {
  const auto* t = table();
  return t == nullptr ? 0 : t->cublasLtGetVersion();
}
cublasStatus_t CUBLASWINAPI cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
    const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
    const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
    size_t workspaceSizeInBytes, cudaStream_t stream) {
  ZI_FORWARD(cublasLtMatmul, lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D,
             Ddesc, algo, workspace, workspaceSizeInBytes, stream);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  ZI_FORWARD(cublasLtMatmulAlgoGetHeuristic, lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc,
             preference, requestedAlgoCount, heuristicResultsArray, returnAlgoCount);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigGetAttribute(
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
    size_t sizeInBytes, size_t* sizeWritten) {
  ZI_FORWARD(cublasLtMatmulAlgoConfigGetAttribute, algo, attr, buf, sizeInBytes, sizeWritten);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigSetAttribute(
    cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, const void* buf,
    size_t sizeInBytes) {
  ZI_FORWARD(cublasLtMatmulAlgoConfigSetAttribute, algo, attr, buf, sizeInBytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCapGetAttribute(
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoCapAttributes_t attr, void* buf,
    size_t sizeInBytes, size_t* sizeWritten) {
  ZI_FORWARD(cublasLtMatmulAlgoCapGetAttribute, algo, attr, buf, sizeInBytes, sizeWritten);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCheck(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
  ZI_FORWARD(cublasLtMatmulAlgoCheck, lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, algo,
             result);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
  ZI_FORWARD(cublasLtMatmulDescCreate, matmulDesc, computeType, scaleType);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  ZI_FORWARD(cublasLtMatmulDescDestroy, matmulDesc);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t sizeInBytes) {
  ZI_FORWARD(cublasLtMatmulDescSetAttribute, matmulDesc, attr, buf, sizeInBytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  ZI_FORWARD(cublasLtMatmulPreferenceCreate, pref);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  ZI_FORWARD(cublasLtMatmulPreferenceDestroy, pref);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
    size_t sizeInBytes) {
  ZI_FORWARD(cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, sizeInBytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  ZI_FORWARD(cublasLtMatrixLayoutCreate, matLayout, type, rows, cols, ld);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  ZI_FORWARD(cublasLtMatrixLayoutDestroy, matLayout);
}

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  ZI_FORWARD(cublasCreate_v2, handle);
}
cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  ZI_FORWARD(cublasDestroy_v2, handle);
}
cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  ZI_FORWARD(cublasSetStream_v2, handle, streamId);
}
cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                                  size_t workspaceSizeInBytes) {
  ZI_FORWARD(cublasSetWorkspace_v2, handle, workspace, workspaceSizeInBytes);
}
cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb,
                                         const void* beta, void* C, cudaDataType Ctype, int ldc,
                                         cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  ZI_FORWARD(cublasGemmEx, handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb,
             beta, C, Ctype, ldc, computeType, algo);
}
cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
    const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  ZI_FORWARD(cublasGemmStridedBatchedEx, handle, transa, transb, m, n, k, alpha, A, Atype, lda,
             strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType,
             algo);
}
const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
  const auto* t = table();
  return t == nullptr ? "CUBLAS_STATUS_NOT_INITIALIZED (cuBLAS not loaded)"
                      : t->cublasGetStatusName(status);
}
const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  const auto* t = table();
  return t == nullptr ? "cuBLAS could not be loaded" : t->cublasGetStatusString(status);
}

}  // extern "C"
