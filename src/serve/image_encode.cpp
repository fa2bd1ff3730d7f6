// Image encoding for responses (see image_encode.h). libjpeg-turbo's TurboJPEG API and libwebp's
// simple encoder take RGB8 rows directly; PNG goes through the engine's png_encode.
#include "serve/image_encode.h"

#include <turbojpeg.h>
#include <webp/encode.h>

#include <algorithm>
#include <cstdio>

namespace zimage::serve {

namespace {

Status check_image(const Image& image) {
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
    return InternalError("image: rgb size does not match width x height x 3");
  return Status::Ok();
}

Result<std::vector<uint8_t>> encode_jpeg(const Image& image, int quality) {
  ZI_TRY(check_image(image));
  tjhandle tj = tjInitCompress();
  if (tj == nullptr) return InternalError("jpeg: tjInitCompress failed");
  unsigned char* out = nullptr;
  unsigned long size = 0;  // NOLINT(runtime/int): TurboJPEG's type
  const int rc = tjCompress2(tj, image.rgb.data(), image.width, 0, image.height, TJPF_RGB, &out,
                             &size, TJSAMP_420, std::clamp(quality, 1, 100), TJFLAG_ACCURATEDCT);
  std::vector<uint8_t> bytes;
  Status st;
  if (rc != 0 || out == nullptr) {
    st = InternalError(std::string("jpeg: ") + tjGetErrorStr2(tj));
  } else {
    bytes.assign(out, out + size);
  }
  if (out != nullptr) tjFree(out);
  tjDestroy(tj);
  if (!st.ok()) return st;
  return bytes;
}

Result<std::vector<uint8_t>> encode_webp(const Image& image, int quality) {
  ZI_TRY(check_image(image));
  uint8_t* out = nullptr;
  const size_t size = WebPEncodeRGB(image.rgb.data(), image.width, image.height, image.width * 3,
                                    static_cast<float>(std::clamp(quality, 0, 100)), &out);
  if (size == 0 || out == nullptr) {
    WebPFree(out);
    return InternalError("webp: encoding failed");
  }
  std::vector<uint8_t> bytes(out, out + size);
  WebPFree(out);
  return bytes;
}

}  // namespace

Result<std::vector<uint8_t>> encode_image(const Image& image, OutputFormat format, int quality,
                                          const PngTextChunks& text) {
  switch (format) {
    case OutputFormat::kJpeg:
      return encode_jpeg(image, quality);
    case OutputFormat::kWebp:
      return encode_webp(image, quality);
    default:
      return png_encode(image, text);
  }
}

std::string base64_encode(const std::vector<uint8_t>& in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint32_t{in[i]} << 16) | (uint32_t{in[i + 1]} << 8) | in[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint32_t{in[i]} << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint32_t{in[i]} << 16) | (uint32_t{in[i + 1]} << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

}  // namespace zimage::serve
