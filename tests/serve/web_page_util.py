"""Helpers of test_web_page.py: PNG files written and read with zlib alone (8-bit gray, RGB and
RGBA, non-interlaced, every filter), the mask painter's raster computed independently of the page
(discs of radius r at integer centres, segments stepped one pixel at a time with JavaScript's
Math.round), and strokes scripted as pointer events at known image pixels."""
import struct
import zlib


def _png(width, height, color_type, rows):
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    raw = b"".join(b"\0" + bytes(r) for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8,
                                                              color_type, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def png_rgb(width, height, pixel):
    rows = []
    for y in range(height):
        row = []
        for x in range(width):
            row.extend(v & 255 for v in pixel(x, y))
        rows.append(row)
    return _png(width, height, 2, rows)


def png_gray(bits):
    """A 0/1 raster as a black (0) and white (255) gray PNG."""
    return _png(len(bits[0]), len(bits), 0, [[255 if b else 0 for b in r] for r in bits])


def png_decode(data):
    """(width, height, rows of gray values): RGB(A) pixels must be gray (r == g == b)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0, "8-bit non-interlaced only"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 255
        prev = line
        px = []
        for x in range(w):
            v = line[x * bpp:(x + 1) * bpp]
            if ctype in (2, 6):
                assert v[0] == v[1] == v[2], "mask pixel not gray at (%d, %d)" % (x, y)
            px.append(v[0])
        rows.append(px)
    return w, h, rows


def _js_round(v):
    import math
    return math.floor(v + 0.5)


def disc_mask(bits, points, r, value):
    """Stamps one stroke (as mask.js does) into the raster `bits` (rows of 0/1)."""
    h, w = len(bits), len(bits[0])

    def stamp(cx, cy):
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                x, y = cx + dx, cy + dy
                if 0 <= x < w and 0 <= y < h and dx * dx + dy * dy <= r * r:
                    bits[y][x] = value

    stamp(*points[0])
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        dx, dy = x1 - x0, y1 - y0
        n = max(abs(dx), abs(dy))
        for i in range(1, n + 1):
            stamp(x0 + _js_round(dx * i / n), y0 + _js_round(dy * i / n))


def script_stroke(driver, canvas, points):
    """Pointer down at the first image pixel, moves through the others, up: real events on the
    canvas at the centres of those pixels."""
    driver.execute_script("""
      const c = arguments[0], pts = arguments[1], r = c.getBoundingClientRect();
      const at = (p) => ({ clientX: r.left + (p[0] + 0.5) * r.width / c.width,
                           clientY: r.top + (p[1] + 0.5) * r.height / c.height,
                           bubbles: true, pointerId: 1, isPrimary: true });
      c.dispatchEvent(new PointerEvent("pointerdown", at(pts[0])));
      for (const p of pts.slice(1)) c.dispatchEvent(new PointerEvent("pointermove", at(p)));
      c.dispatchEvent(new PointerEvent("pointerup", at(pts[pts.length - 1])));
    """, canvas, [list(p) for p in points])
