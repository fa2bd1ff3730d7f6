// See bundle_cache.h. The cache folder is trusted only after Bundle::verify (sizes and CRC-32s
// against the manifest the running binary carries), which reads ~25 MB for the built-in model:
// tens of milliseconds, small next to loading the model. No fsync before the rename: a copy
// damaged by a crash fails that check on the next run and is unpacked again.
#include "io/fs/bundle_cache.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/log.h"

namespace zimage {

namespace fs = std::filesystem;

namespace {

// A new empty folder `<parent>/<prefix>XXXXXX`; "" on failure (errno set).
std::string make_temp_dir(const std::string& parent, const std::string& prefix) {
  std::string tmpl = parent + "/" + prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

// Removes `.<name>.tmp-*` / `.<name>.stale-*` folders under `root` older than an hour: what a
// process killed while unpacking leaves behind (a live one is done within seconds).
void sweep_leftovers(const std::string& root, const std::string& name) {
  std::error_code ec;
  const auto cutoff = fs::file_time_type::clock::now() - std::chrono::hours(1);
  std::vector<std::string> old;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string f = e.path().filename().string();
    const bool ours =
        f.rfind("." + name + ".tmp-", 0) == 0 || f.rfind("." + name + ".stale-", 0) == 0;
    std::error_code tec;
    if (ours && e.last_write_time(tec) < cutoff && !tec) old.push_back(e.path().string());
  }
  for (const std::string& p : old) remove_tree(p);
}

// Tries the cache; returns the verified folder's path, or "" with `why` set.
std::string try_cache(const Bundle& b, const std::string& root, const std::string& name,
                      std::string& why) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec || !fs::is_directory(root, ec)) {
    why = root + ": cannot create the cache folder (" + (ec ? ec.message() : "not a folder") + ")";
    return "";
  }
  sweep_leftovers(root, name);
  const std::string final_dir = root + "/" + name;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const Status found = b.verify(final_dir);
    if (found.ok()) return final_dir;
    if (found.code() != ErrorCode::kNotFound || fs::exists(final_dir, ec))
      ZI_WARN("%s; unpacking %s again", found.to_string().c_str(), name.c_str());
    const std::string tmp = make_temp_dir(root, "." + name + ".tmp-");
    if (tmp.empty()) {
      why = root + ": cannot write (" + std::strerror(errno) + ")";
      return "";
    }
    if (Status st = b.unpack(tmp); !st.ok()) {
      remove_tree(tmp);
      why = st.to_string();
      return "";
    }
    if (::rename(tmp.c_str(), final_dir.c_str()) == 0) return final_dir;
    const int e = errno;
    if (e != EEXIST && e != ENOTEMPTY) {
      remove_tree(tmp);
      why = final_dir + ": cannot rename into place (" + std::strerror(e) + ")";
      return "";
    }
    // Another process put a folder there first: use it if it is whole, else move it aside.
    if (b.verify(final_dir).ok()) {
      remove_tree(tmp);
      return final_dir;
    }
    const std::string stale = make_temp_dir(root, "." + name + ".stale-");
    if (!stale.empty()) {
      if (::rename(final_dir.c_str(), stale.c_str()) != 0 && errno != ENOENT) {
        why = final_dir + ": damaged and cannot be replaced (" + std::strerror(errno) + ")";
        remove_tree(stale);
        remove_tree(tmp);
        return "";
      }
      remove_tree(stale);
    }
    if (::rename(tmp.c_str(), final_dir.c_str()) == 0) return final_dir;
    remove_tree(tmp);  // lost another race: check again
  }
  why = final_dir + ": kept changing while being unpacked";
  return "";
}

}  // namespace

UnpackedFolder::UnpackedFolder(UnpackedFolder&& o) noexcept
    : path_(std::move(o.path_)), temporary_(o.temporary_), note_(std::move(o.note_)) {
  o.temporary_ = false;
}

UnpackedFolder& UnpackedFolder::operator=(UnpackedFolder&& o) noexcept {
  if (this != &o) {
    if (temporary_) remove_tree(path_);
    path_ = std::move(o.path_);
    temporary_ = o.temporary_;
    note_ = std::move(o.note_);
    o.temporary_ = false;
  }
  return *this;
}

UnpackedFolder::~UnpackedFolder() {
  if (temporary_) remove_tree(path_);
}

std::string user_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return xdg;  // the XDG spec ignores relative paths
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') return std::string(home) + "/.cache";
  return "";
}

Result<UnpackedFolder> unpack_cached(const Bundle& bundle, const std::string& cache_dir,
                                     const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
    return InvalidArgument("unpack_cached: '" + name + "' is not a plain folder name");
  std::string why = "no cache folder ($XDG_CACHE_HOME and $HOME are not set)";
  if (!cache_dir.empty()) {
    std::string path = try_cache(bundle, cache_dir + "/zimage", name, why);
    if (!path.empty()) return UnpackedFolder(std::move(path), false, "");
  }
  std::error_code ec;
  const fs::path tmp_root = fs::temp_directory_path(ec);
  const std::string tmp = ec ? "" : make_temp_dir(tmp_root.string(), "zimage-" + name + "-");
  if (tmp.empty()) {
    return IoError("cannot unpack " + name + ": " + why + "; and no temporary folder (" +
                   (ec ? ec.message() : std::string(std::strerror(errno))) + ")");
  }
  UnpackedFolder folder(tmp, true, why);  // removes the folder on any error below
  if (Status st = bundle.unpack(tmp); !st.ok())
    return st.with_context("unpacking " + name + " into " + tmp + " (" + why + ")");
  return folder;
}

}  // namespace zimage
