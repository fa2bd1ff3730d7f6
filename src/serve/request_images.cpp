// Image inputs of the server's requests (see request_images.h).
#include "serve/request_images.h"

#include <algorithm>
#include <utility>

#include "zimage/zimage.h"

namespace zimage::serve {
namespace {

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// The decoder's messages start with the name it was given: name it after the field, and make
// every failure a client error.
Result<ImagePixels> decode_field(const std::vector<uint8_t>& bytes, const std::string& field) {
  if (bytes.empty()) return InvalidArgument(field + ": empty image");
  auto img = image_decode_pixels(bytes.data(), bytes.size(), field);
  if (!img.ok()) {
    if (img.status().code() == ErrorCode::kOutOfMemory) return img.status();
    return InvalidArgument(img.status().message());
  }
  return img;
}

// A gray mask (one byte a pixel, white = repaint) as the engine's RGB mask.
Result<Image> gray_mask(ImagePixels gray) {
  gray.channels = 1;
  return image_to_rgb(gray);
}

}  // namespace

Result<std::vector<uint8_t>> base64_decode(std::string_view text, const std::string& field) {
  if (text.rfind("data:", 0) == 0) {
    const size_t comma = text.find(',');
    const std::string_view head = text.substr(0, comma);
    if (comma == std::string_view::npos || head.size() < 7 ||
        head.substr(head.size() - 7) != ";base64")
      return InvalidArgument(field + ": a data: URL must be \"data:<type>;base64,<data>\"");
    text.remove_prefix(comma + 1);
  }
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n' || c == '\r' || c == ' ' || c == '\t') continue;
    if (c == '=') {
      ++pad;
      continue;
    }
    const int v = b64_value(c);
    if (v < 0 || pad > 0)
      return InvalidArgument(field + ": not valid base64 (unexpected character at offset " +
                             std::to_string(i) + ")");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>((acc >> bits) & 0xFF));
    }
  }
  if (pad > 2 || bits >= 6) return InvalidArgument(field + ": not valid base64 (bad length)");
  return out;
}

Result<Image> decode_request_image(const std::vector<uint8_t>& bytes, const std::string& field) {
  ZI_ASSIGN_OR_RETURN(ImagePixels img, decode_field(bytes, field));
  return image_to_rgb(img);
}

Result<Image> decode_openai_mask(const std::vector<uint8_t>& bytes, const std::string& field) {
  ZI_ASSIGN_OR_RETURN(ImagePixels img, decode_field(bytes, field));
  if (img.channels == 2 || img.channels == 4) {
    ImagePixels g;
    g.width = img.width;
    g.height = img.height;
    g.channels = 1;
    g.pixels.resize(static_cast<size_t>(img.width) * img.height);
    for (size_t i = 0; i < g.pixels.size(); ++i)
      g.pixels[i] = img.pixels[i * img.channels + img.channels - 1] == 0 ? 255 : 0;
    return gray_mask(std::move(g));
  }
  ZI_ASSIGN_OR_RETURN(ImagePixels gray, image_to_gray(img));
  return gray_mask(std::move(gray));
}

Result<Image> decode_a1111_mask(const std::vector<uint8_t>& bytes, const std::string& field,
                                bool invert) {
  ZI_ASSIGN_OR_RETURN(ImagePixels img, decode_field(bytes, field));
  ZI_ASSIGN_OR_RETURN(ImagePixels g, image_to_gray(img));
  if (img.channels == 2 || img.channels == 4) {
    const size_t n = g.pixels.size();
    bool opaque = true;
    for (size_t i = 0; i < n && opaque; ++i)
      opaque = img.pixels[i * img.channels + img.channels - 1] == 255;
    if (!opaque) {  // A1111's create_binary_mask: the alpha, > 128 -> 255
      for (size_t i = 0; i < n; ++i)
        g.pixels[i] = img.pixels[i * img.channels + img.channels - 1] > 128 ? 255 : 0;
    }
  }
  if (invert)
    for (uint8_t& v : g.pixels) v = static_cast<uint8_t>(255 - v);
  return gray_mask(std::move(g));
}

Status default_size(const Image& image, int multiple, const std::string& field, int* width,
                    int* height) {
  const int m = std::max(1, multiple);
  *width = image.width / m * m;
  *height = image.height / m * m;
  if (*width == 0 || *height == 0)
    return InvalidArgument(field + ": " + std::to_string(image.width) + "x" +
                           std::to_string(image.height) + " is smaller than the size multiple " +
                           std::to_string(m) + "; give the output size");
  return Status::Ok();
}

}  // namespace zimage::serve
