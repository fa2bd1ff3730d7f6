// Writing GGUF files (version 3, llama.cpp's container; io/gguf/gguf.h reads them), streaming: the
// header (metadata and tensor infos, with every offset computed from the declared types and
// shapes) goes first, then each tensor's bytes in declaration order, padded to the alignment (32).
// Nothing of the model is held in memory; the file appears at its path only after finish()
// (temporary sibling + rename, io/fs/file_io.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/fs/file_io.h"
#include "io/gguf/gguf_quants.h"

namespace zimage {

struct GgufWriteTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  Shape shape;  // PyTorch order (the file stores it reversed, as ggml's ne)
};

struct GgufWriteMetadata {
  std::vector<std::pair<std::string, std::string>> strings;
  std::vector<std::pair<std::string, uint32_t>> u32s;
};

class GgufWriter {
 public:
  // Validates the tensors (names unique and non-empty, rows a multiple of the type's block size).
  static Result<std::unique_ptr<GgufWriter>> create(const std::string& path,
                                                    const GgufWriteMetadata& metadata,
                                                    std::vector<GgufWriteTensor> tensors);
  // The stored bytes of tensor i.
  uint64_t tensor_bytes(size_t i) const { return bytes_[i]; }
  // Appends bytes of the current tensor (a tensor may take several calls; a call must not span
  // two tensors). Padding between tensors is written here.
  Status write(const void* data, size_t size);
  // Checks every tensor was written completely, flushes and renames into place.
  Status finish();

 private:
  GgufWriter() = default;
  Status pad_to_next();

  std::string path_;
  std::unique_ptr<OutputFile> out_;
  std::vector<uint64_t> bytes_;
  size_t current_ = 0;
  uint64_t written_in_current_ = 0;
};

}  // namespace zimage
