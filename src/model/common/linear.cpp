#include "model/common/linear.h"

#include <algorithm>
#include <string>
#include <utility>

namespace zimage {

namespace {

Status linear_base(Backend& be, const Tensor& x, const LinearWeight& w, const Tensor& bias,
                   const Tensor& scratch, Tensor& y) {
  if (!w.quantized()) return be.matmul(x, w.w, bias, y);
  if (w.fp8_compute) return be.matmul_fp8_rows(x, w.w, w.scale, bias, y);
  const int64_t n = w.rows(), k = w.cols();
  if (!scratch.defined() || scratch.numel() < n * k || scratch.dtype() != be.act_dtype())
    return InternalError("linear: quantised weight " + w.w.describe() + " needs a scratch of " +
                         std::to_string(n * k) + " elements, got " + scratch.describe());
  Tensor wide(scratch.storage(), scratch.byte_offset(), scratch.dtype(), {n, k});
  if (w.packed())
    ZI_TRY(be.dequantize_packed(w.ggml_type, w.w, wide));
  else
    ZI_TRY(be.dequantize_fp8_rows(w.w, w.scale, wide));
  return be.matmul(x, wide, bias, y);
}

}  // namespace

Status linear(Backend& be, const Tensor& x, const LinearWeight& w, const Tensor& bias,
              const Tensor& scratch, Tensor& y) {
  ZI_TRY(linear_base(be, x, w, bias, scratch, y));
  if (w.lora) return apply_lora_side(be, x, *w.lora, y);  // runtime LoRA (lora_runtime.h)
  return Status::Ok();
}

bool takes_fp8_input(const Backend& be, const LinearWeight& w) {
  return be.takes_fp8_inputs() && w.fp8_compute && !w.lora && !w.packed();
}

Status linear_fp8_input(Backend& be, const Tensor& x8, const Tensor& x_scale, const LinearWeight& w,
                        const Tensor& bias, Tensor& y) {
  if (!takes_fp8_input(be, w))
    return InternalError("linear: " + w.w.describe() + " does not take FP8 input rows");
  return be.matmul_fp8_quantized(x8, x_scale, w.w, w.scale, bias, y);
}

Status linear_swiglu(Backend& be, const Tensor& x, const LinearWeight& w13, const Tensor& scratch,
                     const Tensor& wide, Tensor& y) {
  if (w13.swiglu_block > 0 && !w13.quantized()) {
    if (w13.lora) return InternalError("feed-forward w1|w3 in row blocks with a LoRA side");
    return be.matmul_swiglu(x, w13.w, w13.swiglu_block, y);
  }
  const int64_t k = x.dim(-1), n = w13.rows();
  const int64_t m = k > 0 ? x.numel() / k : 0;
  Tensor h = wide;
  if (!h.defined()) {
    auto t = be.alloc(be.act_dtype(), {m, n});
    if (!t.ok()) return t.status().with_context("feed-forward [" + std::to_string(m) + ", 2F]");
    h = std::move(t).value();
  }
  ZI_TRY(linear(be, x.view({m, k}), w13, Tensor(), scratch, h));
  // (A W8A8 weight in row blocks, made for matmul_fp8_swiglu, lands here in that order.)
  return be.swiglu_in_blocks(h, w13.swiglu_block, y);
}

Status linear_qkv_norm_rope(Backend& be, const Tensor& x, const LinearWeight& wqkv,
                            const Tensor& norm_q, const Tensor& norm_k, float eps,
                            const Tensor& freqs, const Tensor& scratch, Tensor& qkv, Tensor& q,
                            Tensor& k, Tensor& v) {
  if (!wqkv.quantized() && !wqkv.lora && wqkv.w.dtype() == be.act_dtype())
    return be.matmul_qkv_norm_rope(x, wqkv.w, norm_q, norm_k, eps, freqs, qkv, q, k, v);
  ZI_TRY(linear(be, x, wqkv, Tensor(), scratch, qkv));
  return be.qkv_split_norm_rope(qkv, norm_q, norm_k, eps, freqs, q, k, v);
}

Status set_swiglu_block(Backend& be, LinearWeight& w, int64_t block) {
  if (w.swiglu_block == block) return Status::Ok();
  const int64_t n = w.rows(), k = w.cols(), f = n / 2;
  // A W8A8 weight moves with its row scales; any other quantised form stays in the files' order.
  const bool fp8 = w.fp8_compute && w.fp8() && !w.packed();
  if ((w.quantized() && !fp8) || w.lora || !w.w.defined() || w.w.rank() != 2 || n % 2 != 0 ||
      block < 0 || (block > 0 && f % block != 0) || (fp8 && w.scale.numel() != n))
    return InvalidArgument("w1|w3 weight " + (w.w.defined() ? w.w.describe() : "(none)") +
                           " cannot be put in row blocks of " + std::to_string(block));
  if (w.swiglu_block > 0 && block > 0) ZI_TRY(set_swiglu_block(be, w, 0));  // via gate-first
  const int64_t b = block > 0 ? block : w.swiglu_block;
  // Gate-first half p, row block t (B rows of `cols`) <-> blocked rows [2tB + pB, 2tB + pB + B).
  auto reorder = [&](Tensor& t, int64_t cols) -> Status {
    auto tmp = be.alloc(t.dtype(), t.shape());
    if (!tmp.ok()) return tmp.status().with_context("reordering a w1|w3 weight");
    Tensor src = std::move(tmp).value();
    Tensor flat = t.view({n, cols});
    ZI_TRY(be.copy_2d(flat, 0, cols, src, 0, cols, n, cols));
    const int64_t chunk = b * cols;
    for (int64_t p = 0; p < 2; ++p) {
      if (block > 0) {
        ZI_TRY(be.copy_2d(src, p * f * cols, chunk, flat, p * chunk, 2 * chunk, f / b, chunk));
      } else {
        ZI_TRY(be.copy_2d(src, p * chunk, 2 * chunk, flat, p * f * cols, chunk, f / b, chunk));
      }
    }
    return Status::Ok();
  };
  ZI_TRY(reorder(w.w, k));
  if (fp8) ZI_TRY(reorder(w.scale, 1));
  w.swiglu_block = block;
  return Status::Ok();
}

Status apply_lora_side(Backend& be, const Tensor& x, const LoraSide& side, Tensor& y) {
  const int64_t r = side.a.dim(0), k = side.a.dim(1), n = side.b.dim(0);
  if (side.b.dim(1) != r || x.dim(-1) != k || y.dim(-1) != n)
    return InternalError("LoRA side GEMM: a " + side.a.describe() + ", b " + side.b.describe() +
                         " do not fit x " + x.describe() + " -> y " + y.describe());
  const int64_t m = x.numel() / k;
  const DType act = be.act_dtype();
  auto t = be.alloc(act, {m, r});
  if (!t.ok()) return t.status().with_context("LoRA side GEMM [" + std::to_string(m) + ", r]");
  auto prod = be.alloc(act, {m, n});
  if (!prod.ok()) return prod.status().with_context("LoRA side GEMM output");
  ZI_TRY(be.matmul(x.view({m, k}), side.a, Tensor(), *t));  // [M, R]
  ZI_TRY(be.matmul(*t, side.b, Tensor(), *prod));           // [M, N]
  Tensor yv = y.view({m, n});
  return be.axpby(1.0f, yv, 1.0f, *prod, yv);
}

Result<unsigned> parse_fp8_layers(const std::string& list) {
  if (list == "all") return static_cast<unsigned>(kFp8Default);
  if (list == "none") return 0u;
  unsigned bits = 0;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, comma - pos);
    if (name == "qkv")
      bits |= kFp8Qkv;
    else if (name == "out")
      bits |= kFp8Out;
    else if (name == "w13")
      bits |= kFp8W13;
    else if (name == "w2")
      bits |= kFp8W2;
    else if (name == "ffn")
      bits |= kFp8W13 | kFp8W2;
    else if (name == "attn")
      bits |= kFp8Qkv | kFp8Out;
    else if (name == "refiners")
      bits |= kFp8Refiners;
    else if (name == "sdpa")
      bits |= kFp8Sdpa;
    else if (name == "all")
      bits |= kFp8Default;
    else
      return InvalidArgument("fp8 layers: '" + name + "' in '" + list +
                             "' is not one of qkv, out, w13, w2, ffn, attn, refiners, sdpa, all "
                             "(or none alone)");
    pos = comma + 1;
  }
  return bits;
}

std::string fp8_layers_string(unsigned layers) {
  std::string s;
  const std::pair<unsigned, const char*> names[] = {{kFp8Qkv, "qkv"},           {kFp8Out, "out"},
                                                    {kFp8W13, "w13"},           {kFp8W2, "w2"},
                                                    {kFp8Refiners, "refiners"}, {kFp8Sdpa, "sdpa"}};
  for (const auto& [bit, name] : names) {
    if (!(layers & bit)) continue;
    if (!s.empty()) s += ",";
    s += name;
  }
  return s.empty() ? "none" : s;
}

Status to_fp8_rows(Backend& be, LinearWeight& w, const std::string& what) {
  if (w.quantized() || !w.defined()) return Status::Ok();
  auto w8 = be.alloc(DType::kF8E4M3, w.w.shape());
  if (!w8.ok()) return w8.status().with_context("allocating FP8 " + what);
  auto sc = be.alloc(DType::kF32, {w.rows()});
  if (!sc.ok()) return sc.status().with_context("allocating FP8 scales of " + what);
  Status st = be.quantize_fp8_rows(w.w, *w8, *sc);
  if (!st.ok()) return st.with_context("quantising " + what + " to FP8");
  w.w = std::move(w8).value();
  w.scale = std::move(sc).value();
  return Status::Ok();
}

Status to_fp8_compute(Backend& be, LinearWeight& w, const std::string& what) {
  if (!w.defined()) return Status::Ok();
  if (w.fp8() && !w.packed() && w.w.dtype() == DType::kF8E4M3) {
    w.fp8_compute = true;
    return Status::Ok();
  }
  if (w.quantized()) {  // widen what the file stored, then quantise it per row below
    auto wide = be.alloc(be.act_dtype(), {w.rows(), w.cols()});
    if (!wide.ok()) return wide.status().with_context("widening " + what);
    Status st = w.packed() ? be.dequantize_packed(w.ggml_type, w.w, *wide)
                           : be.dequantize_fp8_rows(w.w, w.scale, *wide);
    if (!st.ok()) return st.with_context("widening " + what);
    w = LinearWeight();
    w.w = std::move(wide).value();
  }
  ZI_TRY(to_fp8_rows(be, w, what));
  w.fp8_compute = true;
  return Status::Ok();
}

Status move_to_host(Backend& be, const std::vector<Tensor*>& tensors, bool pinned) {
  for (Tensor* t : tensors) {
    if (t == nullptr || !t->defined() || t->device() == Device::kCPU) continue;
    Result<Tensor> host = OutOfMemory("host copy of " + t->describe());
    if (pinned) {
      host = be.alloc_pinned(t->dtype(), t->shape());
    } else {
      Tensor h = Tensor::host_for_overwrite(t->dtype(), t->shape());
      if (h.defined()) host = std::move(h);
    }
    if (!host.ok()) return host.status().with_context("host copy of " + t->describe());
    ZI_TRY(be.download(*t, *host));
    *t = std::move(host).value();
  }
  return Status::Ok();
}

}  // namespace zimage
