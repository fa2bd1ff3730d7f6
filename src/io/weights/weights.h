// Weights from one or more safetensors files, looked up by name. A diffusers component folder
// (`transformer/`, `text_encoder/`, `vae/`) is opened as a whole: either its single
// `*.safetensors` file or the shards listed in `*.safetensors.index.json`. Tensors are zero-copy
// views of the memory-mapped files, in the file's dtype.
//
// A sharded folder is checked against its index: every listed shard must exist and hold exactly
// the tensors the index assigns to it (missing and extra tensors are named), and shard names must
// not leave the folder. The store remembers which tensors were fetched, so a model loader can
// name the unexpected ones.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace zimage {

class SafetensorsFile;  // io/weights/safetensors.h

// Parses a `*.safetensors.index.json` text: returns its weight_map (tensor name -> shard file
// name). Shard names must be plain file names (no '/', '\\', "..", NUL; not empty). `file` names
// the index in messages.
Result<std::map<std::string, std::string>> parse_weight_index(std::string_view text,
                                                              const std::string& file);

struct WeightInfo {
  DType dtype = DType::kF32;
  Shape shape;
  std::string file;  // path of the safetensors file holding it
};

// A tensor as its file stores it, still quantised (a GGUF tensor): ggml type id
// (io/gguf/gguf_quants.h GgmlType), logical shape and a host view of the raw blocks, for a
// device-side dequantisation.
struct PackedWeight {
  uint32_t ggml_type = 0;
  Shape shape;                 // PyTorch order
  int64_t rows = 0, cols = 0;  // cols: elements per stored row (a multiple of the block size)
  const void* data = nullptr;  // rows * row bytes, any alignment
  uint64_t bytes = 0;
  std::shared_ptr<const void> keep;  // keeps `data` alive
};

// A weight an FP8 checkpoint stores with a dequantisation scale (io/weights/scaled_fp8.h), as
// stored: W = float32(data) * scale, for a model that keeps it FP8 on the device.
struct Fp8StoredWeight {
  Tensor data;   // host view of the file, F8_E4M3 or F8_E5M2, [N, K]
  Tensor scale;  // host f32, [1] (per tensor) or [N] (per output row)
};

// A tensor made on demand as an owned host tensor instead of read from a safetensors file: a
// dequantised GGUF or scaled-FP8 tensor, a LoRA-merged weight, one part of a fused tensor.
// `info` states what make() returns (make's result is checked against it); `stored_bytes` is what
// the tensor takes in its file (for total_bytes()).
struct ComputedWeight {
  WeightInfo info;
  uint64_t stored_bytes = 0;
  std::function<Result<Tensor>()> make;
  // Optional: the stored blocks behind a dequantised tensor (PackedWeight above).
  std::function<Result<PackedWeight>()> packed;
  // Optional: the FP8 bytes and scale behind a dequantised scaled-FP8 weight.
  std::function<Result<Fp8StoredWeight>()> fp8;
};

class WeightStore {
 public:
  // Opens a component folder (index.json + shards, or exactly one *.safetensors file) or a
  // single .safetensors file. A GGUF file (recognised by its magic), or a folder whose only
  // weight file is one .gguf, opens through io/gguf/gguf_weights.h. Every file is fully validated
  // (io/weights/safetensors.h).
  static Result<WeightStore> open(const std::string& path);

  bool contains(const std::string& name) const;
  // Host tensor view (device kCPU, file dtype) of `name`; NotFound names the tensor and folder.
  Result<Tensor> get(const std::string& name) const;
  // As get(), and checks the shape: a mismatch is a FormatError naming tensor, got and expected.
  Result<Tensor> get(const std::string& name, const Shape& expected) const;
  // Dtype, shape and file of `name` without reading it (does not count as used).
  Result<WeightInfo> info(const std::string& name) const;

  std::vector<std::string> names() const;  // sorted
  size_t size() const;
  size_t total_bytes() const;  // tensor bytes
  int64_t total_params() const;
  std::map<DType, size_t> dtype_counts() const;  // number of tensors per dtype
  std::vector<std::string> files() const;        // the safetensors files, sorted
  uint64_t file_bytes() const;                   // their on-disk size
  // The memory mappings of the safetensors files ({address, bytes}; not GGUF files), which the
  // tensors of get() view; they live as long as a store or a tensor refers to them.
  std::vector<std::pair<const void*, uint64_t>> mappings() const;
  // Names not returned by get() so far: the model loader reports them as unexpected tensors.
  std::vector<std::string> unused_names() const;
  // ---- building stores from other formats (GGUF, single files, LoRA) ----
  // An empty store named `path` (messages use it).
  static WeightStore empty(const std::string& path);
  // Adds tensor `name` made on demand; an existing name is a FormatError naming both origins.
  Status add_computed(const std::string& name, ComputedWeight w);
  // Replaces tensor `name` by fn(its current value), e.g. a LoRA merge; fn returns a host tensor
  // of `dtype` and the same shape. Getting the new tensor counts the old one as used.
  Status transform(const std::string& name, DType dtype,
                   std::function<Result<Tensor>(const Tensor&)> fn);
  // Removes `name` (NotFound if absent): a tensor another one was computed from.
  Status remove(const std::string& name);
  // Renames `from` to `to` (`to` must not exist).
  Status rename(const std::string& from, const std::string& to);
  // Moves every tensor of `other` into this store (a name in both is a FormatError); `other`'s
  // files are kept alive by this store.
  Status absorb(WeightStore other);
  // Records a file the computed tensors read (kept alive by `keep`; listed by files()).
  void add_backing_file(const std::string& path, uint64_t bytes, std::shared_ptr<const void> keep);
  // The stored blocks of `name` (counts as used); kUnsupported when it is not stored packed.
  Result<PackedWeight> packed(const std::string& name) const;
  // Whether `name` is stored packed / as scaled FP8 (does not count as used; false if absent).
  bool is_packed(const std::string& name) const;
  bool is_scaled_fp8(const std::string& name) const;
  // As packed() / fp8(), without counting `name` as used (to size it before loading).
  Result<PackedWeight> peek_packed(const std::string& name) const;
  Result<Fp8StoredWeight> peek_fp8(const std::string& name) const;
  // The FP8 bytes and scale of `name` (counts as used); kUnsupported when it has none.
  Result<Fp8StoredWeight> fp8(const std::string& name) const;
  // Attaches the FP8 source of computed tensor `name` (a scaled-FP8 weight made by transform()).
  Status set_fp8_source(const std::string& name, std::function<Result<Fp8StoredWeight>()> fn);
  // Strips a leading prefix from every name that has it (e.g. "model." in some text-encoder
  // exports). Fails, changing nothing, if two names would become equal.
  Status strip_prefix(const std::string& prefix);
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    std::shared_ptr<SafetensorsFile> file;  // null for a computed tensor
    std::string file_name;                  // the on-disk name the tensor came from
    std::string original_name;
    std::shared_ptr<const ComputedWeight> computed;  // set when made on demand
  };
  struct BackingFile {
    std::string path;
    uint64_t bytes = 0;
    std::shared_ptr<const void> keep;
  };
  const WeightInfo* computed_info(const Entry& e) const {
    return e.computed ? &e.computed->info : nullptr;
  }
  // Shared by copies of the store, so a copy's get() counts for all of them.
  struct UsedSet {
    std::mutex mu;
    std::set<std::string> names;
  };
  static Result<WeightStore> open_sharded(const std::string& dir, const std::string& index);
  static Status add_file(WeightStore& store, const std::shared_ptr<SafetensorsFile>& file,
                         const std::string& file_name);

  std::string path_;
  std::map<std::string, Entry> entries_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::vector<BackingFile> backing_;
  std::shared_ptr<UsedSet> used_ = std::make_shared<UsedSet>();
};

}  // namespace zimage
