// PIL's 8-bit Lanczos resampling (see image_resize.h), written to be read next to Pillow's
// Resample.c: precompute_coeffs, normalize_coeffs_8bpc, the horizontal then vertical pass.
#include "io/image/image_resize.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <string>

namespace zimage {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL: 8 bits of result, 2 of headroom
constexpr int kMaxSide = 1000000;
constexpr double kPi = 3.14159265358979323846;  // M_PI

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x = x * kPi;
  return std::sin(x) / x;
}

double lanczos3(double x) {
  if (-3.0 <= x && x < 3.0) return sinc(x) * sinc(x / 3);
  return 0.0;
}

// One axis: for each output index, the first source index, the tap count and the fixed-point
// weights (ksize per output, zero past the taps).
struct Coeffs {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};

Coeffs precompute(int in_size, int out_size) {
  Coeffs c;
  // PIL: scale = (double)(in1 - in0) / outSize with the box edges as floats (0 and in_size).
  const double scale = static_cast<double>(static_cast<float>(in_size) - 0.0f) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 3.0 * filterscale;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(static_cast<size_t>(out_size));
  c.count.resize(static_cast<size_t>(out_size));
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(static_cast<size_t>(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = 0.0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);  // C truncation, as PIL
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = lanczos3((x + xmin - center + 0.5) * ss);
      k[static_cast<size_t>(x)] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x) {
      double v = k[static_cast<size_t>(x)];
      if (ww != 0.0) v /= ww;
      // normalize_coeffs_8bpc: round half away from zero to 22 fractional bits.
      const double scaled = v * (1 << kPrecisionBits);
      c.weights[static_cast<size_t>(xx) * c.ksize + x] =
          v < 0 ? static_cast<int32_t>(-0.5 + scaled) : static_cast<int32_t>(0.5 + scaled);
    }
    c.first[static_cast<size_t>(xx)] = xmin;
    c.count[static_cast<size_t>(xx)] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;  // arithmetic shift: floor, as PIL's lookup index
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

// Horizontal pass over source rows [row0, row0 + rows) of `in` into a `out_w` x `rows` image.
void horizontal(const Image8& in, int row0, int rows, int out_w, const Coeffs& c, Image8& out) {
  const int ch = in.channels;
  const size_t in_stride = static_cast<size_t>(in.width) * ch;
  for (int y = 0; y < rows; ++y) {
    const uint8_t* src = in.pixels.data() + static_cast<size_t>(row0 + y) * in_stride;
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(y) * out_w * ch;
    for (int xx = 0; xx < out_w; ++xx) {
      const int32_t* k = c.weights.data() + static_cast<size_t>(xx) * c.ksize;
      const int xmin = c.first[static_cast<size_t>(xx)], n = c.count[static_cast<size_t>(xx)];
      for (int b = 0; b < ch; ++b) {
        int32_t acc = 1 << (kPrecisionBits - 1);
        for (int x = 0; x < n; ++x) acc += src[static_cast<size_t>(x + xmin) * ch + b] * k[x];
        dst[static_cast<size_t>(xx) * ch + b] = clip8(acc);
      }
    }
  }
}

// Vertical pass: `in` rows are the source rows shifted by `row0`.
void vertical(const Image8& in, int row0, int out_h, const Coeffs& c, Image8& out) {
  const int ch = in.channels;
  const size_t stride = static_cast<size_t>(in.width) * ch;
  for (int yy = 0; yy < out_h; ++yy) {
    const int32_t* k = c.weights.data() + static_cast<size_t>(yy) * c.ksize;
    const int ymin = c.first[static_cast<size_t>(yy)] - row0, n = c.count[static_cast<size_t>(yy)];
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(yy) * stride;
    for (size_t i = 0; i < stride; ++i) {
      int32_t acc = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < n; ++y)
        acc += in.pixels[static_cast<size_t>(y + ymin) * stride + i] * k[y];
      dst[i] = clip8(acc);
    }
  }
}

Status check_size(int w, int h, const char* what) {
  if (w < 1 || h < 1 || w > kMaxSide || h > kMaxSide)
    return InvalidArgument(std::string("resize: ") + what + " size " + std::to_string(w) + "x" +
                           std::to_string(h) + " is invalid (each side 1.." +
                           std::to_string(kMaxSide) + ")");
  return Status::Ok();
}

}  // namespace

Result<Image8> resize_lanczos(const Image8& in, int width, int height) {
  ZI_TRY(check_size(in.width, in.height, "source"));
  ZI_TRY(check_size(width, height, "target"));
  if (in.channels < 1 || in.channels > 4)
    return InvalidArgument("resize: " + std::to_string(in.channels) + " channels (1..4 expected)");
  const size_t want = static_cast<size_t>(in.width) * in.height * in.channels;
  if (in.pixels.size() != want)
    return InvalidArgument("resize: the pixel buffer holds " + std::to_string(in.pixels.size()) +
                           " bytes, " + std::to_string(want) + " expected");
  try {
    if (width == in.width && height == in.height) return in;  // PIL: a copy
    // Pillow 13: "If height is being scaled down more than twice the amount the width is, run
    // the vertical pass first".
    const int64_t dy = int64_t{in.height} - height, dx = int64_t{in.width} - width;
    if (dy > 0 && dy > dx * 2) {
      Image8 mid;
      mid.width = in.width;
      mid.height = height;
      mid.channels = in.channels;
      mid.pixels.assign(static_cast<size_t>(mid.width) * height * mid.channels, 0);
      vertical(in, 0, height, precompute(in.height, height), mid);
      if (width == in.width) return mid;
      Image8 out;
      out.width = width;
      out.height = height;
      out.channels = in.channels;
      out.pixels.assign(static_cast<size_t>(width) * height * out.channels, 0);
      horizontal(mid, 0, height, width, precompute(in.width, width), out);
      return out;
    }
    const Coeffs vert = precompute(in.height, height);
    // First and last source rows the vertical pass reads.
    const int row_first = vert.first.front();
    const int row_last = vert.first.back() + vert.count.back();
    Image8 cur;
    int row0 = 0;
    const Image8* src = &in;
    if (width != in.width) {
      const Coeffs horiz = precompute(in.width, width);
      cur.width = width;
      cur.height = row_last - row_first;
      cur.channels = in.channels;
      cur.pixels.assign(static_cast<size_t>(cur.width) * cur.height * cur.channels, 0);
      horizontal(in, row_first, cur.height, width, horiz, cur);
      row0 = row_first;
      src = &cur;
    }
    if (height == in.height) return src == &in ? in : cur;
    Image8 out;
    out.width = src->width;
    out.height = height;
    out.channels = in.channels;
    out.pixels.assign(static_cast<size_t>(out.width) * height * out.channels, 0);
    vertical(*src, row0, height, vert, out);
    return out;
  } catch (const std::bad_alloc&) {
    return OutOfMemory("resize: " + std::to_string(in.width) + "x" + std::to_string(in.height) +
                       " -> " + std::to_string(width) + "x" + std::to_string(height));
  }
}

}  // namespace zimage
