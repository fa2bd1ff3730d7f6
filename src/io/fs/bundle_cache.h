// Unpacking a bundle (io/fs/bundle.h) once per user: into <cache>/zimage/<name>/, checked against the
// bundle's manifest on every use and unpacked again when a file is missing or damaged. Why: the
// CLI's built-in model travels inside the binary, but the loaders read model folders; unpacking
// on every run would cost ~25 MB of writes, trusting a cache blindly would load a damaged copy.
//
// Concurrency: a bundle is unpacked into a temporary sibling folder and renamed into place, so
// another process sees either no folder or a complete one; a process that loses the race uses the
// winner's folder. When the cache cannot be written (read-only HOME, no HOME), the bundle goes
// into a private folder under $TMPDIR (or /tmp) that is removed when the UnpackedFolder is
// destroyed.
#pragma once

#include <string>

#include "core/status.h"
#include "io/fs/bundle.h"

namespace zimage {

class UnpackedFolder {
 public:
  UnpackedFolder(std::string path, bool temporary, std::string note)
      : path_(std::move(path)), temporary_(temporary), note_(std::move(note)) {}
  UnpackedFolder(UnpackedFolder&& o) noexcept;
  UnpackedFolder& operator=(UnpackedFolder&& o) noexcept;
  UnpackedFolder(const UnpackedFolder&) = delete;
  UnpackedFolder& operator=(const UnpackedFolder&) = delete;
  ~UnpackedFolder();  // removes a temporary folder

  const std::string& path() const { return path_; }
  bool temporary() const { return temporary_; }
  // Why the cache was not used (empty when it was).
  const std::string& note() const { return note_; }

 private:
  std::string path_;
  bool temporary_ = false;
  std::string note_;
};

// $XDG_CACHE_HOME when set to an absolute path, else $HOME/.cache when HOME is absolute, else "".
std::string user_cache_dir();

// The bundle unpacked and verified at <cache_dir>/zimage/<name>/ (cache_dir "" = no cache), or,
// when that cannot be written, in a new temporary folder. `name` must be a plain folder name
// that changes with the bundle's content (e.g. "builtin-<version>-<crc32>").
Result<UnpackedFolder> unpack_cached(const Bundle& bundle, const std::string& cache_dir,
                                     const std::string& name);

}  // namespace zimage
