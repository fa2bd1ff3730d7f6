// LoRA files kept parsed in host memory for runtime LoRAs (the server's per-request LoRAs): a
// file is read and mapped (read_lora) on first use and kept while it is among the most recently
// used that fit the byte cap (the files' sizes; they are memory-mapped). A file changed on disk
// (size or modification time) is read again. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"
#include "io/lora/lora.h"

namespace zimage {

class LoraCache {
 public:
  explicit LoraCache(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // The file at `path`, read with scale 1 (the request's strength is applied when it is used).
  // Errors are read_lora's, naming the file. A file larger than the cap is read and returned but
  // not kept.
  Result<std::shared_ptr<const LoraFile>> get(const std::string& path);

  struct Stats {
    uint64_t bytes = 0, hits = 0, misses = 0, evictions = 0;
    size_t files = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::string path;
    uint64_t size = 0;
    std::filesystem::file_time_type mtime;
    std::shared_ptr<const LoraFile> file;
  };
  void evict_to(uint64_t bytes);  // under mu_

  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::map<std::string, std::list<Entry>::iterator> index_;
  Stats stats_;
};

}  // namespace zimage
