// LoraCache (lora_cache.h): an LRU of parsed LoRA files under a byte cap.
#include "io/lora/lora_cache.h"

#include <system_error>
#include <utility>

namespace zimage {

Result<std::shared_ptr<const LoraFile>> LoraCache::get(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return NotFound("LoRA " + path + ": " + ec.message());
  const auto mtime = std::filesystem::last_write_time(path, ec);
  if (ec) return NotFound("LoRA " + path + ": " + ec.message());
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(path);
    if (it != index_.end()) {
      if (it->second->size == size && it->second->mtime == mtime) {
        lru_.splice(lru_.begin(), lru_, it->second);  // most recent
        ++stats_.hits;
        return it->second->file;
      }
      stats_.bytes -= it->second->size;  // changed on disk: read again
      lru_.erase(it->second);
      index_.erase(it);
    }
    ++stats_.misses;
  }
  // Read outside the lock: another request may use cached files meanwhile. Two requests missing
  // the same file both read it; the second insert replaces the first.
  ZI_ASSIGN_OR_RETURN(LoraFile f, read_lora(path, 1.0f));
  auto file = std::make_shared<const LoraFile>(std::move(f));
  if (size > max_bytes_) return std::shared_ptr<const LoraFile>(file);
  std::lock_guard<std::mutex> lock(mu_);
  auto old = index_.find(path);
  if (old != index_.end()) {
    stats_.bytes -= old->second->size;
    lru_.erase(old->second);
    index_.erase(old);
  }
  evict_to(max_bytes_ - size);
  lru_.push_front({path, size, mtime, file});
  index_[path] = lru_.begin();
  stats_.bytes += size;
  return std::shared_ptr<const LoraFile>(file);
}

void LoraCache::evict_to(uint64_t bytes) {
  while (stats_.bytes > bytes && !lru_.empty()) {
    stats_.bytes -= lru_.back().size;
    index_.erase(lru_.back().path);
    lru_.pop_back();
    ++stats_.evictions;
  }
}

LoraCache::Stats LoraCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.files = lru_.size();
  return s;
}

}  // namespace zimage
