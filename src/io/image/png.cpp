// PNG encode/decode through libpng (see png.h). libpng reports errors with longjmp, which skips
// C++ destructors; so all libpng calls happen in "body" functions that hold only trivially
// destructible locals, run under a tiny guard that does the setjmp and nothing else. Results go
// into caller-owned objects through plain pointers (those objects live in frames the jump never
// leaves), and callbacks convert C++ allocation failures into png_error after their own locals
// are gone.
#include "io/image/png.h"

#include <png.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>

#include "core/utf8.h"
#include "io/fs/file_io.h"
#include "io/image/png_deflate.h"

#ifndef PNG_iTXt_SUPPORTED
#error "libpng without iTXt support"
#endif

namespace zimage {
namespace {

// ---- shared: error capture -------------------------------------------------------------------

struct PngError {  // trivially destructible: lives inside the jobs below
  char message[256];
};

void on_png_error(png_structp png, png_const_charp msg) {
  auto* err = static_cast<PngError*>(png_get_error_ptr(png));
  if (err != nullptr) {
    std::snprintf(err->message, sizeof(err->message), "%s", msg ? msg : "unknown libpng error");
  }
  png_longjmp(png, 1);
}

void on_png_warning(png_structp /*png*/, png_const_charp /*msg*/) {}

std::string dims_string(int64_t w, int64_t h) {
  return std::to_string(w) + "x" + std::to_string(h);
}

Status check_dims(int64_t w, int64_t h, const char* what) {
  if (w < 1 || h < 1 || w > kPngMaxSide || h > kPngMaxSide || w * h > kPngMaxPixels) {
    return InvalidArgument(std::string(what) + ": image size " + dims_string(w, h) +
                           " is invalid (each side 1.." + std::to_string(kPngMaxSide) +
                           ", at most " + std::to_string(kPngMaxPixels) + " pixels)");
  }
  return Status::Ok();
}

// PNG keywords: 1-79 characters, no leading/trailing/consecutive spaces. The PNG character set
// is Latin-1, but our strings are UTF-8, so only printable ASCII is accepted (no mojibake).
Status check_keyword(const std::string& key) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("png text keyword \"" + key + "\" " + why);
  };
  if (key.empty() || key.size() > 79) return bad("must have 1 to 79 characters");
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c < 32 || c > 126) return bad("must be printable ASCII");
    if (c == ' ' && (i == 0 || i + 1 == key.size() || key[i + 1] == ' ')) {
      return bad("has a leading, trailing or double space");
    }
  }
  return Status::Ok();
}

// Strict UTF-8 (core/utf8.h) and no NUL byte.
bool valid_utf8(const std::string& s) {
  return s.find('\0') == std::string::npos && utf8_error_offset(s) == kUtf8Valid;
}

// ---- writing ---------------------------------------------------------------------------------

struct WriteJob {
  const uint8_t* idat;  // the image data, filtered and compressed (png_deflate.h)
  size_t idat_size;
  int width;
  int height;
  png_text* texts;
  int num_texts;
  std::vector<uint8_t>* out;  // owned by encode_png's frame
  bool out_of_memory;
  PngError error;
};

bool append_bytes(std::vector<uint8_t>* out, const uint8_t* data, size_t size) noexcept {
  try {
    out->insert(out->end(), data, data + size);
    return true;
  } catch (...) {
    return false;
  }
}

void on_png_write(png_structp png, png_bytep data, size_t size) {
  auto* job = static_cast<WriteJob*>(png_get_io_ptr(png));
  if (!append_bytes(job->out, data, size)) {
    job->out_of_memory = true;
    png_error(png, "out of memory while encoding");
  }
}

void on_png_flush(png_structp /*png*/) {}

// libpng writes the signature, IHDR and the iTXt chunks (png_write_info) and frames the chunks
// with their CRCs; the image data was compressed on several threads beforehand (png_deflate.h),
// so it goes in as one IDAT chunk, then IEND (what png_write_end writes when no text follows).
void write_body(png_structp png, png_infop info, WriteJob* job) {
  png_set_write_fn(png, job, on_png_write, on_png_flush);
  png_set_IHDR(png, info, static_cast<png_uint_32>(job->width),
               static_cast<png_uint_32>(job->height), 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (job->num_texts > 0) png_set_text(png, info, job->texts, job->num_texts);
  png_write_info(png, info);
  static const png_byte kIdat[5] = {'I', 'D', 'A', 'T', '\0'};
  static const png_byte kIend[5] = {'I', 'E', 'N', 'D', '\0'};
  png_write_chunk(png, kIdat, job->idat, job->idat_size);
  png_write_chunk(png, kIend, nullptr, 0);
}

bool guarded_write(png_structp png, png_infop info, WriteJob* job) {
  if (setjmp(png_jmpbuf(png))) return false;
  write_body(png, info, job);
  return true;
}

// ---- reading ---------------------------------------------------------------------------------

// libpng's read callback : the next `size` bytes of the job's buffer.
template <typename Job>
void on_png_read(png_structp png, png_bytep out, size_t size) {
  auto* job = static_cast<Job*>(png_get_io_ptr(png));
  if (size > job->size - job->pos) png_error(png, "unexpected end of data");
  std::memcpy(out, job->data + job->pos, size);
  job->pos += size;
}

// ---- reading with the file's channels (decode_png_pixels) -------------------------------------

struct NativeJob {
  const uint8_t* data;
  size_t size;
  size_t pos;
  PngPixels* image;  // owned by decode_png_pixels' frame
  bool out_of_memory;
  bool too_large;
  bool gray16;
  bool gray16_high_byte;  // decode_png: 16-bit grayscale keeps its high byte instead of failing
  uint32_t width;
  uint32_t height;
  PngError error;
};

bool native_alloc(PngPixels* image, size_t bytes) noexcept {
  try {
    image->pixels.assign(bytes, 0);
    return true;
  } catch (...) {
    return false;
  }
}

bool native_extras(png_structp png, png_infop info, PngPixels* image) noexcept {
  try {
    png_textp texts = nullptr;
    int num = 0;
    png_get_text(png, info, &texts, &num);
    for (int i = 0; i < num; ++i) {
      const char* key = texts[i].key ? texts[i].key : "";
      const char* text = texts[i].text ? texts[i].text : "";
      const size_t len = texts[i].compression >= PNG_ITXT_COMPRESSION_NONE ? texts[i].itxt_length
                                                                           : texts[i].text_length;
      image->text.emplace_back(key, std::string(text, len));
    }
#ifdef PNG_eXIf_SUPPORTED
    png_bytep exif = nullptr;
    png_uint_32 exif_len = 0;
    if (png_get_eXIf_1(png, info, &exif_len, &exif) != 0 && exif != nullptr)
      image->exif.assign(reinterpret_cast<const char*>(exif), exif_len);
#endif
    return true;
  } catch (...) {
    return false;
  }
}

void read_native_body(png_structp png, png_infop info, NativeJob* job) {
  png_set_read_fn(png, job, on_png_read<NativeJob>);
  png_set_user_limits(png, kPngMaxSide, kPngMaxSide);
  png_read_info(png, info);
  png_uint_32 w = 0;
  png_uint_32 h = 0;
  int bit_depth = 0;
  int color_type = 0;
  png_get_IHDR(png, info, &w, &h, &bit_depth, &color_type, nullptr, nullptr, nullptr);
  job->width = w;
  job->height = h;
  if (static_cast<uint64_t>(w) * h > static_cast<uint64_t>(kPngMaxPixels)) {
    job->too_large = true;
    png_error(png, "image too large");
  }
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth == 16 && !job->gray16_high_byte) {
    job->gray16 = true;
    png_error(png, "16-bit grayscale");
  }
  int channels = 3;
  if (color_type == PNG_COLOR_TYPE_PALETTE) {
    png_set_palette_to_rgb(png);  // also expands tRNS into an alpha channel ...
    if (png_get_valid(png, info, PNG_INFO_tRNS) != 0) png_set_strip_alpha(png);  // ... dropped
  } else if (color_type == PNG_COLOR_TYPE_GRAY) {
    channels = 1;
    if (bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  } else if (color_type == PNG_COLOR_TYPE_GRAY_ALPHA) {
    channels = 2;
  } else if (color_type == PNG_COLOR_TYPE_RGB_ALPHA) {
    channels = 4;
  }
  if (bit_depth == 16) png_set_strip_16(png);  // the high byte
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = static_cast<size_t>(w) * channels;
  if (png_get_rowbytes(png, info) != row_bytes) png_error(png, "unexpected row size");
  if (!native_alloc(job->image, row_bytes * h)) {
    job->out_of_memory = true;
    png_error(png, "out of memory while decoding");
  }
  uint8_t* base = job->image->pixels.data();
  for (int p = 0; p < passes; ++p) {
    for (png_uint_32 y = 0; y < h; ++y) png_read_row(png, base + y * row_bytes, nullptr);
  }
  png_read_end(png, info);  // text and eXIf chunks after the image data land in `info` too
  if (!native_extras(png, info, job->image)) {
    job->out_of_memory = true;
    png_error(png, "out of memory while reading text");
  }
  job->image->width = static_cast<int>(w);
  job->image->height = static_cast<int>(h);
  job->image->channels = channels;
}

bool guarded_native_read(png_structp png, png_infop info, NativeJob* job) {
  if (setjmp(png_jmpbuf(png))) return false;
  read_native_body(png, info, job);
  return true;
}

Result<PngPixels> decode_native(const uint8_t* data, size_t size, const std::string& name,
                                bool gray16_high_byte) {
  if (data == nullptr || size < 8 || png_sig_cmp(data, 0, 8) != 0) {
    return FormatError(name + ": not a PNG file (bad signature)");
  }
  PngPixels image;
  NativeJob job{};
  job.data = data;
  job.size = size;
  job.image = &image;
  job.gray16_high_byte = gray16_high_byte;
  std::snprintf(job.error.message, sizeof(job.error.message), "unknown libpng error");
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &job.error, on_png_error, on_png_warning);
  if (png == nullptr) return OutOfMemory(name + ": cannot create the libpng reader");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return OutOfMemory(name + ": cannot create the libpng info struct");
  }
  const bool ok = guarded_native_read(png, info, &job);
  png_destroy_read_struct(&png, &info, nullptr);
  if (!ok) {
    if (job.out_of_memory) return OutOfMemory(name + ": " + job.error.message);
    if (job.too_large) {
      return FormatError(name + ": image " + dims_string(job.width, job.height) +
                         " exceeds the limit of " + std::to_string(kPngMaxPixels) + " pixels");
    }
    if (job.gray16) {
      return FormatError(name +
                         ": 16-bit grayscale PNG is not supported (PIL, and so diffusers, "
                         "clips it to 8 bits, turning every value above 255 white); save it "
                         "as 8-bit grayscale or RGB");
    }
    return FormatError(name + ": " + job.error.message);
  }
  return image;
}

}  // namespace

Result<PngPixels> decode_png_pixels(const uint8_t* data, size_t size, const std::string& name) {
  return decode_native(data, size, name, /*gray16_high_byte=*/false);
}

Result<std::vector<uint8_t>> encode_png(const uint8_t* rgb, int w, int h, const PngText& text,
                                        int compression) {
  ZI_TRY(check_dims(w, h, "encode_png"));
  if (rgb == nullptr) return InvalidArgument("encode_png: null pixel buffer");
  if (compression < 0 || compression > 9) {
    return InvalidArgument("encode_png: compression level " + std::to_string(compression) +
                           " is not in 0..9");
  }
  if (text.size() > 1000) {
    return InvalidArgument("encode_png: " + std::to_string(text.size()) +
                           " text chunks (at most 1000)");
  }
  static char empty[] = "";
  std::vector<png_text> chunks(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& [key, value] = text[i];
    ZI_TRY(check_keyword(key));
    if (!valid_utf8(value)) {
      return InvalidArgument("png text \"" + key + "\": value is not valid UTF-8 (or holds NUL)");
    }
    png_text& c = chunks[i];
    std::memset(&c, 0, sizeof(c));
    c.compression = PNG_ITXT_COMPRESSION_NONE;
    c.key = const_cast<char*>(key.c_str());  // libpng copies; it never writes through these
    c.text = const_cast<char*>(value.c_str());
    c.text_length = 0;
    c.itxt_length = value.size();
    c.lang = empty;
    c.lang_key = empty;
  }

  ZI_ASSIGN_OR_RETURN(const std::vector<uint8_t> idat, png_deflate_rows(rgb, w, h, compression));
  // One chunk: its length is a 31-bit field (the pixel limit keeps the data far below it).
  if (idat.size() > 0x7fffffffu) return InternalError("encode_png: the image data exceeds 2 GiB");
  std::vector<uint8_t> out;
  WriteJob job{};
  job.idat = idat.data();
  job.idat_size = idat.size();
  job.width = w;
  job.height = h;
  job.texts = chunks.data();
  job.num_texts = static_cast<int>(chunks.size());
  job.out = &out;
  std::snprintf(job.error.message, sizeof(job.error.message), "unknown libpng error");

  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, &job.error, on_png_error, on_png_warning);
  if (png == nullptr) return OutOfMemory("encode_png: cannot create the libpng writer");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    return OutOfMemory("encode_png: cannot create the libpng info struct");
  }
  const bool ok = guarded_write(png, info, &job);
  png_destroy_write_struct(&png, &info);
  if (!ok) {
    const std::string what = "encode_png (" + dims_string(w, h) + "): " + job.error.message;
    return job.out_of_memory ? OutOfMemory(what) : InternalError(what);
  }
  return out;
}

Status write_png(const std::string& path, const uint8_t* rgb, int w, int h, const PngText& text,
                 int compression) {
  auto encoded = encode_png(rgb, w, h, text, compression);
  if (!encoded.ok()) return encoded.status().with_context("writing " + path);
  // Temporary file + fsync + rename: a failed write never removes or truncates what was there.
  return write_output_file(path, encoded.value().data(), encoded.value().size());
}

void pixels_to_rgb(const uint8_t* pixels, size_t n, int channels, uint8_t* rgb) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = pixels + i * channels;
    uint8_t* q = rgb + i * 3;
    if (channels <= 2) {
      q[0] = q[1] = q[2] = p[0];
    } else {
      q[0] = p[0], q[1] = p[1], q[2] = p[2];
    }
  }
}

void pixels_to_gray(const uint8_t* pixels, size_t n, int channels, uint8_t* gray) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = pixels + i * channels;
    if (channels <= 2) {
      gray[i] = p[0];
    } else {
      const uint32_t l = p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u;
      gray[i] = static_cast<uint8_t>(l >> 16);
    }
  }
}

Result<PngImage> decode_png(const uint8_t* data, size_t size, const std::string& name) {
  ZI_ASSIGN_OR_RETURN(PngPixels px, decode_native(data, size, name, /*gray16_high_byte=*/true));
  PngImage image;
  image.width = px.width;
  image.height = px.height;
  image.text = std::move(px.text);
  if (px.channels == 3) {
    image.rgb = std::move(px.pixels);
    return image;
  }
  const size_t n = static_cast<size_t>(px.width) * static_cast<size_t>(px.height);
  try {
    image.rgb.resize(n * 3);
  } catch (const std::bad_alloc&) {
    return OutOfMemory(name + ": out of memory while decoding");
  }
  pixels_to_rgb(px.pixels.data(), n, px.channels, image.rgb.data());
  return image;
}

Result<PngImage> read_png(const std::string& path) {
  constexpr uint64_t kMaxFileBytes = uint64_t{1} << 30;  // far above any PNG within kPngMaxPixels
  ZI_ASSIGN_OR_RETURN(const std::string bytes, read_input_file(path, kMaxFileBytes));
  return decode_png(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

}  // namespace zimage
