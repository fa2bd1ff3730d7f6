#include "io/image/png_deflate.h"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>

#include "core/thread_pool.h"

namespace zimage {
namespace {

constexpr int kBpp = 3;                            // bytes a pixel: 8-bit RGB
constexpr size_t kPieceBytes = size_t{256} << 10;  // filtered bytes a thread deflates at once
constexpr size_t kWindow = size_t{32} << 10;       // deflate's window: a piece's dictionary

uint8_t paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  if (pa <= pb && pa <= pc) return static_cast<uint8_t>(a);
  return static_cast<uint8_t>(pb <= pc ? b : c);
}

// libpng's measure of a filtered row: the sum of its bytes' absolute values read as signed.
uint64_t row_cost(const uint8_t* v, size_t n) {
  uint64_t c = 0;
  for (size_t i = 0; i < n; ++i) c += static_cast<uint64_t>(std::abs(static_cast<int8_t>(v[i])));
  return c;
}

// Row `x` (n bytes) after the previous row `up` (null for the first, read as zeros) -> out[0] =
// filter type, out[1..n] the filtered bytes: the filter of least row_cost, the first of equals.
// `scratch` holds 4n bytes (one row for each filter but None). One loop per filter, without
// branches in the Sub, Up and Average ones, so the compiler vectorises them.
void filter_row(const uint8_t* x, const uint8_t* up, size_t n, uint8_t* out, uint8_t* scratch) {
  uint8_t* sub = scratch;
  uint8_t* upf = scratch + n;
  uint8_t* avg = scratch + 2 * n;
  uint8_t* pae = scratch + 3 * n;
  const size_t head = std::min<size_t>(kBpp, n);
  for (size_t i = 0; i < head; ++i) sub[i] = x[i];
  for (size_t i = kBpp; i < n; ++i) sub[i] = static_cast<uint8_t>(x[i] - x[i - kBpp]);
  if (up != nullptr) {
    for (size_t i = 0; i < n; ++i) upf[i] = static_cast<uint8_t>(x[i] - up[i]);
    for (size_t i = 0; i < head; ++i) avg[i] = static_cast<uint8_t>(x[i] - (up[i] >> 1));
    for (size_t i = kBpp; i < n; ++i)
      avg[i] = static_cast<uint8_t>(x[i] - ((x[i - kBpp] + up[i]) >> 1));
    for (size_t i = 0; i < head; ++i)
      pae[i] = static_cast<uint8_t>(x[i] - up[i]);  // paeth(0, b, 0)
    for (size_t i = kBpp; i < n; ++i)
      pae[i] = static_cast<uint8_t>(x[i] - paeth(x[i - kBpp], up[i], up[i - kBpp]));
  } else {  // above the first row: Up is None, Paeth is Sub
    std::memcpy(upf, x, n);
    for (size_t i = 0; i < head; ++i) avg[i] = x[i];
    for (size_t i = kBpp; i < n; ++i) avg[i] = static_cast<uint8_t>(x[i] - (x[i - kBpp] >> 1));
    std::memcpy(pae, sub, n);
  }
  const uint8_t* rows[5] = {x, sub, upf, avg, pae};
  int best = 0;
  uint64_t best_cost = row_cost(x, n);
  for (int f = 1; f < 5; ++f) {
    const uint64_t c = row_cost(rows[f], n);
    if (c < best_cost) best = f, best_cost = c;
  }
  out[0] = static_cast<uint8_t>(best);
  std::memcpy(out + 1, rows[best], n);
}

// Deflates in[begin, end) as a raw piece of one stream: the 32 KiB before `begin` as its
// dictionary, a sync flush at its end, or the final block when `last`.
bool deflate_piece(const uint8_t* in, size_t begin, size_t end, bool last, int level,
                   std::vector<uint8_t>& out) {
  z_stream s{};
  // Z_FILTERED, as libpng picks for filtered rows.
  if (deflateInit2(&s, level, Z_DEFLATED, -15, 8, level == 0 ? Z_DEFAULT_STRATEGY : Z_FILTERED) !=
      Z_OK)
    return false;
  bool ok = true;
  if (begin > 0) {
    const size_t dict = std::min(begin, kWindow);
    ok = deflateSetDictionary(&s, in + begin - dict, static_cast<uInt>(dict)) == Z_OK;
  }
  if (ok) {
    out.resize(deflateBound(&s, static_cast<uLong>(end - begin)) + 16);
    s.next_in = const_cast<Bytef*>(in + begin);
    s.avail_in = static_cast<uInt>(end - begin);
    s.next_out = out.data();
    s.avail_out = static_cast<uInt>(out.size());
    const int r = deflate(&s, last ? Z_FINISH : Z_SYNC_FLUSH);
    ok = (last ? r == Z_STREAM_END : r == Z_OK) && s.avail_in == 0;
    out.resize(out.size() - s.avail_out);
  }
  deflateEnd(&s);
  return ok;
}

ThreadPool& shared_pool() {
  // Never destroyed: a process that exits mid-encode must not join its threads from a static
  // destructor.
  static ThreadPool* pool =
      new ThreadPool(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)));
  return *pool;
}

Result<std::vector<uint8_t>> deflate_rows(const uint8_t* rgb, int w, int h, int level,
                                          int threads) {
  const size_t row = static_cast<size_t>(w) * kBpp, stride = row + 1;
  const size_t total = stride * static_cast<size_t>(h);
  std::vector<uint8_t> filtered(total);
  const int64_t pieces = static_cast<int64_t>(std::max<size_t>(1, total / kPieceBytes));
  std::unique_ptr<ThreadPool> own;
  ThreadPool* pool = nullptr;
  if (threads <= 0) {
    pool = &shared_pool();
  } else if (threads > 1) {
    own = std::make_unique<ThreadPool>(threads);
    pool = own.get();
  }
  const auto run = [&](int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (pool)
      pool->parallel_for(n, grain, fn);
    else
      fn(0, n);
  };
  // Rows: each from its raw predecessor, so any split of them is independent.
  std::atomic<bool> filtered_ok{true};
  run(h, 16, [&](int64_t r0, int64_t r1) {
    std::unique_ptr<uint8_t[]> scratch(new (std::nothrow) uint8_t[4 * row]);
    if (!scratch) {
      filtered_ok = false;
      return;
    }
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* x = rgb + static_cast<size_t>(r) * row;
      filter_row(x, r > 0 ? x - row : nullptr, row,
                 filtered.data() + static_cast<size_t>(r) * stride, scratch.get());
    }
  });
  if (!filtered_ok) return OutOfMemory("png: out of memory filtering the image rows");
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(pieces));
  std::vector<uLong> adler(static_cast<size_t>(pieces));
  std::vector<char> ok(static_cast<size_t>(pieces), 0);
  const size_t per = (total + static_cast<size_t>(pieces) - 1) / static_cast<size_t>(pieces);
  run(pieces, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const size_t b = static_cast<size_t>(p) * per, e = std::min(total, b + per);
      try {
        ok[p] = deflate_piece(filtered.data(), b, e, p + 1 == pieces, level, out[p]) ? 1 : 0;
      } catch (...) {  // out of memory in this piece: reported below
        ok[p] = 0;
      }
      adler[p] = adler32(adler32(0L, Z_NULL, 0), filtered.data() + b, static_cast<uInt>(e - b));
    }
  });
  size_t bytes = 2 + 4;
  for (int64_t p = 0; p < pieces; ++p) {
    if (!ok[p]) return InternalError("png: zlib could not compress the image data");
    bytes += out[p].size();
  }
  std::vector<uint8_t> z;
  z.reserve(bytes);
  // zlib header: deflate with a 32 KiB window, FLEVEL from the level, FCHECK.
  const int flevel = level <= 1 ? 0 : level <= 5 ? 1 : level == 6 ? 2 : 3;
  const unsigned cmf = 0x78, flg0 = static_cast<unsigned>(flevel) << 6;
  z.push_back(static_cast<uint8_t>(cmf));
  z.push_back(static_cast<uint8_t>(flg0 + (31 - (cmf * 256 + flg0) % 31) % 31));
  uLong sum = adler[0];
  for (int64_t p = 0; p < pieces; ++p) {
    z.insert(z.end(), out[p].begin(), out[p].end());
    if (p > 0) {
      const size_t b = static_cast<size_t>(p) * per, e = std::min(total, b + per);
      sum = adler32_combine(sum, adler[p], static_cast<z_off_t>(e - b));
    }
  }
  for (int s = 24; s >= 0; s -= 8) z.push_back(static_cast<uint8_t>(sum >> s));
  return z;
}

}  // namespace

Result<std::vector<uint8_t>> png_deflate_rows(const uint8_t* rgb, int w, int h, int level,
                                              int threads) {
  if (rgb == nullptr || w < 1 || h < 1)
    return InvalidArgument("png: no pixels, or a width or height below 1");
  if (level < 0 || level > 9)
    return InvalidArgument("png: compression level " + std::to_string(level) + " is outside 0..9");
  // Each piece's length goes to zlib as a uInt: the pieces are 256 KiB, the whole is bounded
  // by encode_png's pixel limit (768 MiB of RGB).
  try {
    return deflate_rows(rgb, w, h, level, threads);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("png: out of memory compressing a " + std::to_string(w) + "x" +
                       std::to_string(h) + " image");
  } catch (...) {
    return InternalError("png: compressing the image data failed");
  }
}

}  // namespace zimage
