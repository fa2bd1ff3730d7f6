// See plan_cache.h.
#include "io/fs/plan_cache.h"

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "io/fs/bundle_cache.h"
#include "io/fs/file_io.h"

namespace zimage {
namespace {

constexpr uint64_t kMaxFileBytes = uint64_t{4} << 20;  // far above any real cache

std::string hex64(uint64_t v) {
  static const char* d = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = d[v & 15];
  return s;
}

// FNV-1a: a stable file name for an identity (std::hash may differ between builds).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::unique_ptr<PlanCache> PlanCache::open(const std::string& dir, const std::string& identity) {
  const char* env = std::getenv("ZIMAGE_PLAN_CACHE");
  if (env && (std::string(env) == "off" || std::string(env) == "0")) return nullptr;
  std::string folder = dir;
  if (folder.empty()) {
    const std::string user = user_cache_dir();
    if (user.empty()) return nullptr;
    folder = user + "/zimage/plans";
  }
  std::unique_ptr<PlanCache> c(new PlanCache());
  c->identity_ = identity;
  c->path_ = folder + "/" + hex64(fnv1a(identity)) + ".json";
  c->load();
  return c;
}

void PlanCache::load() {
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return;
  auto text = read_input_file(path_, kMaxFileBytes);
  if (!text.ok()) {
    ZI_WARN("plan cache %s ignored: %s", path_.c_str(), text.status().message().c_str());
    return;
  }
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("identity") || !j["identity"].is_string() ||
      !j.contains("entries") || !j["entries"].is_object()) {
    ZI_WARN("plan cache %s is not a zimage plan cache (corrupt?); ignored and rewritten",
            path_.c_str());
    return;
  }
  if (j["identity"].get<std::string>() != identity_) {
    ZI_INFO("plan cache %s was made for another GPU or library version; ignored", path_.c_str());
    return;
  }
  for (const auto& [k, v] : j["entries"].items())
    if (v.is_number_integer()) entries_[k] = v.get<int64_t>();
  ZI_DEBUG("plan cache %s: %zu entries", path_.c_str(), entries_.size());
}

std::optional<int64_t> PlanCache::get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void PlanCache::put(const std::string& key, int64_t value) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = value;
  save_locked();
}

void PlanCache::forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.erase(key) > 0) save_locked();
}

void PlanCache::save_locked() const {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  if (ec) {
    ZI_DEBUG("plan cache: cannot create the folder of %s: %s", path_.c_str(), ec.message().c_str());
    return;
  }
  nlohmann::json j{{"identity", identity_}, {"entries", entries_}};
  const Status st = write_output_file(path_, j.dump(1) + "\n");
  if (!st.ok()) ZI_DEBUG("plan cache not saved: %s", st.to_string().c_str());
}

}  // namespace zimage
