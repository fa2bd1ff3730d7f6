// Image file inputs as diffusers' load_image reads them (see image_read.h): format sniffing, the
// three decoders, PIL's orientation lookup (EXIF, then XMP) and its colour conversions.
#include "io/image/image_read.h"

#include <turbojpeg.h>
#include <webp/decode.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string_view>
#include <vector>

#include "io/fs/file_io.h"
#include "io/image/png.h"

namespace zimage {
namespace {

std::string dims(int64_t w, int64_t h) {
  return std::to_string(w) + "x" + std::to_string(h);
}

Status check_pixels(const std::string& name, int64_t w, int64_t h) {
  if (w < 1 || h < 1) return FormatError(name + ": empty image (" + dims(w, h) + ")");
  if (w * h > kMaxInputPixels)
    return FormatError(name + ": image " + dims(w, h) + " exceeds the limit of " +
                       std::to_string(kMaxInputPixels) + " pixels");
  return Status::Ok();
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

uint32_t be16(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 8 | p[1];
}
uint32_t le32(const uint8_t* p) {
  return p[0] | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// Metadata the orientation rule reads, per format.
struct Meta {
  std::string exif;  // a TIFF block, maybe prefixed "Exif\0\0"
  std::string xmp;
};

// ---- PNG --------------------------------------------------------------------------------------

// Bytes `z` inflates to, counting stops past `cap` (then cap + 1); a corrupt stream counts what
// came out before the error (PIL drops such a text, libpng warns).
size_t inflated_size(const uint8_t* z, size_t n, size_t cap) {
  z_stream s{};
  if (inflateInit(&s) != Z_OK) return cap + 1;
  uint8_t out[16384];
  s.next_in = const_cast<Bytef*>(z);
  s.avail_in = static_cast<uInt>(std::min<size_t>(n, UINT32_MAX));
  size_t total = 0;
  for (;;) {
    s.next_out = out;
    s.avail_out = sizeof(out);
    const int rc = inflate(&s, Z_NO_FLUSH);
    total += sizeof(out) - s.avail_out;
    if (total > cap) {
      total = cap + 1;
      break;
    }
    if (rc != Z_OK) break;  // the end, an error, or no more input
  }
  inflateEnd(&s);
  return total;
}

// PIL's limits on PNG text (PngImagePlugin MAX_TEXT_CHUNK, MAX_TEXT_MEMORY), from the chunks
// before libpng reads them: a compressed text (zTXt, compressed iTXt) inflating past
// kMaxPngTextChunk, or texts past kMaxPngTextTotal in all, make load_image fail, and would
// otherwise make the decoder inflate gigabytes (999 zTXt chunks of 7.7 KiB each inflate to
// 7.9 MB: a 7.7 MB file costs 36 s of CPU). Inflating stops at the limits, so the check costs
// at most about 65 MiB of inflate.
Status check_png_text(const uint8_t* data, size_t size, const std::string& name) {
  size_t total = 0;
  for (size_t pos = 8; pos + 12 <= size;) {
    const size_t len = static_cast<size_t>(be16(data + pos)) << 16 | be16(data + pos + 2);
    const std::string_view type(reinterpret_cast<const char*>(data + pos + 4), 4);
    if (len > size - pos - 12) break;  // truncated: libpng refuses it
    const uint8_t* d = data + pos + 8;
    pos += 12 + len;
    if (type == "IEND") break;
    const bool text = type == "tEXt", ztext = type == "zTXt", itext = type == "iTXt";
    if (!text && !ztext && !itext) continue;
    const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(d, 0, len));
    if (nul == nullptr) continue;                  // no keyword: libpng drops it
    size_t at = static_cast<size_t>(nul - d) + 1;  // past the keyword
    size_t bytes = len - std::min(len, at);
    if (ztext || itext) {
      bool compressed = ztext;
      if (itext) {  // flag, method, language\0, translated keyword\0, text
        compressed = at < len && d[at] != 0;
        for (int k = 0; k < 2 && at <= len; ++k) {
          const size_t from = k == 0 ? at + 2 : at;
          const void* z = from < len ? std::memchr(d + from, 0, len - from) : nullptr;
          at = z == nullptr ? len + 1 : static_cast<size_t>(static_cast<const uint8_t*>(z) - d) + 1;
        }
        if (at > len) continue;  // malformed: libpng drops it
      } else {
        at += 1;  // the compression method
      }
      bytes = len - std::min(len, at);
      if (compressed) {
        bytes = at < len ? inflated_size(d + at, len - at, kMaxPngTextChunk) : 0;
        if (bytes > kMaxPngTextChunk)
          return FormatError(name + ": a PNG " + std::string(type) +
                             " text chunk inflates to more than " +
                             std::to_string(kMaxPngTextChunk >> 20) +
                             " MiB (PIL, and so diffusers' load_image, refuses it too)");
      }
    }
    total += bytes;
    if (total > kMaxPngTextTotal)
      return FormatError(name + ": the PNG's text chunks hold more than " +
                         std::to_string(kMaxPngTextTotal >> 20) +
                         " MiB (PIL, and so diffusers' load_image, refuses it too)");
  }
  return Status::Ok();
}

Result<Image8> decode_png_file(const uint8_t* data, size_t size, const std::string& name,
                               Meta* meta) {
  // The size from IHDR (right after the signature) before libpng allocates anything.
  if (size >= 24 && std::memcmp(data + 12, "IHDR", 4) == 0) {
    const auto be32 = [](const uint8_t* p) {
      return int64_t{p[0]} << 24 | int64_t{p[1]} << 16 | int64_t{p[2]} << 8 | p[3];
    };
    ZI_TRY(check_pixels(name, be32(data + 16), be32(data + 20)));
  }
  ZI_TRY(check_png_text(data, size, name));
  ZI_ASSIGN_OR_RETURN(PngPixels png, decode_png_pixels(data, size, name));
  meta->exif = std::move(png.exif);
  std::string raw_profile;
  for (const auto& [key, value] : png.text) {
    if (key == "XML:com.adobe.xmp" && meta->xmp.empty()) meta->xmp = value;
    if (key == "Raw profile type exif" && raw_profile.empty()) raw_profile = value;
  }
  if (meta->exif.empty() && !raw_profile.empty()) {
    // PIL: bytes.fromhex("".join(text.split("\n")[3:])): hex digits after the third newline
    // (ImageMagick's "\nexif\n<length>\n<hex>"); whitespace is skipped, anything else voids it.
    size_t pos = 0;
    for (int k = 0; k < 3 && pos != std::string::npos; ++k) {
      pos = raw_profile.find('\n', pos);
      if (pos != std::string::npos) ++pos;
    }
    std::string bytes;
    bool ok = pos != std::string::npos;
    int hi = -1;
    for (size_t i = ok ? pos : raw_profile.size(); i < raw_profile.size() && ok; ++i) {
      const char c = raw_profile[i];
      if (c == ' ' || c == '\n' || c == '\t' || c == '\r') continue;
      int v = -1;
      if (c >= '0' && c <= '9') v = c - '0';
      if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
      if (v < 0) ok = false;
      if (hi < 0) {
        hi = v;
      } else {
        bytes.push_back(static_cast<char>(hi << 4 | v));
        hi = -1;
      }
    }
    if (ok && hi < 0) meta->exif = std::move(bytes);
  }
  Image8 out;
  out.width = png.width;
  out.height = png.height;
  out.channels = png.channels;
  out.pixels = std::move(png.pixels);
  return out;
}

// ---- JPEG -------------------------------------------------------------------------------------

// The APP1 segments before the scan: the first "Exif\0\0" one (PIL keeps the first) and the last
// XMP one (PIL overwrites).
void jpeg_markers(const uint8_t* data, size_t size, Meta* meta) {
  static constexpr std::string_view kXmp("http://ns.adobe.com/xap/1.0/\0", 29);
  size_t pos = 2;
  while (pos + 4 <= size && data[pos] == 0xFF) {
    const uint8_t marker = data[pos + 1];
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) break;                 // start of scan / end of image
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {  // no length
      pos += 2;
      continue;
    }
    const size_t len = be16(data + pos + 2);
    if (len < 2) {
      pos += 4;
      continue;
    }
    if (pos + 2 + len > size) break;
    const std::string_view seg(reinterpret_cast<const char*>(data + pos + 4), len - 2);
    if (marker == 0xE1) {
      if (starts_with(seg, std::string_view("Exif\0\0", 6)) && meta->exif.empty())
        meta->exif = std::string(seg);
      else if (starts_with(seg, kXmp))
        meta->xmp = std::string(seg.substr(kXmp.size()));
    }
    pos += 2 + len;
  }
}

Status too_many_scans(const std::string& name) {
  return FormatError(name + ": progressive JPEG with more than " + std::to_string(kMaxJpegScans) +
                     " scans (a limit on decoding cost); save it as a baseline JPEG or with "
                     "fewer scans");
}

// The scans of a JPEG and what decoding them costs (image_read.h kMaxJpegScanCost), from the
// markers alone, walked as libjpeg reads them: length-prefixed segments (a length under 2 skips
// nothing, as libjpeg's skip_variable), bytes between segments skipped, and after each SOS its
// entropy-coded data up to the next marker libjpeg acts on: 0xFF then a byte of 0xC0 or more,
// not 0xFF or a restart marker (0xFF 0x00 is a stuffed byte; markers below 0xC0 libjpeg skips
// inside a scan with restarts, and stops on as unknown without). Refuses (naming `name`) a file
// past kMaxJpegScans or kMaxJpegScanCost; anything it cannot follow (a length past the end: the
// decoder stops there too) ends the walk, and the decoder's own limit (TJFLAG_LIMITSCANS, 500
// scans) stays on behind it.
Status check_jpeg_scans(const uint8_t* data, size_t size, const std::string& name) {
  struct Component {
    int id, h, v;
  };
  std::vector<Component> comps;
  uint64_t width = 0, height = 0;
  int hmax = 1, vmax = 1;
  int scans = 0;
  uint64_t cost = 0;
  auto blocks = [](uint64_t pixels, int samp, int max_samp) {
    const uint64_t scaled = (pixels * static_cast<uint64_t>(samp) + max_samp - 1) / max_samp;
    return (scaled + 7) / 8;
  };
  size_t pos = 2;
  while (pos + 1 < size) {
    if (data[pos] != 0xFF) {  // bytes between segments: libjpeg skips them (with a warning)
      ++pos;
      continue;
    }
    const uint8_t m = data[pos + 1];
    if (m == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (m == 0x00 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {  // stuffing, TEM, RSTn: no length
      pos += 2;
      continue;
    }
    if (m == 0xD8 || m == 0xD9) break;  // a second SOI (an error) or EOI: the end
    if (pos + 4 > size) break;
    const size_t len = be16(data + pos + 2);
    if (len < 2) {
      pos += 4;
      continue;
    }
    if (pos + 2 + len > size) break;
    const uint8_t* seg = data + pos + 4;
    const size_t n = len - 2;
    const bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
    if (sof && comps.empty() && n >= 6) {
      height = be16(seg + 1);
      width = be16(seg + 3);
      const size_t count = seg[5];
      for (size_t i = 0; i < count && 6 + 3 * i + 2 < n; ++i) {
        const uint8_t* c = seg + 6 + 3 * i;
        const int h = std::max(1, c[1] >> 4), v = std::max(1, c[1] & 15);
        comps.push_back({c[0], h, v});
        hmax = std::max(hmax, h);
        vmax = std::max(vmax, v);
      }
    }
    pos += 2 + len;
    if (m != 0xDA) continue;
    // SOS: Ns, Ns x (component id, tables), Ss, Se, Ah/Al.
    ++scans;
    if (scans > kMaxJpegScans) return too_many_scans(name);
    const size_t ns = n >= 1 ? seg[0] : 0;
    if (n >= 1 + 2 * ns + 3 && !comps.empty()) {
      const int ss = seg[1 + 2 * ns], se = seg[2 + 2 * ns];
      const uint64_t band = static_cast<uint64_t>(std::clamp(se - ss + 1, 1, 64));
      uint64_t scan_blocks = 0;
      if (ns == 1) {
        for (const Component& c : comps)
          if (c.id == seg[1]) scan_blocks = blocks(width, c.h, hmax) * blocks(height, c.v, vmax);
      } else {
        const uint64_t mcus =
            ((width + 8 * hmax - 1) / (8 * hmax)) * ((height + 8 * vmax - 1) / (8 * vmax));
        for (size_t i = 0; i < ns; ++i)
          for (const Component& c : comps)
            if (c.id == seg[1 + 2 * i]) scan_blocks += mcus * static_cast<uint64_t>(c.h * c.v);
      }
      cost += scan_blocks * (band + kJpegBlockCost);
      if (cost > kMaxJpegScanCost)
        return FormatError(name + ": JPEG of " +
                           dims(static_cast<int64_t>(width), static_cast<int64_t>(height)) +
                           " whose " + std::to_string(scans) +
                           " scans exceed the decoding-cost limit (each progressive scan is "
                           "decoded over the whole image); save it as a baseline JPEG or with "
                           "fewer scans");
    }
    // The entropy-coded data, up to the next marker.
    while (pos + 1 < size) {
      const uint8_t b = data[pos + 1];
      if (data[pos] == 0xFF && b >= 0xC0 && b != 0xFF && !(b >= 0xD0 && b <= 0xD7)) break;
      pos += data[pos] == 0xFF && b != 0xFF ? 2 : 1;
    }
  }
  return Status::Ok();
}

struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h != nullptr) tjDestroy(h);
  }
  TjHandle() = default;
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
};

Result<Image8> decode_jpeg_file(const uint8_t* data, size_t size, const std::string& name,
                                Meta* meta) {
  if (size > 0xFFFFFFFFull) return FormatError(name + ": JPEG file too large");
  jpeg_markers(data, size, meta);
  TjHandle tj;
  if (tj.h == nullptr) return OutOfMemory(name + ": cannot create the JPEG decoder");
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  auto* buf = const_cast<unsigned char*>(data);  // TurboJPEG 2.x takes non-const; never writes
  const unsigned long len = static_cast<unsigned long>(size);
  if (tjDecompressHeader3(tj.h, buf, len, &w, &h, &subsamp, &colorspace) != 0)
    return FormatError(name + ": not a valid JPEG (" + tjGetErrorStr2(tj.h) + ")");
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
    return FormatError(name +
                       ": CMYK JPEG is not supported (PIL converts it with its own formula); "
                       "save the image as RGB");
  ZI_TRY(check_pixels(name, w, h));
  ZI_TRY(check_jpeg_scans(data, size, name));
  Image8 out;
  out.width = w;
  out.height = h;
  out.channels = colorspace == TJCS_GRAY ? 1 : 3;
  out.pixels.assign(static_cast<size_t>(w) * h * out.channels, 0);
  // Accurate integer IDCT and fancy upsampling, libjpeg's (and PIL's) defaults; the decoder's
  // own 500-scan limit as well, should check_jpeg_scans have missed a scan.
  const int rc = tjDecompress2(tj.h, buf, len, out.pixels.data(), w, 0, h,
                               out.channels == 1 ? TJPF_GRAY : TJPF_RGB, TJFLAG_LIMITSCANS);
  if (rc != 0) {
    const std::string msg = tjGetErrorStr2(tj.h);
    if (msg.find("more than 500 scans") != std::string::npos) return too_many_scans(name);
    // libjpeg turns a truncated file into a warning and grey rows; PIL refuses it ("image file
    // is truncated"). Other warnings (extraneous bytes) PIL ignores, and so do we.
    if (tjGetErrorCode(tj.h) != TJERR_WARNING || msg.find("Premature end") != std::string::npos)
      return FormatError(name + ": cannot decode the JPEG (" + msg + ")");
  }
  return out;
}

// ---- WebP -------------------------------------------------------------------------------------

// The first EXIF and "XMP " chunks of the RIFF container (what libwebp's demuxer hands PIL).
void webp_chunks(const uint8_t* data, size_t size, Meta* meta) {
  size_t pos = 12;
  while (pos + 8 <= size) {
    const std::string_view tag(reinterpret_cast<const char*>(data + pos), 4);
    const uint64_t len = le32(data + pos + 4);
    if (len > size - pos - 8) break;
    const std::string payload(reinterpret_cast<const char*>(data + pos + 8),
                              static_cast<size_t>(len));
    if (tag == "EXIF" && meta->exif.empty()) meta->exif = payload;
    if (tag == "XMP " && meta->xmp.empty()) meta->xmp = payload;
    pos += 8 + static_cast<size_t>(len) + (len & 1);  // chunks are padded to even sizes
  }
}

Result<Image8> decode_webp_file(const uint8_t* data, size_t size, const std::string& name,
                                Meta* meta) {
  WebPBitstreamFeatures f;
  if (WebPGetFeatures(data, size, &f) != VP8_STATUS_OK)
    return FormatError(name + ": not a valid WebP file");
  if (f.has_animation != 0)
    return FormatError(name + ": animated WebP is not supported; give a still image");
  ZI_TRY(check_pixels(name, f.width, f.height));
  webp_chunks(data, size, meta);
  Image8 out;
  out.width = f.width;
  out.height = f.height;
  out.channels = f.has_alpha != 0 ? 4 : 3;
  const size_t stride = static_cast<size_t>(f.width) * out.channels;
  out.pixels.assign(stride * f.height, 0);
  const uint8_t* ok = out.channels == 4
                          ? WebPDecodeRGBAInto(data, size, out.pixels.data(), out.pixels.size(),
                                               static_cast<int>(stride))
                          : WebPDecodeRGBInto(data, size, out.pixels.data(), out.pixels.size(),
                                              static_cast<int>(stride));
  if (ok == nullptr) return FormatError(name + ": cannot decode the WebP image data");
  return out;
}

uint32_t rd16(const uint8_t* p, bool big) {
  return big ? static_cast<uint32_t>(p[0]) << 8 | p[1] : p[0] | static_cast<uint32_t>(p[1]) << 8;
}
uint32_t rd32(const uint8_t* p, bool big) {
  return big ? static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
                   static_cast<uint32_t>(p[2]) << 8 | p[3]
             : le32(p);
}

}  // namespace

int exif_orientation(const std::string& exif) {
  std::string_view e(exif);
  if (starts_with(e, std::string_view("Exif\0\0", 6))) e.remove_prefix(6);
  const auto* d = reinterpret_cast<const uint8_t*>(e.data());
  if (e.size() < 8) return -1;
  bool big = false;
  if (d[0] == 'M' && d[1] == 'M') {
    big = true;
  } else if (!(d[0] == 'I' && d[1] == 'I')) {
    return -1;
  }
  if (rd16(d + 2, big) != 42) return -1;
  const uint64_t ifd = rd32(d + 4, big);
  if (ifd + 2 > e.size()) return -1;
  const uint32_t count = rd16(d + ifd, big);
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t at = ifd + 2 + uint64_t{12} * i;
    if (at + 12 > e.size()) return -1;
    if (rd16(d + at, big) != 0x0112) continue;
    const uint32_t type = rd16(d + at + 2, big), n = rd32(d + at + 4, big);
    if (n < 1) return -1;
    if (type == 3) return static_cast<int>(rd16(d + at + 8, big));           // SHORT
    if (type == 4) return static_cast<int>(rd32(d + at + 8, big) & 0xFFFF);  // LONG
    if (type == 1) return d[at + 8];                                         // BYTE
    return 0;  // present, of another type: no transposition (and no XMP fallback, as PIL)
  }
  return -1;
}

int xmp_orientation(const std::string& xmp) {
  static constexpr std::string_view kKey = "tiff:Orientation";
  for (size_t pos = xmp.find(kKey); pos != std::string::npos; pos = xmp.find(kKey, pos + 1)) {
    size_t v = pos + kKey.size();
    if (v + 1 < xmp.size() && xmp[v] == '=' && xmp[v + 1] == '"') {
      v += 2;
    } else if (v < xmp.size() && xmp[v] == '>') {
      v += 1;
    } else {
      continue;
    }
    if (v < xmp.size() && xmp[v] >= '0' && xmp[v] <= '9') return xmp[v] - '0';
  }
  return 0;
}

Image8 apply_orientation(const Image8& in, int orientation) {
  if (orientation < 2 || orientation > 8) return in;
  const int w = in.width, h = in.height, c = in.channels;
  const bool swap = orientation >= 5;  // TRANSPOSE, ROTATE_270, TRANSVERSE, ROTATE_90
  Image8 out;
  out.width = swap ? h : w;
  out.height = swap ? w : h;
  out.channels = c;
  out.pixels.resize(in.pixels.size());
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      int sx = x, sy = y;  // the source pixel of out(x, y), as PIL's Image.transpose
      switch (orientation) {
        case 2:
          sx = w - 1 - x;
          break;  // FLIP_LEFT_RIGHT
        case 3:
          sx = w - 1 - x;
          sy = h - 1 - y;
          break;  // ROTATE_180
        case 4:
          sy = h - 1 - y;
          break;  // FLIP_TOP_BOTTOM
        case 5:
          sx = y;
          sy = x;
          break;  // TRANSPOSE
        case 6:
          sx = y;
          sy = h - 1 - x;
          break;  // ROTATE_270 (90° clockwise)
        case 7:
          sx = w - 1 - y;
          sy = h - 1 - x;
          break;  // TRANSVERSE
        default:
          sx = w - 1 - y;
          sy = x;
          break;  // 8: ROTATE_90 (counter-clockwise)
      }
      std::memcpy(&out.pixels[(static_cast<size_t>(y) * out.width + x) * c],
                  &in.pixels[(static_cast<size_t>(sy) * w + sx) * c], static_cast<size_t>(c));
    }
  }
  return out;
}

Result<Image8> decode_image(const uint8_t* data, size_t size, const std::string& name) {
  if (data == nullptr || size == 0) return FormatError(name + ": empty file");
  try {
    Meta meta;
    static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    const bool png = size >= 8 && std::memcmp(data, kPng, 8) == 0;
    const bool jpeg = size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
    const bool webp =
        size >= 12 && std::memcmp(data, "RIFF", 4) == 0 && std::memcmp(data + 8, "WEBP", 4) == 0;
    if (!png && !jpeg && !webp)
      return FormatError(name + ": not a PNG, JPEG or WebP file (unrecognised first bytes)");
    ZI_ASSIGN_OR_RETURN(Image8 img, png    ? decode_png_file(data, size, name, &meta)
                                    : jpeg ? decode_jpeg_file(data, size, name, &meta)
                                           : decode_webp_file(data, size, name, &meta));
    int orientation = exif_orientation(meta.exif);
    if (orientation < 0) orientation = xmp_orientation(meta.xmp);  // PIL: XMP only without EXIF's
    return apply_orientation(img, orientation);
  } catch (const std::bad_alloc&) {
    return OutOfMemory(name + ": out of memory while decoding");
  }
}

Result<Image8> read_image(const std::string& path) {
  constexpr uint64_t kMaxFileBytes = uint64_t{1} << 30;
  ZI_ASSIGN_OR_RETURN(const std::string bytes, read_input_file(path, kMaxFileBytes));
  return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

Image8 to_rgb(const Image8& in) {
  if (in.channels == 3) return in;
  Image8 out;
  out.width = in.width;
  out.height = in.height;
  out.channels = 3;
  const size_t n = static_cast<size_t>(in.width) * in.height;
  out.pixels.resize(n * 3);
  pixels_to_rgb(in.pixels.data(), n, in.channels, out.pixels.data());
  return out;
}

Image8 to_gray(const Image8& in) {
  if (in.channels == 1) return in;
  Image8 out;
  out.width = in.width;
  out.height = in.height;
  out.channels = 1;
  const size_t n = static_cast<size_t>(in.width) * in.height;
  out.pixels.resize(n);
  pixels_to_gray(in.pixels.data(), n, in.channels, out.pixels.data());
  return out;
}

}  // namespace zimage
