// safetensors files: validated, memory-mapped, zero-copy.
//
// Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON
//   {"__metadata__": {"k": "v"}, "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [b, e]}}
// then the data section (offsets are relative to its start). Weight files come from the internet,
// so every rule of docs/reliability.md is checked before a single tensor byte is touched: header
// length bounds (overflow-checked), JSON object with no duplicate keys, string-only metadata, known
// dtypes, non-negative dims, byte length = numel * dtype size (checked multiplication), and tensor
// data contiguous from 0, no holes or overlaps, covering the data section exactly. Every error
// names the file and the problem. parse_safetensors_header works on a plain byte buffer so the
// fuzzer (fuzz/fuzz_safetensors.cpp) can drive it without files.
//
// The writer streams: it writes the header first and then the tensor bytes in declaration order,
// so a caller can produce a multi-GB file one tensor at a time (bench tools write full-size random
// weights this way).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/fs/file_io.h"
#include "io/fs/mapped_files.h"

namespace zimage {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;                   // N
  uint64_t data_start = 0;                     // 8 + N: file offset of the data section
  uint64_t data_bytes = 0;                     // file size - 8 - N
  std::vector<SafetensorsTensorInfo> tensors;  // in data order (ascending offsets)
  std::map<std::string, std::string> metadata;
};

// Validates a complete safetensors file image of `size` bytes at `data` (`data` may be null when
// size is 0). `file` names the file in error messages. Never reads outside [data, data + size).
Result<SafetensorsHeader> parse_safetensors_header(const uint8_t* data, size_t size,
                                                   const std::string& file = "<buffer>");

// A validated, read-only, memory-mapped safetensors file. Tensor views keep the mapping alive,
// so the file object may be dropped while tensors are still in use.
class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  // The read-only mapping of the whole file (nullptr for an empty file).
  const void* mapping() const { return base_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<SafetensorsTensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsTensorInfo* find(const std::string& name) const;  // nullptr if absent

  // A host tensor (file dtype and shape) viewing the mapped bytes. Only when the bytes are not
  // aligned to the element size (a writer that does not pad its header) are they copied into
  // aligned memory. NotFound names the tensor and the file.
  Result<Tensor> tensor(const std::string& name) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  const uint8_t* base_ = nullptr;  // the mapping (nullptr for an empty mapping)
  uint64_t size_ = 0;
  MappedFileRegistration registration_;  // lets the read-ahead's gate find this mapping
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;  // name -> position in header_.tensors
};

// One tensor the writer will write: its bytes follow in declaration order.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
};

// Streaming writer. The file appears at `path` only after finish() succeeds (it is written to a
// temporary sibling, flushed to disk and renamed: io/fs/file_io.h); a writer destroyed earlier
// removes the temporary file and leaves any existing file at `path` untouched.
class SafetensorsWriter {
 public:
  static Result<std::unique_ptr<SafetensorsWriter>> create(
      const std::string& path, std::vector<SafetensorsEntry> tensors,
      const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends bytes to the data section; a tensor may be written in several calls and a call may
  // span tensors. Writing more than the declared total is an error.
  Status write(const void* data, size_t bytes);
  // Bytes still expected before finish().
  uint64_t remaining() const { return total_ - written_; }
  // Checks that every declared byte was written, flushes, and renames into place.
  Status finish();

 private:
  SafetensorsWriter() = default;

  std::string path_;
  std::unique_ptr<OutputFile> out_;
  uint64_t total_ = 0;
  uint64_t written_ = 0;
  bool finished_ = false;
};

// Writes host tensors (any dtype) and string metadata as one safetensors file, streaming each
// tensor's bytes (nothing is concatenated in memory).
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace zimage
