// libFuzzer target for the safetensors header parser: any byte string is treated as a whole
// file image and must yield a header or an error, never a crash, an out-of-bounds read, an
// unbounded allocation or undefined behaviour. Accepted headers are re-checked against the
// invariants the rest of the engine relies on (contiguous, in-bounds, size-consistent tensors).
//
// Build and run (ASan + UBSan, clang 14):
//   cmake --preset fuzz -B build/fuzz && cmake --build build/fuzz --target fuzz_safetensors
//   mkdir -p build/fuzz/corpus && build/fuzz/fuzz/fuzz_safetensors -max_total_time=600 \
//       -max_len=4096 -timeout=10 build/fuzz/corpus fuzz/corpus/safetensors
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "io/fs/json_util.h"
#include "io/weights/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = zimage::parse_safetensors_header(data, size, "fuzz.safetensors");
  if (!r.ok()) {
    // Every error must say something, and nothing from the file may reach a terminal raw.
    const std::string& m = r.status().message();
    if (m.empty() || m != zimage::json_util::printable(m)) std::abort();
    return 0;
  }
  const zimage::SafetensorsHeader& h = *r;
  if (h.data_start != 8 + h.header_bytes || h.data_start + h.data_bytes != size) std::abort();
  uint64_t covered = 0;
  for (const auto& t : h.tensors) {
    const int64_t numel = zimage::shape_numel(t.shape);
    if (numel < 0) std::abort();
    if (t.begin != covered || t.end < t.begin || t.end > h.data_bytes) std::abort();
    if (static_cast<uint64_t>(numel) * zimage::dtype_size(t.dtype) != t.nbytes()) std::abort();
    covered = t.end;
  }
  if (covered != h.data_bytes) std::abort();
  return 0;
}
