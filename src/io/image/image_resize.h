// Image resampling as PIL does it for 8-bit images (Pillow's libImaging/Resample.c), because
// diffusers' VaeImageProcessor resizes PIL images with Image.resize(size, LANCZOS) and an
// img2img / inpaint input that is not already the target size must come out byte for byte as
// diffusers sees it. Facts reproduced (Pillow 13.0.0's Resample.c; checked byte for byte against
// Pillow 13 by the image_io golden):
//   - separable, two passes, the intermediate rounded to uint8. Horizontal first (only over the
//     source rows the vertical pass reads), unless the height shrinks by more than twice as many
//     pixels as the width: (H - h) > 0 and (H - h) > 2·(W - w) runs the vertical pass first.
//     Pillow 12 and older always ran horizontal first: for the size pairs where Pillow 13 goes
//     vertical first, older Pillows (and so older diffusers installs) give pixels that differ
//     by a few levels (up to ~30 on random noise, a level or two on photographs);
//   - per output pixel: center = (x + 0.5)·scale, scale = in/out, support = 3·max(scale, 1),
//     taps from (int)(center − support + 0.5) to (int)(center + support + 0.5) clipped to the
//     image, weights lanczos3((tap − center + 0.5)/max(scale, 1)) in double, normalised to sum 1;
//   - weights to fixed point with 22 fractional bits (round half away from zero), accumulation
//     in int32 from 2^21 (rounding), result (acc >> 22) clamped to [0, 255];
//   - a pass whose size does not change is skipped; same size both ways returns a copy.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace zimage {

// An 8-bit image with interleaved channels (1 = L, 2 = LA, 3 = RGB, 4 = RGBA), rows top to bottom.
struct Image8 {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels
};

// PIL's Image.resize((width, height), Image.LANCZOS) of `in` (each channel independently, as PIL
// does for L and RGB; PIL premultiplies alpha for LA / RGBA, which this does not: callers convert
// to L or RGB first, as diffusers' inputs are). Errors: bad sizes (< 1 or > 1,000,000 a side),
// a pixel buffer of the wrong length, allocation failure.
Result<Image8> resize_lanczos(const Image8& in, int width, int height);

}  // namespace zimage
