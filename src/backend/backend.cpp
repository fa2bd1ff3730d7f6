#include "backend/backend.h"

#include <cstring>
#include <string>

#include "backend/op_contract.h"
#include "core/dtype.h"

namespace zimage {

Status Backend::quantize_fp8(const Tensor&, Tensor&, Tensor&) {
  return Unsupported(name() + " has no FP8 support");
}

Status Backend::matmul_fp8(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  return Unsupported(name() + " has no FP8 support");
}

Status Backend::matmul_fp8_rows(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                Tensor&) {
  return Unsupported(name() + " has no FP8 support");
}

Status Backend::quantize_fp8_rows(const Tensor&, Tensor&, Tensor&) {
  return Unsupported(name() + " has no FP8 weight support");
}

Status Backend::dequantize_fp8_rows(const Tensor&, const Tensor&, Tensor&) {
  return Unsupported(name() + " has no FP8 weight support");
}

Status Backend::dequantize_packed(uint32_t, const Tensor&, Tensor&) {
  return Unsupported(name() + " cannot dequantise packed GGUF weights");
}

Result<Tensor> Backend::alloc_pinned(DType dtype, const Shape& shape) {
  Tensor t = Tensor::host(dtype, shape);
  if (!t.defined()) return OutOfMemory("host memory for " + shape_string(shape));
  return t;
}

Status Backend::residual_norm_gate_then_norm(Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                             const Tensor& gate, const Tensor& w_next,
                                             const Tensor& scale_next, Tensor& out) {
  ZI_TRY(residual_rms_norm_gate(x, y, w, eps, gate));
  const int64_t d = x.rank() > 0 ? x.dim(-1) : 0;
  if (d <= 0 || x.numel() % d != 0)
    return InvalidArgument("residual_norm_gate_then_norm: x " + x.describe());
  return rms_norm(x.view({x.numel() / d, d}), w_next, eps, scale_next, out);
}

Status Backend::matmul_fp8_quantized(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, Tensor&) {
  return Unsupported("matmul_fp8_quantized: not implemented by this backend");
}

// quantize_fp8_rows over x's last dimension, whatever x's leading shape (the FP8 row ops take
// their outputs in any leading shape).
Status Backend::quantize_rows_of(const Tensor& x, Tensor& q, Tensor& scale) {
  const int64_t d = x.rank() > 0 ? x.dim(-1) : 0;
  if (d <= 0 || x.numel() % d != 0 || q.numel() != x.numel() || scale.numel() != x.numel() / d)
    return InvalidArgument("FP8 rows of " + x.describe() + ": codes " + q.describe() +
                           " and scales " + scale.describe() + " do not hold them");
  const int64_t r = x.numel() / d;
  Tensor q2 = q.view({r, d}), s2 = scale.view({r});
  return quantize_fp8_rows(x.view({r, d}), q2, s2);
}

Status Backend::residual_norm_gate_then_norm_fp8(Tensor& x, const Tensor& y, const Tensor& w,
                                                 float eps, const Tensor& gate,
                                                 const Tensor& w_next, const Tensor& scale_next,
                                                 Tensor& out, Tensor& out8, Tensor& out_scale) {
  ZI_TRY(residual_norm_gate_then_norm(x, y, w, eps, gate, w_next, scale_next, out));
  return quantize_rows_of(out, out8, out_scale);
}

Status Backend::swiglu_fp8(const Tensor& x, Tensor& y, Tensor& y8, Tensor& y_scale) {
  ZI_TRY(swiglu(x, y));
  return quantize_rows_of(y, y8, y_scale);
}

Status Backend::matmul_fp8_swiglu(const Tensor& x8, const Tensor& x_scale, const Tensor& w13_8,
                                  const Tensor& w13_scale, int64_t block, Tensor& y, Tensor& y8,
                                  Tensor& y_scale) {
  const char* op = "matmul_fp8_swiglu";
  if (!x8.defined() || !w13_8.defined() || !y.defined() || x8.rank() < 1 || w13_8.rank() != 2)
    return InvalidArgument(std::string(op) + ": x8, w13_8 [2F, K] and y must be defined");
  const int64_t k = x8.dim(-1), n = w13_8.dim(0), f = n / 2;
  if (k <= 0 || w13_8.dim(1) != k || n % 2 != 0 || block < 0 || (block > 0 && f % block != 0))
    return InvalidArgument(std::string(op) + ": x8 " + x8.describe() + ", w13_8 " +
                           w13_8.describe() + ", row block " + std::to_string(block));
  const int64_t m = x8.numel() / k;
  if (y.numel() != m * f || y.dim(-1) != f)
    return InvalidArgument(std::string(op) + ": y " + y.describe() + " must hold " +
                           std::to_string(m) + " rows of " + std::to_string(f));
  if (y8.defined() != y_scale.defined())
    return InvalidArgument(std::string(op) + ": y8 and y_scale go together (both or neither)");
  ZI_ASSIGN_OR_RETURN(Tensor h, alloc(y.dtype(), {m, n}));
  ZI_TRY(matmul_fp8_quantized(x8.view({m, k}), x_scale, w13_8, w13_scale, Tensor(), h));
  ZI_TRY(swiglu_in_blocks(h, block, y));
  if (!y8.defined()) return Status::Ok();
  return quantize_rows_of(y.view({m, f}), y8, y_scale);
}

Status Backend::conv2d_add(const Tensor& x, const Tensor& w, const Tensor& bias,
                           const Tensor& residual, const Conv2dParams& p, Tensor& y) {
  if (!residual.defined()) return InvalidArgument("conv2d_add: residual is undefined");
  ZI_TRY(contract::check_same_shape("conv2d_add", "residual", residual, "y", y));
  // Disjoint, or the convolution would overwrite the residual before the sum reads it.
  if (contract::overlaps(residual, y))
    return InvalidArgument("conv2d_add: residual " + contract::desc(residual) + " overlaps y " +
                           contract::desc(y));
  ZI_TRY(conv2d(x, w, bias, p, y));
  return add(residual, y, y);
}

Status Backend::matmul_swiglu(const Tensor& x, const Tensor& w13, int64_t block, Tensor& y) {
  const char* op = "matmul_swiglu";
  if (!x.defined() || !w13.defined() || !y.defined() || x.rank() < 1 || w13.rank() != 2)
    return InvalidArgument(std::string(op) + ": x, w13 [2F, K] and y must be defined");
  const int64_t k = x.dim(-1), n = w13.dim(0), f = n / 2;
  if (k <= 0 || w13.dim(1) != k || n % 2 != 0 || (block < 0 || (block > 0 && f % block != 0)))
    return InvalidArgument(std::string(op) + ": x " + x.describe() + ", w13 " + w13.describe() +
                           ", row block " + std::to_string(block));
  const int64_t m = x.numel() / k;
  if (y.numel() != m * f)
    return InvalidArgument(std::string(op) + ": y " + y.describe() + " must hold " +
                           std::to_string(m) + " rows of " + std::to_string(f));
  ZI_ASSIGN_OR_RETURN(Tensor h, alloc(y.dtype(), {m, n}));
  ZI_TRY(matmul(x.view({m, k}), w13, Tensor(), h));
  return swiglu_in_blocks(h, block, y);
}

Status Backend::swiglu_in_blocks(const Tensor& h, int64_t block, Tensor& y) {
  const int64_t n = h.defined() && h.rank() > 0 ? h.dim(-1) : 0;
  if (n <= 0 || n % 2 != 0 || h.numel() % n != 0 || block < 0 ||
      (block > 0 && (n / 2) % block != 0))
    return InvalidArgument("swiglu in row blocks of " + std::to_string(block) + ": h " +
                           (h.defined() ? h.describe() : "(undefined)") +
                           " must be [M, 2F] with the block dividing F");
  const int64_t m = h.numel() / n, width = block > 0 ? 2 * block : n;
  if (!y.defined() || y.numel() != m * n / 2)
    return InvalidArgument("swiglu in row blocks: y " +
                           (y.defined() ? y.describe() : "(undefined)") + " must hold " +
                           std::to_string(m) + " rows of " + std::to_string(n / 2));
  Tensor out = y.view({m * n / width, width / 2});
  return swiglu(h.view({m * n / width, width}), out);
}

Result<int64_t> Backend::host_copy_elements(const std::vector<Tensor>& parts) {
  if (parts.empty()) return InvalidArgument("host_copy: no parts");
  int64_t n = 0;
  for (const Tensor& t : parts) {
    if (!t.defined() || t.device() != Device::kCPU || t.dtype() != parts[0].dtype())
      return InvalidArgument("host_copy: parts must be host tensors of one dtype, got " +
                             t.describe());
    n += t.numel();
  }
  return n;
}

Result<Tensor> Backend::host_copy(const std::vector<Tensor>& parts, bool pinned) {
  (void)pinned;  // no page-locked memory here
  ZI_ASSIGN_OR_RETURN(const int64_t n, host_copy_elements(parts));
  const DType dt = parts[0].dtype();
  auto st = HostStorage::allocate(static_cast<size_t>(n) * dtype_size(dt));
  if (!st) return OutOfMemory("host copy of " + std::to_string(n) + " elements");
  Tensor out(std::move(st), 0, dt, {n});
  size_t at = 0;
  for (const Tensor& t : parts) {
    std::memcpy(static_cast<char*>(out.data()) + at, t.data(), t.nbytes());
    at += t.nbytes();
  }
  return out;
}

Status Backend::stream_in(int slot, const std::vector<std::pair<Tensor, Tensor>>& copies) {
  if (slot < 0 || slot >= kStreamSlots)
    return InvalidArgument("stream_in: slot " + std::to_string(slot) + " out of range");
  for (const auto& [host, dev] : copies) {
    if (!host.defined() || !dev.defined() || !can_stream(host.dtype(), dev.dtype()) ||
        host.numel() != dev.numel() || host.device() != Device::kCPU)
      return InvalidArgument("stream_in: " + host.describe() + " -> " + dev.describe());
    if (dev.device() != Device::kCPU) return Unsupported(name() + ": stream_in to the device");
    if (host.dtype() == dev.dtype()) {
      std::memcpy(dev.data(), host.data(), host.nbytes());
    } else if (!convert_to_f32(host.dtype(), host.data(), dev.data_as<float>(),
                               static_cast<size_t>(host.numel()))) {
      return Unsupported("stream_in: cannot widen " + host.describe());
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<RecordedWork>> Backend::record(const std::function<Status()>&) {
  return Unsupported(name() + " cannot record work for replay");
}

Status Backend::qkv_split_norm_rope(const Tensor& qkv, const Tensor& norm_q, const Tensor& norm_k,
                                    float eps, const Tensor& freqs, Tensor& q, Tensor& k,
                                    Tensor& v) {
  if (!qkv.defined() || !q.defined() || !k.defined() || !v.defined() || q.rank() != 4 ||
      k.rank() != 4 || v.shape() != k.shape() || qkv.rank() != 2)
    return InvalidArgument("qkv_split_norm_rope: qkv must be [R, F], q/k/v [B, S, H, Dh]");
  const int64_t rows = q.dim(0) * q.dim(1), dh = q.dim(3);
  const int64_t dq = q.dim(2) * dh, dkv = k.dim(2) * dh;
  if (k.dim(0) * k.dim(1) != rows || k.dim(3) != dh || qkv.dim(0) != rows ||
      qkv.dim(1) != dq + 2 * dkv)
    return InvalidArgument("qkv_split_norm_rope: qkv " + qkv.describe() + " does not match q " +
                           q.describe() + " and k " + k.describe());
  if (norm_q.defined() != norm_k.defined())
    return InvalidArgument("qkv_split_norm_rope: give both q and k norm weights or neither");
  const int64_t f = qkv.dim(1);
  ZI_TRY(copy_2d(qkv, 0, f, q, 0, dq, rows, dq));
  ZI_TRY(copy_2d(qkv, dq, f, k, 0, dkv, rows, dkv));
  ZI_TRY(copy_2d(qkv, dq + dkv, f, v, 0, dkv, rows, dkv));
  const Tensor none;
  if (norm_q.defined()) {
    Tensor qr = q.view({rows * q.dim(2), dh});
    Tensor kr = k.view({rows * k.dim(2), dh});
    ZI_TRY(rms_norm(qr, norm_q, eps, none, qr));
    ZI_TRY(rms_norm(kr, norm_k, eps, none, kr));
  }
  if (freqs.defined()) {
    ZI_TRY(rope_interleaved(q, freqs));
    ZI_TRY(rope_interleaved(k, freqs));
  }
  return Status::Ok();
}

namespace {

// The parts of a packed projection qkv[B, S, (Hq + 2·Hkv)·Dh] as new tensors q[B, S, Hq, Dh] and
// k, v[B, S, Hkv, Dh] (allocated, not filled); the checks qk_norm_rope_packed and
// attention_packed share.
Status packed_parts(Backend& be, const char* op, const Tensor& qkv, int64_t hq, int64_t hkv,
                    Tensor& q, Tensor& k, Tensor& v) {
  if (!qkv.defined() || qkv.rank() != 3 || hq <= 0 || hkv <= 0 || hq % hkv != 0 ||
      qkv.dim(2) % (hq + 2 * hkv) != 0)
    return InvalidArgument(std::string(op) + ": qkv must be [B, S, (Hq + 2*Hkv) * Dh] with Hq " +
                           "a multiple of Hkv (qkv " +
                           (qkv.defined() ? qkv.describe() : std::string("undefined")) + ", Hq " +
                           std::to_string(hq) + ", Hkv " + std::to_string(hkv) + ")");
  const int64_t b = qkv.dim(0), s = qkv.dim(1), dh = qkv.dim(2) / (hq + 2 * hkv);
  ZI_ASSIGN_OR_RETURN(q, be.alloc(qkv.dtype(), {b, s, hq, dh}));
  ZI_ASSIGN_OR_RETURN(k, be.alloc(qkv.dtype(), {b, s, hkv, dh}));
  ZI_ASSIGN_OR_RETURN(v, be.alloc(qkv.dtype(), {b, s, hkv, dh}));
  return Status::Ok();
}

}  // namespace

Status Backend::qk_norm_rope_packed(Tensor& qkv, int64_t hq, int64_t hkv, const Tensor& norm_q,
                                    const Tensor& norm_k, float eps, const Tensor& freqs) {
  Tensor q, k, v;
  ZI_TRY(packed_parts(*this, "qk_norm_rope_packed", qkv, hq, hkv, q, k, v));
  const int64_t rows = qkv.dim(0) * qkv.dim(1), f = qkv.dim(2);
  const int64_t dq = hq * q.dim(3), dkv = hkv * q.dim(3);
  const Tensor flat = qkv.view({rows, f});
  ZI_TRY(qkv_split_norm_rope(flat, norm_q, norm_k, eps, freqs, q, k, v));
  ZI_TRY(copy_2d(q, 0, dq, qkv, 0, f, rows, dq));
  return copy_2d(k, 0, dkv, qkv, dq, f, rows, dkv);
}

Status Backend::attention_packed(const Tensor& qkv, int64_t hq, int64_t hkv,
                                 const AttentionParams& p, Tensor& out) {
  Tensor q, k, v;
  ZI_TRY(packed_parts(*this, "attention_packed", qkv, hq, hkv, q, k, v));
  const int64_t rows = qkv.dim(0) * qkv.dim(1), f = qkv.dim(2);
  const int64_t dq = hq * q.dim(3), dkv = hkv * q.dim(3);
  ZI_TRY(copy_2d(qkv, 0, f, q, 0, dq, rows, dq));
  ZI_TRY(copy_2d(qkv, dq, f, k, 0, dkv, rows, dkv));
  ZI_TRY(copy_2d(qkv, dq + dkv, f, v, 0, dkv, rows, dkv));
  return attention(q, k, v, p, out);
}

Status Backend::attention_packed_fp8(const Tensor&, int64_t, int64_t, const Tensor&, const Tensor&,
                                     float, const Tensor&, const AttentionParams&, Tensor&) {
  return Unsupported("attention_packed_fp8 is not implemented on the " + name() + " backend");
}

Status Backend::fp8_attention_support() const {
  return Unsupported("FP8 attention is not implemented on the " + name() + " backend");
}

Status Backend::matmul_qkv_norm_rope(const Tensor& x, const Tensor& wqkv, const Tensor& norm_q,
                                     const Tensor& norm_k, float eps, const Tensor& freqs,
                                     Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) {
  if (!x.defined() || !wqkv.defined() || x.rank() < 1 || wqkv.rank() != 2 || x.dim(-1) <= 0)
    return InvalidArgument("matmul_qkv_norm_rope: x [rows, K] and wqkv [N, K] must be defined");
  const int64_t rows = x.numel() / x.dim(-1), n = wqkv.dim(0);
  Tensor t = qkv;
  if (!t.defined()) {
    ZI_ASSIGN_OR_RETURN(t, alloc(act_dtype(), {rows, n}));
  }
  ZI_TRY(matmul(x.view({rows, x.dim(-1)}), wqkv, Tensor(), t));
  return qkv_split_norm_rope(t, norm_q, norm_k, eps, freqs, q, k, v);
}

Status Backend::dit_modulation(const Tensor& mod, Tensor& scale_a, Tensor& gate_a, Tensor& scale_f,
                               Tensor& gate_f) {
  if (!mod.defined() || mod.rank() != 2 || mod.dim(1) % 4 != 0)
    return InvalidArgument("dit_modulation: mod must be [B, 4D]");
  const int64_t b = mod.dim(0), d = mod.dim(1) / 4;
  for (Tensor* t : {&scale_a, &gate_a, &scale_f, &gate_f})
    if (!t->defined() || t->shape() != Shape{b, d} || t->dtype() != mod.dtype())
      return InvalidArgument("dit_modulation: outputs must be " + shape_string({b, d}) + " " +
                             dtype_name(mod.dtype()));
  ZI_ASSIGN_OR_RETURN(Tensor ones, alloc(mod.dtype(), {d}));
  ZI_TRY(fill(ones, 1.0f));
  ZI_TRY(copy_2d(mod, 0 * d, 4 * d, scale_a, 0, d, b, d));
  ZI_TRY(copy_2d(mod, 1 * d, 4 * d, gate_a, 0, d, b, d));
  ZI_TRY(copy_2d(mod, 2 * d, 4 * d, scale_f, 0, d, b, d));
  ZI_TRY(copy_2d(mod, 3 * d, 4 * d, gate_f, 0, d, b, d));
  ZI_TRY(add(scale_a, ones, scale_a));
  ZI_TRY(add(scale_f, ones, scale_f));
  ZI_TRY(tanh(gate_a, gate_a));
  return tanh(gate_f, gate_f);
}

Status Backend::matmul_dit_modulation(const Tensor& c, const Tensor& w, const Tensor& bias,
                                      Tensor& mod, Tensor& scale_a, Tensor& gate_a, Tensor& scale_f,
                                      Tensor& gate_f) {
  ZI_TRY(matmul(c, w, bias, mod));
  return dit_modulation(mod, scale_a, gate_a, scale_f, gate_f);
}

std::array<Tensor, 4> dit_modulation_of(const Tensor& out, int64_t layer) {
  const Tensor l = out.slice0(layer, layer + 1).view({4, out.dim(2), out.dim(3)});
  std::array<Tensor, 4> m;
  for (int64_t q = 0; q < 4; ++q) m[q] = l.slice0(q, q + 1).view({out.dim(2), out.dim(3)});
  return m;
}

Status check_dit_modulation_layers(const char* op, const Tensor& c, const std::vector<Tensor>& w,
                                   const std::vector<Tensor>& bias, const Tensor& out) {
  const std::string o = op;
  if (!c.defined() || c.rank() != 2)
    return InvalidArgument(o + ": c must be [B, K], got " +
                           (c.defined() ? c.describe() : std::string("undefined")));
  if (w.empty() || bias.size() != w.size())
    return InvalidArgument(o + ": " + std::to_string(w.size()) + " weights and " +
                           std::to_string(bias.size()) + " biases (one of each per block)");
  const int64_t b = c.dim(0), k = c.dim(1), l = static_cast<int64_t>(w.size());
  if (!w[0].defined() || w[0].rank() != 2 || w[0].dim(0) % 4 != 0 || w[0].dim(1) != k)
    return InvalidArgument(o + ": w[0] must be [4D, " + std::to_string(k) + "], got " +
                           (w[0].defined() ? w[0].describe() : std::string("undefined")));
  const int64_t d = w[0].dim(0) / 4;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!w[i].defined() || w[i].shape() != w[0].shape())
      return InvalidArgument(o + ": w[" + std::to_string(i) + "] must be " +
                             shape_string(w[0].shape()));
    if (bias[i].defined() && bias[i].shape() != Shape{4 * d})
      return InvalidArgument(o + ": bias[" + std::to_string(i) + "] must be " +
                             shape_string({4 * d}));
  }
  if (!out.defined() || out.shape() != Shape{l, 4, b, d} || out.dtype() != c.dtype())
    return InvalidArgument(o + ": out must be " + dtype_name(c.dtype()) + " " +
                           shape_string({l, 4, b, d}) + ", got " +
                           (out.defined() ? out.describe() : std::string("undefined")));
  return Status::Ok();
}

Status Backend::dit_modulation_layers(const Tensor& c, const std::vector<Tensor>& w,
                                      const std::vector<Tensor>& bias, Tensor& out) {
  ZI_TRY(check_dit_modulation_layers("dit_modulation_layers", c, w, bias, out));
  ZI_ASSIGN_OR_RETURN(Tensor mod, alloc(c.dtype(), {c.dim(0), w[0].dim(0)}));
  for (size_t l = 0; l < w.size(); ++l) {
    std::array<Tensor, 4> m = dit_modulation_of(out, static_cast<int64_t>(l));
    ZI_TRY(matmul_dit_modulation(c, w[l], bias[l], mod, m[0], m[1], m[2], m[3]));
  }
  return Status::Ok();
}

#ifndef ZIMAGE_WITH_CUDA
Result<std::unique_ptr<Backend>> make_cuda_backend(int, DType) {
  return Unsupported("this zimage was built without CUDA (configure with nvcc on PATH)");
}
int cuda_visible_devices() {
  return 0;
}
Result<std::pair<uint64_t, uint64_t>> cuda_device_memory() {
  return Unsupported("this zimage was built without CUDA");
}
#endif

}  // namespace zimage
