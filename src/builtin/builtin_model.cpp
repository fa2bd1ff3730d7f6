// See builtin_model.h. The folder object lives until the program exits, so a temporary fallback
// copy is removed then (after the engine that maps its files is gone).
#include "builtin/builtin_model.h"

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string_view>

#include "core/log.h"
#include "io/fs/bundle.h"
#include "io/fs/bundle_cache.h"
#include "zimage/zimage.h"

// builtin_model_data.S (generated from builtin_model_data.S.in).
extern "C" const unsigned char zimage_builtin_bundle[];
extern "C" const unsigned char zimage_builtin_bundle_end[];
extern "C" const uint32_t zimage_builtin_bundle_crc32;

namespace zimage {

namespace {

std::mutex g_mu;
std::optional<UnpackedFolder> g_folder;  // destroyed at exit: removes a temporary copy

}  // namespace

Result<std::string> builtin_model_dir() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_folder) return g_folder->path();
  const std::string_view bytes(
      reinterpret_cast<const char*>(zimage_builtin_bundle),
      static_cast<size_t>(zimage_builtin_bundle_end - zimage_builtin_bundle));
  auto bundle = Bundle::parse(bytes);
  if (!bundle.ok()) return bundle.status().with_context("the built-in model in this program");
  if (bundle->crc32() != zimage_builtin_bundle_crc32)
    return FormatError("the built-in model in this program is damaged (CRC-32 mismatch)");
  char name[96];
  std::snprintf(name, sizeof name, "builtin-%s-%08x", kVersion,
                static_cast<unsigned>(bundle->crc32()));
  auto folder = unpack_cached(*bundle, user_cache_dir(), name);
  if (!folder.ok()) return folder.status().with_context("the built-in model");
  if (folder->temporary()) {
    ZI_WARN("built-in model: %s; using a temporary copy in %s (removed at exit)",
            folder->note().c_str(), folder->path().c_str());
  }
  g_folder.emplace(std::move(folder).value());
  return g_folder->path();
}

void release_builtin_model() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_folder.reset();
}

}  // namespace zimage
