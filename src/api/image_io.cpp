// Public PNG helpers and log verbosity (include/zimage/zimage.h): thin wrappers that keep the
// CLI and the server on the public header while io/image/png.h does the work.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <new>

#include "api/guarded.h"
#include "core/log.h"
#include "io/fs/file_io.h"
#include "io/image/image_read.h"
#include "io/image/png.h"
#include "pipeline/image_to_image.h"
#include "zimage/zimage.h"

namespace zimage {

namespace {

Status check_image(const Image& image) {
  const int64_t want = int64_t{image.width} * image.height * 3;
  if (image.width < 1 || image.height < 1 || static_cast<int64_t>(image.rgb.size()) != want)
    return InvalidArgument("image: " + std::to_string(image.width) + "x" +
                           std::to_string(image.height) + " needs " + std::to_string(want) +
                           " RGB bytes, has " + std::to_string(image.rgb.size()));
  return Status::Ok();
}

std::string fmt_g(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  return buf;
}

}  // namespace

PngTextChunks png_metadata(const GenerateRequest& req, size_t image_index) {
  const size_t per_prompt = static_cast<size_t>(std::max(1, req.images_per_prompt));
  const size_t prompt_index =
      req.prompts.empty() ? 0 : std::min(image_index / per_prompt, req.prompts.size() - 1);
  PngTextChunks t;
  t.emplace_back("prompt", req.prompts.empty() ? std::string() : req.prompts[prompt_index]);
  if (req.negative_prompt) t.emplace_back("negative_prompt", *req.negative_prompt);
  t.emplace_back("seed", std::to_string(req.seed));
  t.emplace_back("batch_index", std::to_string(image_index));
  t.emplace_back("steps", std::to_string(req.steps));
  t.emplace_back("guidance", fmt_g(req.guidance));
  if (req.cfg_truncation != 1.0f) t.emplace_back("cfg_truncation", fmt_g(req.cfg_truncation));
  if (req.cfg_normalization != 0.0f)
    t.emplace_back("cfg_normalization", fmt_g(req.cfg_normalization));
  if (req.control_image) {  // ControlNet (inpainting with a mask); strength does not apply
    t.emplace_back("mode", req.mask ? "controlnet_inpaint" : "controlnet");
    t.emplace_back("control_scale", fmt_g(req.control_scale));
  } else if (req.init_image) {  // never the file's name or path
    t.emplace_back("mode", req.mask ? "inpaint" : "img2img");
    char buf[32];
    const double strength = effective_strength(req);
    const auto res = std::to_chars(buf, buf + sizeof(buf), strength);  // shortest: "0.6"
    t.emplace_back("strength", std::string(buf, res.ptr));
  }
  t.emplace_back("size", std::to_string(req.width) + "x" + std::to_string(req.height));
  t.emplace_back("software", std::string("zimage ") + kVersion);
  return t;
}

static_assert(kPngCompression == kPngDefaultCompression, "one default PNG level");

Result<std::vector<uint8_t>> png_encode(const Image& image, const PngTextChunks& text,
                                        int compression) {
  return guarded("png_encode", [&]() -> Result<std::vector<uint8_t>> {
    ZI_TRY(check_image(image));
    return encode_png(image.rgb.data(), image.width, image.height, text, compression);
  });
}

Status png_save(const std::string& path, const Image& image, const PngTextChunks& text,
                int compression) {
  return guarded("png_save", [&]() -> Status {
    ZI_TRY(check_image(image));
    return write_png(path, image.rgb.data(), image.width, image.height, text, compression);
  });
}

Result<Image> png_load(const std::string& path, PngTextChunks* text) {
  return guarded("png_load", [&]() -> Result<Image> {
    ZI_ASSIGN_OR_RETURN(PngImage png, read_png(path));
    Image image;
    image.width = png.width;
    image.height = png.height;
    image.rgb = std::move(png.rgb);
    if (text != nullptr) *text = std::move(png.text);
    return image;
  });
}

namespace {

Image rgb_image(const Image8& decoded) {
  Image8 rgb = to_rgb(decoded);
  Image out;
  out.width = rgb.width;
  out.height = rgb.height;
  out.rgb = std::move(rgb.pixels);
  return out;
}

}  // namespace

Result<Image> image_load(const std::string& path) {
  return guarded("image_load", [&]() -> Result<Image> {
    ZI_ASSIGN_OR_RETURN(Image8 img, read_image(path));
    return rgb_image(img);
  });
}

Result<Image> image_decode(const uint8_t* data, size_t size, const std::string& name) {
  return guarded("image_decode", [&]() -> Result<Image> {
    ZI_ASSIGN_OR_RETURN(Image8 img, decode_image(data, size, name));
    return rgb_image(img);
  });
}

namespace {

ImagePixels as_pixels(Image8 in) {
  ImagePixels out;
  out.width = in.width;
  out.height = in.height;
  out.channels = in.channels;
  out.pixels = std::move(in.pixels);
  return out;
}

Status check_pixels(const ImagePixels& image) {
  const bool sized =
      image.width > 0 && image.height > 0 && image.channels >= 1 && image.channels <= 4 &&
      image.pixels.size() == static_cast<size_t>(image.width) * static_cast<size_t>(image.height) *
                                 static_cast<size_t>(image.channels);
  if (!sized)
    return InvalidArgument("image: " + std::to_string(image.width) + "x" +
                           std::to_string(image.height) + "x" + std::to_string(image.channels) +
                           " does not match its " + std::to_string(image.pixels.size()) + " bytes");
  return Status::Ok();
}

}  // namespace

Result<ImagePixels> image_decode_pixels(const uint8_t* data, size_t size, const std::string& name) {
  return guarded("image_decode_pixels", [&]() -> Result<ImagePixels> {
    ZI_ASSIGN_OR_RETURN(Image8 img, decode_image(data, size, name));
    return as_pixels(std::move(img));
  });
}

Result<Image> image_to_rgb(const ImagePixels& image) {
  return guarded("image_to_rgb", [&]() -> Result<Image> {
    ZI_TRY(check_pixels(image));
    const size_t n = static_cast<size_t>(image.width) * static_cast<size_t>(image.height);
    Image out;
    out.width = image.width;
    out.height = image.height;
    out.rgb.resize(n * 3);
    pixels_to_rgb(image.pixels.data(), n, image.channels, out.rgb.data());
    return out;
  });
}

Result<ImagePixels> image_to_gray(const ImagePixels& image) {
  return guarded("image_to_gray", [&]() -> Result<ImagePixels> {
    ZI_TRY(check_pixels(image));
    const size_t n = static_cast<size_t>(image.width) * static_cast<size_t>(image.height);
    ImagePixels out;
    out.width = image.width;
    out.height = image.height;
    out.channels = 1;
    out.pixels.resize(n);
    pixels_to_gray(image.pixels.data(), n, image.channels, out.pixels.data());
    return out;
  });
}

Result<Image> mask_load(const std::string& path) {
  return guarded("mask_load", [&]() -> Result<Image> {
    ZI_ASSIGN_OR_RETURN(Image8 img, read_image(path));
    if (img.channels == 2 || img.channels == 4)
      return InvalidArgument(path +
                             ": the mask has an alpha channel; give a grayscale or RGB mask "
                             "(white = repaint, black = keep)");
    return rgb_image(img);
  });
}

Status write_files_atomically(const std::vector<std::string>& paths,
                              const std::vector<std::vector<uint8_t>>& contents) {
  return guarded("write_files_atomically", [&] { return write_output_files(paths, contents); });
}

Status check_writable_path(const std::string& path, const std::string& what) {
  return guarded("check_writable_path", [&] { return check_output_path(path, what); });
}

void set_log_verbosity(int level) {
  set_log_level(static_cast<LogLevel>(std::clamp(level, 0, 3)));
}

int log_verbosity() {
  return static_cast<int>(log_level());
}

}  // namespace zimage
