#include "common/controlnet_model.h"

#include <unistd.h>

#include <filesystem>

namespace zimage::test {
namespace {

namespace fs = std::filesystem;

struct CnModelFolder {
  std::string path;
  CnModelFolder() {
    const fs::path p =
        fs::temp_directory_path() / ("zimage_cn_model_" + std::to_string(::getpid()));
    const fs::path v = fs::path(ZIMAGE_GOLDEN_DIR) / "v_turbo" / "model";
    std::error_code ec;
    fs::remove_all(p, ec);
    fs::create_directories(p, ec);
    for (const char* part : {"text_encoder", "tokenizer", "vae", "scheduler"})
      fs::create_directory_symlink(v / part, p / part, ec);
    fs::create_symlink(v / "model_index.json", p / "model_index.json", ec);
    fs::create_directory_symlink(fs::path(controlnet_golden_root()) / "cn_model" / "transformer",
                                 p / "transformer", ec);
    path = p.string();
  }
  ~CnModelFolder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

std::string controlnet_golden_root() {
  return std::string(ZIMAGE_GOLDEN_DIR) + "/controlnet";
}

const std::string& controlnet_model_dir() {
  static const CnModelFolder folder;
  return folder.path;
}

}  // namespace zimage::test
