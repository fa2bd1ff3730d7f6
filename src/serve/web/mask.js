// The inpainting mask painter. Strokes are stamped into a 0/1 raster at the start image's own
// resolution (discs of radius floor(size / 2), centres joined by a straight line one pixel at a
// time, no anti-aliasing), so the mask sent is exactly what was painted: white = repaint, black =
// keep (diffusers' convention, which the edits form reads from a mask without alpha).
"use strict";

class MaskPainter {
  constructor(canvas) {
    this.canvas = canvas;
    this.w = 0; this.h = 0;
    this.bits = new Uint8Array(0);
    this.history = [];  // raster copies before each stroke (undo)
    this.tool = "brush";
    this.size = 8;
    this.last = null;
    canvas.addEventListener("pointerdown", (ev) => this.down(ev));
    canvas.addEventListener("pointermove", (ev) => this.move(ev));
    for (const t of ["pointerup", "pointercancel", "pointerleave"])
      canvas.addEventListener(t, () => { this.last = null; });
  }

  reset(w, h) {
    this.w = w; this.h = h;
    this.canvas.width = w; this.canvas.height = h;
    this.bits = new Uint8Array(w * h);
    this.history = [];
    this.render();
  }

  // The image pixel under a pointer event.
  point(ev) {
    const r = this.canvas.getBoundingClientRect();
    return [Math.floor((ev.clientX - r.left) * this.w / r.width),
            Math.floor((ev.clientY - r.top) * this.h / r.height)];
  }

  down(ev) {
    if (!this.w) return;
    ev.preventDefault();
    if (this.canvas.setPointerCapture && ev.pointerId !== undefined) {
      try { this.canvas.setPointerCapture(ev.pointerId); } catch (e) { /* synthetic event */ }
    }
    this.history.push(this.bits.slice());
    const [x, y] = this.point(ev);
    this.stamp(x, y);
    this.last = [x, y];
    this.render();
  }

  move(ev) {
    if (!this.last) return;
    const [x, y] = this.point(ev);
    this.line(this.last[0], this.last[1], x, y);
    this.last = [x, y];
    this.render();
  }

  stamp(cx, cy) {
    const r = Math.floor(this.size / 2), v = this.tool === "eraser" ? 0 : 1;
    for (let dy = -r; dy <= r; ++dy) {
      const y = cy + dy;
      if (y < 0 || y >= this.h) continue;
      for (let dx = -r; dx <= r; ++dx) {
        const x = cx + dx;
        if (x >= 0 && x < this.w && dx * dx + dy * dy <= r * r) this.bits[y * this.w + x] = v;
      }
    }
  }

  line(x0, y0, x1, y1) {
    const dx = x1 - x0, dy = y1 - y0, n = Math.max(Math.abs(dx), Math.abs(dy));
    for (let i = 1; i <= n; ++i) this.stamp(x0 + Math.round(dx * i / n), y0 + Math.round(dy * i / n));
  }

  undo() { if (this.history.length) { this.bits = this.history.pop(); this.render(); } }
  clear() { this.history.push(this.bits.slice()); this.bits.fill(0); this.render(); }
  empty() { return !this.bits.some((b) => b !== 0); }

  // The painted pixels in translucent red over the image.
  render() {
    if (!this.w) return;
    const ctx = this.canvas.getContext("2d");
    const im = ctx.createImageData(this.w, this.h);
    for (let i = 0; i < this.bits.length; ++i)
      if (this.bits[i]) { im.data[4 * i] = 230; im.data[4 * i + 3] = 140; }
    ctx.putImageData(im, 0, 0);
  }

  // The mask as an opaque black-and-white PNG of the image's size.
  toBlob() {
    const c = document.createElement("canvas");
    c.width = this.w; c.height = this.h;
    const ctx = c.getContext("2d");
    const im = ctx.createImageData(this.w, this.h);
    for (let i = 0; i < this.bits.length; ++i) {
      const v = this.bits[i] ? 255 : 0;
      im.data[4 * i] = v; im.data[4 * i + 1] = v; im.data[4 * i + 2] = v; im.data[4 * i + 3] = 255;
    }
    ctx.putImageData(im, 0, 0);
    return new Promise((resolve) => c.toBlob(resolve, "image/png"));
  }
}
