// See plan_cache.h.
#include "io/fs/plan_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

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

// The entries of the cache file at `path` made for `identity`; nullopt when there is no usable
// file (missing, unreadable, corrupt, another identity: logged when `log` is set).
std::optional<std::map<std::string, int64_t>> read_entries(const std::string& path,
                                                           const std::string& identity, bool log) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  auto text = read_input_file(path, kMaxFileBytes);
  if (!text.ok()) {
    if (log) ZI_WARN("plan cache %s ignored: %s", path.c_str(), text.status().message().c_str());
    return std::nullopt;
  }
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("identity") || !j["identity"].is_string() ||
      !j.contains("entries") || !j["entries"].is_object()) {
    if (log)
      ZI_WARN("plan cache %s is not a zimage plan cache (corrupt?); ignored and rewritten",
              path.c_str());
    return std::nullopt;
  }
  if (j["identity"].get<std::string>() != identity) {
    if (log)
      ZI_INFO("plan cache %s was made for another GPU or library version; ignored", path.c_str());
    return std::nullopt;
  }
  std::map<std::string, int64_t> entries;
  for (const auto& [k, v] : j["entries"].items())
    if (v.is_number_integer()) entries[k] = v.get<int64_t>();
  return entries;
}

// An exclusive advisory lock on `path` + ".lock" for one read-merge-write, so processes that
// fill the cache at the same time (two first runs) keep each other's entries. Held for
// milliseconds; after 2 s of waiting the write goes ahead unlocked (the file stays whole either
// way: it is replaced by rename), which at worst loses a hint.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return;
    for (int i = 0; i < 400; ++i) {
      if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
        locked_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ~FileLock() {
    if (fd_ < 0) return;
    if (locked_) ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
  bool locked_ = false;
};

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
  auto entries = read_entries(path_, identity_, /*log=*/true);
  if (!entries) return;
  entries_ = std::move(*entries);
  ZI_DEBUG("plan cache %s: %zu entries", path_.c_str(), entries_.size());
}

std::optional<int64_t> PlanCache::get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> PlanCache::keys(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (auto it = entries_.lower_bound(prefix);
       it != entries_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.push_back(it->first);
  return out;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void PlanCache::put(const std::string& key, int64_t value) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = value;
  learnt_.insert(key);
  forgotten_.erase(key);
  save_locked();
}

void PlanCache::forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  forgotten_[key] = it->second;
  learnt_.erase(key);
  entries_.erase(it);
  save_locked();
}

namespace {

constexpr uint64_t kMaxBlobBytes = uint64_t{64} << 20;
constexpr const char* kBlobMagic = "zimage-plan 1 ";

uint64_t fnv1a_bytes(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

uint64_t blob_checksum(const std::string& key, const void* data, size_t n) {
  return fnv1a_bytes(fnv1a_bytes(1469598103934665603ull, key.data(), key.size()), data, n);
}

std::string blob_path(const std::string& cache_path, const std::string& key) {
  std::string base = cache_path;
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".json") == 0)
    base.resize(base.size() - 5);
  return base + ".d/" + hex64(fnv1a(key)) + ".plan";
}

}  // namespace

std::optional<std::vector<uint8_t>> PlanCache::get_blob(const std::string& key) const {
  const std::string path = blob_path(path_, key);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  auto text = read_input_file(path, kMaxBlobBytes + key.size() + 128);
  auto bad = [&](const char* why) -> std::optional<std::vector<uint8_t>> {
    ZI_DEBUG("plan cache: %s ignored (%s)", path.c_str(), why);
    return std::nullopt;
  };
  if (!text.ok()) return bad("unreadable");
  const std::string& t = *text;
  const size_t eol = t.find('\n');
  const std::string magic = kBlobMagic;
  if (eol == std::string::npos || t.compare(0, magic.size(), magic) != 0) return bad("no header");
  unsigned long long key_bytes = 0, data_bytes = 0;
  if (std::sscanf(t.c_str() + magic.size(), "%llu %llu", &key_bytes, &data_bytes) != 2)
    return bad("bad header");
  const size_t start = eol + 1;
  if (key_bytes != key.size() || data_bytes > kMaxBlobBytes ||
      t.size() != start + key_bytes + data_bytes + 8)
    return bad("truncated or another key's");
  if (t.compare(start, key_bytes, key) != 0) return bad("another key's");
  const char* data = t.data() + start + key_bytes;
  uint64_t sum = 0;
  std::memcpy(&sum, data + data_bytes, 8);
  if (sum != blob_checksum(key, data, data_bytes)) return bad("checksum");
  return std::vector<uint8_t>(data, data + data_bytes);
}

void PlanCache::put_blob(const std::string& key, const std::vector<uint8_t>& data) {
  if (data.size() > kMaxBlobBytes) return;
  const std::string path = blob_path(path_, key);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) {
    ZI_DEBUG("plan cache: cannot create the folder of %s: %s", path.c_str(), ec.message().c_str());
    return;
  }
  std::string out = std::string(kBlobMagic) + std::to_string(key.size()) + " " +
                    std::to_string(data.size()) + "\n" + key;
  out.append(reinterpret_cast<const char*>(data.data()), data.size());
  const uint64_t sum = blob_checksum(key, data.data(), data.size());
  out.append(reinterpret_cast<const char*>(&sum), 8);
  const Status st = write_output_file(path, out);
  if (!st.ok()) ZI_DEBUG("plan cache: plan not saved: %s", st.to_string().c_str());
}

void PlanCache::forget_blob(const std::string& key) {
  std::error_code ec;
  std::filesystem::remove(blob_path(path_, key), ec);
}

void PlanCache::save_locked() {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  if (ec) {
    ZI_DEBUG("plan cache: cannot create the folder of %s: %s", path_.c_str(), ec.message().c_str());
    return;
  }
  // Read, merge, write under the lock. What this process learnt (put) wins, and a hint it forgot
  // stays forgotten while the file still holds that same value; for every other key the file is
  // the newer word (another process may have replaced or forgotten a hint this one only loaded).
  FileLock file_lock(path_);
  if (auto on_disk = read_entries(path_, identity_, /*log=*/false)) {
    std::map<std::string, int64_t> merged;
    for (auto& [k, v] : *on_disk) {
      auto f = forgotten_.find(k);
      if (learnt_.count(k) || (f != forgotten_.end() && f->second == v)) continue;
      merged[k] = v;
    }
    for (const std::string& k : learnt_) merged[k] = entries_.at(k);
    entries_ = std::move(merged);
  }
  nlohmann::json j{{"identity", identity_}, {"entries", entries_}};
  const Status st = write_output_file(path_, j.dump(1) + "\n");
  if (!st.ok()) ZI_DEBUG("plan cache not saved: %s", st.to_string().c_str());
}

}  // namespace zimage
