// The image data of an 8-bit RGB PNG (its rows filtered, then compressed as one zlib stream: the
// payload of the IDAT chunk), made on several threads.
//
// Why by hand: libpng filters and deflates on the calling thread only, and no maintained PNG
// library splits that work; at zlib level 1 it was most of the 0.05-0.08 s a 1024² image takes
// to encode (docs/BENCHMARKS.md, session 14), paid by every `zimage generate` and every PNG the
// server returns. The scheme is pigz's: the filtered stream is cut into pieces deflated in
// parallel, each given the 32 KiB before it as its dictionary and ended by a sync flush (the last
// by the final block), so that their concatenation is one deflate stream; the zlib header and
// the Adler-32 of the whole stream (combined from the pieces') frame it. Rows are filtered as
// libpng does by default: each with the filter (None, Sub, Up, Average, Paeth) whose bytes, read
// as signed, have the least sum of absolute values. The result decodes to the same pixels as
// libpng's own output; its bytes differ (other block boundaries).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace zimage {

// w x h RGB pixels (3 bytes each, rows packed) -> the zlib stream of their filtered rows at zlib
// `level` (0-9). `threads` <= 0: a process-wide pool of up to 16 threads; 1: on the calling
// thread only. Images below ~256 KiB of rows are one piece (no gain in splitting them).
// InvalidArgument for bad sizes or levels, OutOfMemory, Internal for a zlib failure.
Result<std::vector<uint8_t>> png_deflate_rows(const uint8_t* rgb, int w, int h, int level,
                                              int threads = 0);

}  // namespace zimage
