// Weights from one or more safetensors files, looked up by name. A diffusers component folder
// (`transformer/`, `text_encoder/`, `vae/`) is opened as a whole: either its single
// `*.safetensors` file or the shards listed in `*.safetensors.index.json`. Tensors are zero-copy
// views of the memory-mapped files, in the file's dtype.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace zimage {

class SafetensorsFile;  // io/safetensors.h

class WeightStore {
 public:
  // Opens a component folder (index.json + shards, or exactly one *.safetensors file) or a
  // single .safetensors file. Every file is fully validated (io/safetensors.h).
  static Result<WeightStore> open(const std::string& path);

  bool contains(const std::string& name) const;
  // Host tensor view (device kCPU, file dtype) of `name`; NotFound names the tensor and folder.
  Result<Tensor> get(const std::string& name) const;
  // As get(), and checks the shape: a mismatch is a FormatError naming tensor, got and expected.
  Result<Tensor> get(const std::string& name, const Shape& expected) const;

  std::vector<std::string> names() const;  // sorted
  size_t size() const;
  size_t total_bytes() const;
  int64_t total_params() const;
  // Names not returned by get() so far: the model loader reports them as unexpected tensors.
  std::vector<std::string> unused_names() const;
  // Strips a leading prefix from every name (e.g. "model." in some text-encoder exports).
  void strip_prefix(const std::string& prefix);
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    std::shared_ptr<SafetensorsFile> file;
    std::string file_name;  // the on-disk name the tensor came from
    std::string original_name;
  };
  std::string path_;
  std::map<std::string, Entry> entries_;
  std::shared_ptr<std::map<std::string, bool>> used_ = std::make_shared<std::map<std::string, bool>>();
};

}  // namespace zimage
