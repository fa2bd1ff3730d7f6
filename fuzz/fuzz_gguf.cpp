// libFuzzer target for the GGUF reader: any byte string is a whole file image. It must give a
// validated file or an error, never a crash, an out-of-bounds read, an unbounded allocation or
// undefined behaviour. An accepted file is then used the way zimage uses one: every metadata
// value read through the accessor for its type, every tensor's packed view, plain views and
// dequantisation (small tensors), and the WeightStore with its renames and ComfyUI shapes; the
// invariants the engine relies on (tensors inside the data section, aligned, not overlapping,
// sized by their type) are checked.
//
// Build and run (ASan + UBSan, clang 14):
//   cmake --preset fuzz -B build/fuzz && cmake --build build/fuzz --target fuzz_gguf
//   mkdir -p build/fuzz/corpus_gguf && build/fuzz/fuzz/fuzz_gguf -max_total_time=600 \
//       -max_len=4096 -timeout=10 -malloc_limit_mb=64 -dict=fuzz/corpus/gguf.dict \
//       build/fuzz/corpus_gguf fuzz/corpus/gguf
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/gguf/gguf.h"
#include "io/gguf/gguf_weights.h"
#include "io/fs/json_util.h"

namespace {

void check_message(const zimage::Status& s) {
  // Every error says something, and nothing from the file reaches a terminal raw.
  const std::string& m = s.message();
  if (m.empty() || m != zimage::json_util::printable(m)) std::abort();
}

void use_metadata(const zimage::GgufFile& f) {
  using zimage::GgufType;
  for (const zimage::GgufKv& kv : f.header().kvs) {
    if (f.find(kv.key) == nullptr) std::abort();
    switch (kv.type) {
      case GgufType::kString:
        (void)f.get_string(kv.key);
        break;
      case GgufType::kBool:
        (void)f.get_bool(kv.key);
        break;
      case GgufType::kF32:
      case GgufType::kF64:
        (void)f.get_float(kv.key);
        break;
      case GgufType::kArray: {
        auto i = f.get_int_array(kv.key);
        auto d = f.get_float_array(kv.key);
        auto s = f.get_string_array(kv.key);
        if (i.ok() && i->size() != kv.count) std::abort();
        if (d.ok() && d->size() != kv.count) std::abort();
        if (s.ok() && s->size() != kv.count) std::abort();
        if (!i.ok()) check_message(i.status());
        break;
      }
      default: {
        auto v = f.get_int(kv.key);
        if (!v.ok()) check_message(v.status());
        (void)f.get_float(kv.key);
      }
    }
  }
  (void)f.architecture();
}

void use_tensors(const zimage::GgufFile& f) {
  const zimage::GgufHeader& h = f.header();
  if (h.alignment == 0 || (h.alignment & (h.alignment - 1)) != 0) std::abort();
  if (h.data_start % h.alignment != 0) std::abort();
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const zimage::GgufTensorInfo& t : h.tensors) {
    uint64_t row_bytes = 0;
    if (!zimage::ggml_row_bytes(t.type, t.row_length(), &row_bytes)) std::abort();
    if (row_bytes * static_cast<uint64_t>(t.rows()) != t.bytes) std::abort();
    if (t.offset % h.alignment != 0) std::abort();
    if (h.data_start + t.offset + t.bytes > h.file_size) std::abort();
    if (t.bytes) ranges.emplace_back(t.offset, t.offset + t.bytes);
    auto p = f.packed(t.name);
    if (!p.ok() || p->bytes != t.bytes || p->cols != t.row_length()) std::abort();
    if (t.numel() <= (1 << 16)) {
      auto d = f.dequantize(t.name);
      if (!d.ok()) check_message(d.status());
      auto v = f.tensor(t.name);
      if (!v.ok()) check_message(v.status());
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k)
    if (ranges[k].first < ranges[k - 1].second) std::abort();
}

void use_store(std::shared_ptr<const zimage::GgufFile> f) {
  auto ws = zimage::gguf_weight_store(f);
  if (!ws.ok()) {
    check_message(ws.status());
    return;
  }
  for (const std::string& name : ws->names()) {
    auto info = ws->info(name);
    if (!info.ok()) std::abort();
    if (zimage::shape_numel(info->shape) > (1 << 16)) continue;
    auto t = ws->get(name);  // checked against its declared dtype and shape by the store
    if (!t.ok()) check_message(t.status());
    (void)ws->packed(name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = zimage::GgufFile::view(data, size, "fuzz.gguf");
  if (!f.ok()) {
    check_message(f.status());
    if (f.status().code() != zimage::ErrorCode::kFormat) std::abort();
    return 0;
  }
  use_metadata(**f);
  use_tensors(**f);
  use_store(*f);
  return 0;
}
