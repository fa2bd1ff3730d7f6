// Run-time choices remembered on disk, so a new process does not search again: which of cuDNN's
// candidate convolution plans won the timing for a shape, keyed by the shape, in one small JSON
// file per GPU and library version, and the compiled plans themselves (get_blob / put_blob):
//   $XDG_CACHE_HOME/zimage/plans/<identity hash>.json  (else ~/.cache/zimage/plans/...)
//   {"identity": "<GPU, compute capability, cuDNN and cuBLAS versions, zimage version>",
//    "entries": {"<key>": <value>, ...}}
// Safe by construction: a missing, unreadable, corrupt or foreign file (another identity) is
// ignored with one log line and replaced on the next put; a cached value is only a hint the user
// of the cache verifies (a plan index that no longer builds is forgotten and searched again).
// Writes replace the file atomically (temporary file + rename), so concurrent processes never
// see a torn file, and each write merges what is on disk under an advisory lock (<file>.lock), so
// processes filling the cache at once (two first runs) keep each other's entries.
// ZIMAGE_PLAN_CACHE=off disables it. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace zimage {

class PlanCache {
 public:
  // `dir`: the cache folder ("" = the user's cache folder + "/zimage/plans"); `identity`: what
  // the cached choices depend on. Null when disabled (ZIMAGE_PLAN_CACHE=off) or no cache folder.
  static std::unique_ptr<PlanCache> open(const std::string& dir, const std::string& identity);

  std::optional<int64_t> get(const std::string& key) const;
  // Records and saves at once (errors are logged, never fatal: the cache is an optimisation).
  void put(const std::string& key, int64_t value);
  // Drops a hint that turned out wrong, and saves.
  void forget(const std::string& key);

  // Compiled plans (cudnn-frontend's Graph::serialize), one file per key beside the hints:
  // <cache file without ".json">.d/<hash of the key>.plan, holding a header line
  // "zimage-plan 1 <key bytes> <payload bytes>", the key, the payload and an FNV-1a checksum of
  // both. A missing, truncated, corrupt or another key's file reads as nothing (the caller builds
  // the plan and puts it again); files are replaced by rename, so a reader never sees half of
  // one. The identity of the hint file covers the blobs: another GPU or library version is
  // another folder.
  std::optional<std::vector<uint8_t>> get_blob(const std::string& key) const;
  void put_blob(const std::string& key, const std::vector<uint8_t>& data);
  void forget_blob(const std::string& key);  // a blob that no longer loads

  const std::string& path() const { return path_; }
  size_t size() const;
  // The keys of the hints that start with `prefix`, in order (a warm-up loads their plans).
  std::vector<std::string> keys(const std::string& prefix) const;

 private:
  PlanCache() = default;
  void load();
  void save_locked();

  std::string path_, identity_;
  mutable std::mutex mu_;
  std::map<std::string, int64_t> entries_;
  std::set<std::string> learnt_;  // set by put() in this process: wins over the file
  // Dropped by forget(), with the value found wrong: not merged back from the file while it holds
  // that value.
  std::map<std::string, int64_t> forgotten_;
};

}  // namespace zimage
