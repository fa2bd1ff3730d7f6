// Image files as inputs (img2img / inpainting), read the way diffusers users read them:
// diffusers.utils.load_image(path) = PIL.Image.open -> ImageOps.exif_transpose -> convert("RGB").
// Why it matters: an input must reach the VAE with the pixels diffusers would give it, so the
// decoders, the orientation rule and the colour conversions follow PIL (Pillow 13), not what
// another viewer might do. Checked file by file against PIL by the image_io golden.
//
//   formats      PNG (libpng; io/image/png.h decode_png_pixels), JPEG (libjpeg-turbo's TurboJPEG API,
//                accurate integer IDCT and fancy upsampling: PIL's defaults), WebP (libwebp, still
//                images; an animation is refused). Detected from the first bytes, not the name.
//   orientation  as ImageOps.exif_transpose: the EXIF Orientation tag (JPEG APP1 "Exif", PNG eXIf
//                or an ImageMagick "Raw profile type exif" text chunk, WebP EXIF chunk; either byte
//                order) and, only when EXIF has none, the first `tiff:Orientation="N"` or
//                `tiff:Orientation>N` in the XMP packet; 2..8 flip / rotate, anything else nothing.
//                (PIL.Image.open alone applies no orientation; load_image does.)
//   refused      16-bit grayscale PNG (PIL clips it), CMYK / YCCK JPEG, animated WebP: each with a
//                message naming the file. Also, from the headers before any decoding: more than
//                kMaxInputPixels pixels, JPEGs whose scans exceed kMaxJpegScans or
//                kMaxJpegScanCost, PNGs whose text chunks exceed kMaxPngTextChunk or
//                kMaxPngTextTotal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "io/image/image_resize.h"

namespace zimage {

// Inputs larger than this (about 67 MP, 8192 x 8192) are refused from their header, before any
// pixel memory is allocated: a small file cannot make the server allocate gigabytes.
inline constexpr int64_t kMaxInputPixels = int64_t{1} << 26;

// Decoding cost of a JPEG, bounded from its markers before anything is decoded (a progressive
// JPEG decodes every scan over the whole image: a 344 KiB file of 8,000 scans cost 20 s of CPU).
// At most kMaxJpegScans scans (libjpeg-turbo's own limit, TJFLAG_LIMITSCANS / djpeg -maxscans),
// and the scans together at most kMaxJpegScanCost, a scan over B 8x8 blocks of a band of K
// coefficients costing B * (K + kJpegBlockCost) (measured: about 0.7 ns each on one core, the
// per-block work counting for about 20 coefficients), so about 3 s of decoding at the worst.
// Every progression over whole bands that libjpeg writes (its default 10 scans, or successive
// approximation of every bit, Al <= 10) fits up to kMaxInputPixels; many narrow scans over a large
// image do not (at 8192 x 8192 gray, 195 one-coefficient scans fit, 196 do not).
inline constexpr int kMaxJpegScans = 500;
inline constexpr uint64_t kJpegBlockCost = 20;
inline constexpr uint64_t kMaxJpegScanCost = uint64_t{1} << 32;

// PNG text (tEXt, zTXt, iTXt): PIL's limits, so the decoder never inflates more than this. A
// compressed text may inflate to at most kMaxPngTextChunk, all texts together hold at most
// kMaxPngTextTotal (PngImagePlugin's MAX_TEXT_CHUNK and MAX_TEXT_MEMORY: load_image refuses
// larger ones too).
inline constexpr size_t kMaxPngTextChunk = size_t{1} << 20;
inline constexpr size_t kMaxPngTextTotal = size_t{64} << 20;

// Decodes a PNG, JPEG or WebP held in memory, orientation applied, with the file's channels:
// 1 gray, 2 gray + alpha, 3 RGB, 4 RGBA. `name` (a path or "image") starts every error message.
Result<Image8> decode_image(const uint8_t* data, size_t size, const std::string& name);

// Reads and decodes a file (validated as io/fs/file_io.h read_input_file does: a regular file, not
// a FIFO or device). Errors name the path.
Result<Image8> read_image(const std::string& path);

// PIL's convert("RGB"): gray replicated, alpha dropped (not composited).
Image8 to_rgb(const Image8& in);
// PIL's convert("L"): L = (19595·R + 38470·G + 7471·B + 0x8000) >> 16 (ITU-R 601-2 luma in
// PIL's fixed point), alpha dropped; gray stays as it is.
Image8 to_gray(const Image8& in);

// The EXIF Orientation of a TIFF block (optionally prefixed "Exif\0\0"), -1 when the tag is
// absent or the block is malformed. Exposed for tests.
int exif_orientation(const std::string& exif);
// PIL's XMP fallback: the digit after the first `tiff:Orientation="` or `tiff:Orientation>`,
// 0 when there is none.
int xmp_orientation(const std::string& xmp);
// ImageOps.exif_transpose's transposition for `orientation` (2..8; other values: unchanged).
Image8 apply_orientation(const Image8& in, int orientation);

}  // namespace zimage
