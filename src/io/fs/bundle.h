// A folder's files packed into one byte string: a manifest (relative path, size and CRC-32 of
// every file) followed by each file's zlib stream. The CLI embeds the built-in model this way and
// unpacks it on first use (io/fs/bundle_cache.h); the manifest is what later runs check the unpacked
// copy against, so a damaged or truncated cached file is noticed.
//
// Why zlib and a format of our own rather than tar through libarchive: zlib is already linked
// (libpng needs it), so a copied binary needs no new shared library; the format is a few dozen
// lines and carries exactly the manifest the cache check needs; and it can only hold plain files
// under relative paths, so unpacking has no links, devices or absolute paths to refuse.
//
// Layout (integers little-endian):
//   "ZIBUNDL1"  u32 file count
//   per file:   u16 path length, path bytes, u64 size, u32 crc32, u64 packed size
//   data:       the files' zlib streams, in manifest order
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace zimage {

struct BundleFile {
  std::string path;            // relative, '/'-separated; no empty, "." or ".." part
  uint64_t size = 0;           // bytes once unpacked
  uint32_t crc32 = 0;          // zlib's crc32 of those bytes
  uint64_t packed_offset = 0;  // of its zlib stream, from the start of the bundle
  uint64_t packed_size = 0;
};

// Packs every regular file under `dir` (sorted by path) into a bundle. Anything but regular
// files and folders (a link, a device) is an error naming it.
Result<std::string> pack_folder(const std::string& dir, int level = 9);

class Bundle {
 public:
  // Parses and checks the manifest of `bytes` (magic, paths, every stream inside the bytes).
  // The bytes are not copied: they must outlive the Bundle. Streams are checked when unpacked.
  static Result<Bundle> parse(std::string_view bytes);

  const std::vector<BundleFile>& files() const { return files_; }
  uint32_t crc32() const { return crc32_; }  // of all the bytes: a content hash
  uint64_t unpacked_bytes() const;

  // Writes every file under `dir` (an existing folder), creating subfolders; each file's size
  // and CRC-32 are checked as it is written.
  Status unpack(const std::string& dir) const;
  // Checks that each file of the manifest is under `dir` with its size and CRC-32; the first
  // missing, resized or changed file is named. Files not in the manifest are ignored.
  Status verify(const std::string& dir) const;

 private:
  std::string_view bytes_;
  std::vector<BundleFile> files_;
  uint32_t crc32_ = 0;
};

}  // namespace zimage
