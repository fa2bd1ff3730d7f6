// libFuzzer target for the image inputs the server takes from clients: the PNG / JPEG / WebP
// decoders with their EXIF / XMP orientation lookup (src/io/image/image_read.cpp), the two mask
// conventions and base64 (src/serve/request_images.cpp), and the Lanczos resize of whatever
// decodes. The first input byte picks the path, the rest is the file (or the base64 text). Every
// input must give an image or an error naming the field, never a crash; every image must be
// well formed (sides >= 1, within the pixel limit, a buffer of the right length).
//
// Build and run (ASan + UBSan, clang 14):
//   cmake --preset fuzz && cmake --build --preset fuzz --target fuzz_serve_image
//   mkdir -p build/fuzz/corpus_image && cp build/fuzz/golden/image/image_io/decode/*.{png,jpg,webp}
//   \
//       build/fuzz/corpus_image/ ; build/fuzz/fuzz/fuzz_serve_image -max_total_time=600 \
//       -max_len=65536 -timeout=10 build/fuzz/corpus_image
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/image/image_read.h"
#include "io/image/image_resize.h"
#include "serve/api_error.h"
#include "serve/request_images.h"

namespace {

void check_error(const zimage::Status& st, const char* field) {
  if (st.message().empty()) std::abort();
  if (st.code() == zimage::ErrorCode::kOutOfMemory) return;
  if (zimage::serve::api_error(st).param != field) std::abort();
}

void check_image(const zimage::Image& img) {
  if (img.width < 1 || img.height < 1) std::abort();
  if (int64_t{img.width} * img.height > zimage::kMaxInputPixels) std::abort();
  if (img.rgb.size() != static_cast<size_t>(img.width) * img.height * 3) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zimage;
  if (size < 1) return 0;
  const std::vector<uint8_t> bytes(data + 1, data + size);
  switch (data[0] % 4) {
    case 0: {  // the decoder itself, then a small resize and the gray conversion
      auto img = decode_image(bytes.data(), bytes.size(), "image");
      if (!img.ok()) {
        if (img.status().message().rfind("image", 0) != 0) std::abort();
        return 0;
      }
      const Image8& d = *img;
      if (d.width < 1 || d.height < 1 || d.channels < 1 || d.channels > 4) std::abort();
      if (d.pixels.size() != static_cast<size_t>(d.width) * d.height * d.channels) std::abort();
      if (int64_t{d.width} * d.height <= 4096) {
        auto r = resize_lanczos(to_rgb(d), 7, 5);
        if (!r.ok() || r->pixels.size() != 7 * 5 * 3) std::abort();
      }
      if (to_gray(d).pixels.size() != static_cast<size_t>(d.width) * d.height) std::abort();
      return 0;
    }
    case 1: {
      auto m = serve::decode_openai_mask(bytes, "mask");
      if (!m.ok()) return check_error(m.status(), "mask"), 0;
      check_image(*m);
      return 0;
    }
    case 2: {
      auto m = serve::decode_a1111_mask(bytes, "mask", (size & 1) != 0);
      if (!m.ok()) return check_error(m.status(), "mask"), 0;
      check_image(*m);
      return 0;
    }
    default: {  // base64 text of an image
      const std::string text(bytes.begin(), bytes.end());
      auto raw = serve::base64_decode(text, "init_images");
      if (!raw.ok()) return check_error(raw.status(), "init_images"), 0;
      auto img = serve::decode_request_image(*raw, "init_images");
      if (!img.ok()) return check_error(img.status(), "init_images"), 0;
      check_image(*img);
      return 0;
    }
  }
}
