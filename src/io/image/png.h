// PNG output (and input, for tests and the server) through libpng. Images are 8-bit RGB; the
// generation parameters travel as iTXt chunks (UTF-8, uncompressed) so that any prompt,
// Chinese or emoji included, survives and other tools (PIL's .text, exiftool) can read it.
// libpng reports errors by longjmp: every libpng call runs in C-style code with no C++ object
// alive across the jump, and each failure comes back as a Status that names the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace zimage {

using PngText = std::vector<std::pair<std::string, std::string>>;

// Largest accepted side and pixel count (reading and writing): libpng's default side limit is
// 1,000,000, but an image of 2^28 pixels (768 MiB of RGB) is already far past any Z-Image size.
inline constexpr int kPngMaxSide = 1000000;
inline constexpr int64_t kPngMaxPixels = int64_t{1} << 28;

struct PngImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // height rows of width RGB triplets, no padding
  PngText text;              // tEXt / zTXt / iTXt chunks, in file order
};

// Encodes w x h RGB pixels (row-major, 3 bytes a pixel, rgb must hold 3*w*h bytes) into a PNG in
// memory, with one iTXt chunk per (keyword, value). Errors (InvalidArgument): w or h < 1 or
// beyond the limits above, a null pointer, a keyword that PNG does not allow (1-79 printable
// Latin-1 characters, no leading/trailing/double spaces), a value that is not valid UTF-8 or
// holds a NUL byte. Internal libpng failures come back as kInternal / kOutOfMemory.
// `compression` is zlib's level, 0 (stored) to 9 (smallest, slowest); InvalidArgument outside.
// The default, 1, encodes a 1024x1024 picture 4-9x faster than zlib's default 6 (libpng's and
// PIL's) for 12-17 % more bytes (docs/BENCHMARKS.md, "Session 14"): at 6 the encoding of one
// generated image took 0.23-0.48 s on one core, a third to two thirds of its eight DiT forwards.
// The rows are filtered and compressed on up to 16 threads (png_deflate.h): a 1024² picture in
// 18 ms on 2 cores at level 1, where libpng alone took 51 ms (PngDeflate.AgainstLibpngsOwnEncoder).
inline constexpr int kPngDefaultCompression = 1;
Result<std::vector<uint8_t>> encode_png(const uint8_t* rgb, int w, int h, const PngText& text,
                                        int compression = kPngDefaultCompression);

// encode_png, then writes the file (replacing it). Errors as encode_png, plus IoError naming
// `path` when it cannot be created or written (a partial file is removed).
Status write_png(const std::string& path, const uint8_t* rgb, int w, int h, const PngText& text,
                 int compression = kPngDefaultCompression);

// Decodes a PNG of any colour type / bit depth to 8-bit RGB (alpha dropped, gray expanded,
// 16-bit reduced to the high byte, 16-bit grayscale included) plus its text chunks:
// decode_png_pixels below, then that conversion. FormatError (with `name` in the message) for
// data that is not a valid PNG, or is larger than the limits above.
Result<PngImage> decode_png(const uint8_t* data, size_t size, const std::string& name = "<memory>");

// Reads and decodes a file; IoError naming the path when it cannot be read.
Result<PngImage> read_png(const std::string& path);

// Interleaved 8-bit pixels (n pixels of 1 gray, 2 gray + alpha, 3 RGB or 4 RGBA channels)
// converted as PIL's convert("RGB") does (gray replicated, alpha dropped, not composited) into
// rgb[3 n], and as convert("L") does (ITU-R 601-2 luma in PIL's fixed point,
// L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16; alpha dropped, gray kept) into gray[n].
// The one copy of these rules: decode_png, image_read.h's to_rgb / to_gray and the public
// image_to_rgb / image_to_gray use them.
void pixels_to_rgb(const uint8_t* pixels, size_t n, int channels, uint8_t* rgb);
void pixels_to_gray(const uint8_t* pixels, size_t n, int channels, uint8_t* gray);

// A PNG with the channels PIL opens it with (image inputs, io/image/image_read.h): 1 gray (PIL "1",
// "L"; 1/2/4-bit samples scaled to 0..255), 2 gray + alpha ("LA"), 3 RGB (also palettes, whose
// tRNS transparency PIL keeps apart from the pixels), 4 RGBA. 16-bit samples keep their high
// byte, as PIL's "RGB;16B" / "RGBA;16B" / "LA;16B" unpackers do.
struct PngPixels {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels
  PngText text;                 // tEXt / zTXt / iTXt chunks, in file order
  std::string exif;             // the eXIf chunk's payload (a TIFF block), empty when none
};

// FormatError (naming `name`) for invalid data, for images beyond the limits above, and for
// 16-bit grayscale without alpha, which PIL opens as "I;16" and converts to 8 bits by clipping
// (every value above 255 becomes white): zimage refuses it rather than copy that.
Result<PngPixels> decode_png_pixels(const uint8_t* data, size_t size,
                                    const std::string& name = "<memory>");

}  // namespace zimage
