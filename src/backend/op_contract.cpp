// The shared op contracts (see op_contract.h). Each check reads the arguments in the op's order
// and names the op and the offending tensor: "rms_norm: w f32[7] must be [8] for x f32[4, 8]".
#include "backend/op_contract.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

namespace zimage::contract {

std::string desc(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return std::string(dtype_name(t.dtype())) + shape_string(t.shape());
}

namespace {

std::string prefix(const char* op, const char* name, const Tensor& t) {
  return std::string(op) + ": " + name + " " + desc(t);
}

}  // namespace

Status check_host(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) return InvalidArgument(std::string(op) + ": " + name + " is undefined");
  if (t.device() != Device::kCPU) {
    return InvalidArgument(prefix(op, name, t) + " is on " + device_name(t.device()) +
                           ", expected cpu");
  }
  if (t.numel() < 0) return InvalidArgument(prefix(op, name, t) + " has an invalid shape");
  const size_t end = t.byte_offset() + t.nbytes();
  if (end < t.byte_offset() || end > t.storage()->bytes() || t.storage()->data() == nullptr) {
    return InvalidArgument(prefix(op, name, t) + " exceeds its storage (" +
                           std::to_string(t.storage()->bytes()) + " bytes)");
  }
  return Status::Ok();
}

namespace {

// A required tensor: defined and placed where the backend can use it.
Status tensor(const OpEnv& env, const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) return InvalidArgument(std::string(op) + ": " + name + " is undefined");
  return env.placed(op, name, t);
}

Status has_dtype(const OpEnv& env, const char* op, const char* name, const Tensor& t, DType want) {
  if (t.dtype() != want) {
    return InvalidArgument(prefix(op, name, t) + ": dtype must be " + dtype_name(want) +
                           " on the " + device_name(env.device) + " backend");
  }
  return Status::Ok();
}

// A required tensor in the compute dtype / in f32 whatever the compute dtype.
Status act_tensor(const OpEnv& env, const char* op, const char* name, const Tensor& t) {
  ZI_TRY(tensor(env, op, name, t));
  return has_dtype(env, op, name, t, env.act);
}
Status f32_tensor(const OpEnv& env, const char* op, const char* name, const Tensor& t) {
  ZI_TRY(tensor(env, op, name, t));
  return has_dtype(env, op, name, t, DType::kF32);
}

// A required tensor of any dtype the backend computes in.
Status float_tensor(const OpEnv& env, const char* op, const char* name, const Tensor& t) {
  ZI_TRY(tensor(env, op, name, t));
  return env.computes(op, name, t);
}

// A required tensor of a float dtype every backend reads (axpby and the reductions).
Status any_float_tensor(const OpEnv& env, const char* op, const char* name, const Tensor& t) {
  ZI_TRY(tensor(env, op, name, t));
  return env.any_float(op, name, t);
}

// A required tensor of ref's dtype.
Status like(const OpEnv& env, const char* op, const char* name, const Tensor& t,
            const char* ref_name, const Tensor& ref) {
  ZI_TRY(tensor(env, op, name, t));
  if (t.dtype() != ref.dtype()) {
    return InvalidArgument(prefix(op, name, t) + ": dtype must be " + dtype_name(ref.dtype()) +
                           " like " + ref_name);
  }
  return Status::Ok();
}

// x read as rows over its last dimension.
Result<RowNorm> row_view(const OpEnv& env, const char* op, const char* name, const Tensor& x) {
  ZI_TRY(act_tensor(env, op, name, x));
  if (x.rank() < 1 || x.dim(-1) <= 0) {
    return InvalidArgument(prefix(op, name, x) +
                           " must have rank >= 1 and a non-empty last dimension");
  }
  return RowNorm{x.numel() / x.dim(-1), x.dim(-1), 0};
}

// An optional per-feature vector [d] (norm weight / bias / affine) in the compute dtype.
Status check_vector(const OpEnv& env, const char* op, const char* name, const Tensor& t, int64_t d,
                    const char* x_name, const Tensor& x) {
  if (!t.defined()) return Status::Ok();
  ZI_TRY(act_tensor(env, op, name, t));
  if (t.rank() != 1 || t.dim(0) != d) {
    return InvalidArgument(prefix(op, name, t) + " must be [" + std::to_string(d) + "] for " +
                           x_name + " " + desc(x));
  }
  return Status::Ok();
}

// An optional per-group modulation [B, D]: the rows split evenly into B groups. Sets the rows per
// group (left 0 when the tensor is undefined).
Status check_modulation(const OpEnv& env, const char* op, const char* name, const Tensor& t,
                        RowNorm& rows, const Tensor& x) {
  if (!t.defined()) return Status::Ok();
  ZI_TRY(act_tensor(env, op, name, t));
  if (t.rank() != 2 || t.dim(1) != rows.d || t.dim(0) <= 0 || rows.rows % t.dim(0) != 0) {
    return InvalidArgument(prefix(op, name, t) + " must be [B, " + std::to_string(rows.d) +
                           "] with B dividing the " + std::to_string(rows.rows) + " rows of x " +
                           desc(x));
  }
  rows.group = rows.rows / t.dim(0);
  return Status::Ok();
}

}  // namespace

Status check_rank(const char* op, const char* name, const Tensor& t, int rank) {
  if (t.rank() != rank) {
    return InvalidArgument(prefix(op, name, t) + " must have rank " + std::to_string(rank));
  }
  return Status::Ok();
}

Status check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                        const Tensor& b) {
  if (a.shape() != b.shape()) {
    return InvalidArgument(prefix(op, a_name, a) + " and " + b_name + " " + desc(b) +
                           ": shapes differ");
  }
  return Status::Ok();
}

namespace {

// A required rank-4 x in the compute dtype: an NHWC image or [B, S, H, Dh] heads.
Status act_rank4(const OpEnv& env, const char* op, const Tensor& x) {
  ZI_TRY(act_tensor(env, op, "x", x));
  return check_rank(op, "x", x, 4);
}

}  // namespace

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* a0 = static_cast<const char*>(a.data());
  const char* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

bool same_data(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.data() == b.data() && a.nbytes() == b.nbytes();
}

Status check_alias(const char* op, const char* in_name, const Tensor& in, const char* out_name,
                   const Tensor& out, bool in_place_ok) {
  if (!overlaps(in, out)) return Status::Ok();
  if (in_place_ok && same_data(in, out)) return Status::Ok();
  return InvalidArgument(prefix(op, out_name, out) + " overlaps " + in_name + " " + desc(in) +
                         (in_place_ok ? " without being the same memory" : " (not allowed)"));
}

// ---- normalisation ----

namespace {

// A row norm's x [.., D] and y of x's shape, both in the compute dtype; the output (y, or x for
// the residual norm, `x_is_output`) is the input's memory exactly (in place) or disjoint from it.
Result<RowNorm> row_norm_io(const OpEnv& env, const char* op, const Tensor& x, const Tensor& y,
                            bool x_is_output) {
  ZI_ASSIGN_OR_RETURN(RowNorm rows, row_view(env, op, "x", x));
  ZI_TRY(act_tensor(env, op, "y", y));
  ZI_TRY(check_same_shape(op, "x", x, "y", y));
  if (x_is_output) {
    ZI_TRY(check_alias(op, "y", y, "x", x, true));
  } else {
    ZI_TRY(check_alias(op, "x", x, "y", y, true));
  }
  return rows;
}

}  // namespace

Result<RowNorm> rms_norm(const OpEnv& env, const Tensor& x, const Tensor& w, const Tensor& scale,
                         const Tensor& y) {
  const char* op = "rms_norm";
  ZI_ASSIGN_OR_RETURN(RowNorm rows, row_norm_io(env, op, x, y, false));
  ZI_TRY(check_vector(env, op, "w", w, rows.d, "x", x));
  ZI_TRY(check_modulation(env, op, "scale", scale, rows, x));
  return rows;
}

Result<RowNorm> layer_norm(const OpEnv& env, const Tensor& x, const Tensor& w, const Tensor& b,
                           const Tensor& scale, const Tensor& y) {
  const char* op = "layer_norm";
  ZI_ASSIGN_OR_RETURN(RowNorm rows, row_norm_io(env, op, x, y, false));
  ZI_TRY(check_vector(env, op, "w", w, rows.d, "x", x));
  ZI_TRY(check_vector(env, op, "b", b, rows.d, "x", x));
  ZI_TRY(check_modulation(env, op, "scale", scale, rows, x));
  return rows;
}

// x += gate ⊙ rms_norm(y): y is read, x written (y may be x).
Result<RowNorm> residual_rms_norm_gate(const OpEnv& env, const Tensor& x, const Tensor& y,
                                       const Tensor& w, const Tensor& gate) {
  const char* op = "residual_rms_norm_gate";
  ZI_ASSIGN_OR_RETURN(RowNorm rows, row_norm_io(env, op, x, y, true));
  ZI_TRY(check_vector(env, op, "w", w, rows.d, "x", x));
  ZI_TRY(check_modulation(env, op, "gate", gate, rows, x));
  return rows;
}

Status group_norm(const OpEnv& env, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  int groups, const Tensor& y) {
  const char* op = "group_norm";
  ZI_TRY(act_rank4(env, op, x));
  ZI_TRY(act_tensor(env, op, "y", y));
  ZI_TRY(check_same_shape(op, "x", x, "y", y));
  ZI_TRY(check_alias(op, "x", x, "y", y, true));
  const int64_t c = x.dim(3);
  if (groups <= 0 || c % groups != 0) {
    return InvalidArgument(prefix(op, "x", x) + ": " + std::to_string(groups) +
                           " groups do not divide " + std::to_string(c) + " channels");
  }
  ZI_TRY(check_vector(env, op, "gamma", gamma, c, "x", x));
  return check_vector(env, op, "beta", beta, c, "x", x);
}

// ---- position encodings ----

Status rope_half(const OpEnv& env, const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const char* op = "rope_half";
  ZI_TRY(act_rank4(env, op, x));
  ZI_TRY(f32_tensor(env, op, "cos", cos));
  ZI_TRY(f32_tensor(env, op, "sin", sin));
  const int64_t s = x.dim(1), dh = x.dim(3);
  if (dh % 2 != 0) return InvalidArgument(prefix(op, "x", x) + ": head dim must be even");
  const Shape want{s, dh};
  if (cos.shape() != want || sin.shape() != want) {
    return InvalidArgument(prefix(op, "cos", cos) + " and sin " + desc(sin) + " must be " +
                           shape_string(want) + " for x " + desc(x));
  }
  ZI_TRY(check_alias(op, "cos", cos, "x", x, false));
  return check_alias(op, "sin", sin, "x", x, false);
}

Status rope_interleaved(const OpEnv& env, const Tensor& x, const Tensor& freqs) {
  const char* op = "rope_interleaved";
  ZI_TRY(act_rank4(env, op, x));
  ZI_TRY(f32_tensor(env, op, "freqs", freqs));
  const int64_t b = x.dim(0), s = x.dim(1), dh = x.dim(3);
  if (dh % 2 != 0) return InvalidArgument(prefix(op, "x", x) + ": head dim must be even");
  // A leading 1 shares the table over the batch.
  if (freqs.rank() != 4 || (freqs.dim(0) != b && freqs.dim(0) != 1) || freqs.dim(1) != s ||
      freqs.dim(2) != dh / 2 || freqs.dim(3) != 2) {
    return InvalidArgument(prefix(op, "freqs", freqs) + " must be [" + std::to_string(b) + ", " +
                           std::to_string(s) + ", " + std::to_string(dh / 2) + ", 2] for x " +
                           desc(x));
  }
  return check_alias(op, "freqs", freqs, "x", x, false);
}

// ---- elementwise ----

Status unary(const OpEnv& env, const char* op, const Tensor& x, const Tensor& y) {
  ZI_TRY(float_tensor(env, op, "x", x));
  ZI_TRY(like(env, op, "y", y, "x", x));
  ZI_TRY(check_same_shape(op, "x", x, "y", y));
  return check_alias(op, "x", x, "y", y, true);
}

Status clamp(const OpEnv& env, const Tensor& x, float lo, float hi, const Tensor& y) {
  if (!(lo <= hi)) return InvalidArgument("clamp: lo must not exceed hi");
  return unary(env, "clamp", x, y);
}

Status swiglu(const OpEnv& env, const Tensor& x, const Tensor& y) {
  const char* op = "swiglu";
  ZI_TRY(float_tensor(env, op, "x", x));
  ZI_TRY(like(env, op, "y", y, "x", x));
  if (x.rank() < 1 || x.dim(-1) % 2 != 0) {
    return InvalidArgument(prefix(op, "x", x) + " must have an even last dimension [gate | up]");
  }
  // y holds x's rows, in any leading shape of x's rank.
  Shape want = x.shape();
  want.back() /= 2;
  if (y.rank() != x.rank() || y.dim(-1) != want.back() || y.numel() != shape_numel(want)) {
    return InvalidArgument(prefix(op, "y", y) + " must be " + shape_string(want) + " for x " +
                           desc(x));
  }
  if (overlaps(x, y) && x.data() != y.data()) {
    return InvalidArgument(prefix(op, "y", y) + " overlaps x " + desc(x) +
                           " without starting at the same address");
  }
  return Status::Ok();
}

Status axpby(const OpEnv& env, const Tensor& x, const Tensor& y, const Tensor& out) {
  const char* op = "axpby";
  ZI_TRY(any_float_tensor(env, op, "x", x));
  ZI_TRY(tensor(env, op, "y", y));
  ZI_TRY(tensor(env, op, "out", out));
  if (x.dtype() != y.dtype() || x.dtype() != out.dtype()) {
    return InvalidArgument(prefix(op, "x", x) + ", y " + desc(y) + " and out " + desc(out) +
                           ": dtypes differ");
  }
  if (y.numel() != x.numel() || out.numel() != x.numel()) {
    return InvalidArgument(prefix(op, "x", x) + ", y " + desc(y) + " and out " + desc(out) +
                           ": sizes differ");
  }
  ZI_TRY(check_alias(op, "x", x, "out", out, true));
  return check_alias(op, "y", y, "out", out, true);
}

Status add(const OpEnv& env, const Tensor& x, const Tensor& y, const Tensor& out) {
  const char* op = "add";
  ZI_TRY(float_tensor(env, op, "x", x));
  ZI_TRY(like(env, op, "y", y, "x", x));
  ZI_TRY(like(env, op, "out", out, "x", x));
  ZI_TRY(check_same_shape(op, "x", x, "out", out));
  const int64_t n = x.numel(), yn = y.numel();
  if (yn <= 0 ? n != 0 : n % yn != 0) {
    return InvalidArgument(prefix(op, "y", y) + " does not broadcast over x " + desc(x) +
                           " (its element count must divide x's)");
  }
  ZI_TRY(check_alias(op, "x", x, "out", out, true));
  return check_alias(op, "y", y, "out", out, true);
}

Status guided_euler_step(const OpEnv& env, const Tensor& pos, const Tensor& neg,
                         const Tensor& latents) {
  const char* op = "guided_euler_step";
  ZI_TRY(f32_tensor(env, op, "pos", pos));
  if (neg.defined()) ZI_TRY(f32_tensor(env, op, "neg", neg));
  ZI_TRY(f32_tensor(env, op, "latents", latents));
  for (const auto& [name, t] :
       {std::pair<const char*, const Tensor*>{"pos", &pos}, {"neg", &neg}}) {
    if (t->defined() && t->numel() != latents.numel()) {
      return InvalidArgument(std::string(op) + ": sizes differ: " + name + " " + desc(*t) +
                             ", latents " + desc(latents));
    }
  }
  return Status::Ok();
}

Status latent_to_rgb(const OpEnv& env, const Tensor& latents, int channels, const Tensor& rgb) {
  const char* op = "latent_to_rgb";
  ZI_TRY(f32_tensor(env, op, "latents", latents));
  ZI_TRY(tensor(env, op, "rgb", rgb));
  ZI_TRY(has_dtype(env, op, "rgb", rgb, DType::kU8));
  if (channels < 1 || channels > 16) {
    return InvalidArgument(std::string(op) + ": map.channels " + std::to_string(channels) +
                           " is outside 1..16");
  }
  if (latents.rank() != 4 || latents.dim(1) != channels) {
    return InvalidArgument(prefix(op, "latents", latents) + " must be [n, " +
                           std::to_string(channels) + ", h, w]");
  }
  if (rgb.rank() != 4 || rgb.dim(0) != latents.dim(0) || rgb.dim(1) != latents.dim(2) ||
      rgb.dim(2) != latents.dim(3) || rgb.dim(3) != 3) {
    return InvalidArgument(prefix(op, "rgb", rgb) + " must be [n, h, w, 3] for latents " +
                           desc(latents));
  }
  return Status::Ok();
}

Status sum_squares(const OpEnv& env, const Tensor& x) {
  ZI_TRY(any_float_tensor(env, "sum_squares", "x", x));
  if (x.rank() < 1) return InvalidArgument(prefix("sum_squares", "x", x) + " must have rank >= 1");
  return Status::Ok();
}

Status count_nonfinite(const OpEnv& env, const Tensor& x) {
  return any_float_tensor(env, "count_nonfinite", "x", x);
}

Status image_to_rgb8(const OpEnv& env, const Tensor& x, const Tensor& rgb) {
  const char* op = "image_to_rgb8";
  ZI_TRY(any_float_tensor(env, op, "x", x));
  ZI_TRY(tensor(env, op, "rgb", rgb));
  ZI_TRY(has_dtype(env, op, "rgb", rgb, DType::kU8));
  ZI_TRY(check_same_shape(op, "x", x, "rgb", rgb));
  return check_alias(op, "x", x, "rgb", rgb, false);
}

// ---- attention ----

Status attention(const OpEnv& env, const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionParams& p, const Tensor& out) {
  const char* op = "attention";
  ZI_TRY(float_tensor(env, op, "q", q));
  ZI_TRY(like(env, op, "k", k, "q", q));
  ZI_TRY(like(env, op, "v", v, "q", q));
  ZI_TRY(like(env, op, "out", out, "q", q));
  ZI_TRY(check_rank(op, "q", q, 4));
  ZI_TRY(check_rank(op, "k", k, 4));
  ZI_TRY(check_same_shape(op, "k", k, "v", v));
  ZI_TRY(check_same_shape(op, "q", q, "out", out));
  const int64_t b = q.dim(0), hq = q.dim(2), d = q.dim(3);
  const int64_t sk = k.dim(1), hkv = k.dim(2);
  if (k.dim(0) != b || k.dim(3) != d) {
    return InvalidArgument(prefix(op, "q", q) + " and k " + desc(k) +
                           ": batch or head dim differs");
  }
  if (hkv <= 0 || hq % hkv != 0) {
    return InvalidArgument(prefix(op, "q", q) + " and k " + desc(k) + ": " + std::to_string(hq) +
                           " query heads are not a multiple of " + std::to_string(hkv) +
                           " kv heads");
  }
  if (!p.key_len.empty()) {
    if (static_cast<int64_t>(p.key_len.size()) != b) {
      return InvalidArgument("attention: key_len has " + std::to_string(p.key_len.size()) +
                             " entries for batch " + std::to_string(b) + " of q " + desc(q));
    }
    for (size_t i = 0; i < p.key_len.size(); ++i) {
      if (p.key_len[i] < 0 || p.key_len[i] > sk) {
        return InvalidArgument("attention: key_len[" + std::to_string(i) +
                               "] = " + std::to_string(p.key_len[i]) + " is outside [0, " +
                               std::to_string(sk) + "] for k " + desc(k));
      }
    }
  }
  ZI_TRY(check_alias(op, "q", q, "out", out, false));
  ZI_TRY(check_alias(op, "k", k, "out", out, false));
  return check_alias(op, "v", v, "out", out, false);
}

// ---- convolution / resampling ----

Status upsample_nearest2x(const OpEnv& env, const Tensor& x, const Tensor& y) {
  const char* op = "upsample_nearest2x";
  ZI_TRY(float_tensor(env, op, "x", x));
  ZI_TRY(check_rank(op, "x", x, 4));
  ZI_TRY(like(env, op, "y", y, "x", x));
  const Shape want{x.dim(0), 2 * x.dim(1), 2 * x.dim(2), x.dim(3)};
  if (y.shape() != want) {
    return InvalidArgument(prefix(op, "y", y) + " must be " + shape_string(want) + " for x " +
                           desc(x));
  }
  return check_alias(op, "x", x, "y", y, false);
}

Status conv2d(const OpEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
              const Conv2dParams& p, const Tensor& y) {
  const char* op = "conv2d";
  ZI_TRY(act_tensor(env, op, "x", x));
  ZI_TRY(act_tensor(env, op, "w", w));
  ZI_TRY(act_tensor(env, op, "y", y));
  ZI_TRY(check_rank(op, "x", x, 4));
  ZI_TRY(check_rank(op, "w", w, 4));
  const int64_t b = x.dim(0), h = x.dim(1), wd = x.dim(2), cin = x.dim(3);
  const int64_t cout = w.dim(0), kh = w.dim(1), kw = w.dim(2);
  if (w.dim(3) != cin) {
    return InvalidArgument(prefix(op, "x", x) + " and w " + desc(w) + ": Cin differs (" +
                           std::to_string(cin) + " vs " + std::to_string(w.dim(3)) + ")");
  }
  if (p.stride < 1 || p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0) {
    return InvalidArgument("conv2d: stride " + std::to_string(p.stride) +
                           " must be >= 1 and paddings >= 0");
  }
  const int64_t hp = h + p.pad_top + p.pad_bottom, wp = wd + p.pad_left + p.pad_right;
  if (kh < 1 || kw < 1 || hp < kh || wp < kw) {
    return InvalidArgument(prefix(op, "w", w) + " does not fit the padded input of x " + desc(x));
  }
  const int64_t ho = (hp - kh) / p.stride + 1, wo = (wp - kw) / p.stride + 1;
  const Shape want{b, ho, wo, cout};
  if (y.shape() != want) {
    return InvalidArgument(prefix(op, "y", y) + " must be " + shape_string(want) + " for x " +
                           desc(x) + ", w " + desc(w) + ", stride " + std::to_string(p.stride));
  }
  if (bias.defined()) {
    ZI_TRY(act_tensor(env, op, "bias", bias));
    if (bias.rank() != 1 || bias.dim(0) != cout) {
      return InvalidArgument(prefix(op, "bias", bias) + " must be [" + std::to_string(cout) +
                             "] for w " + desc(w));
    }
    ZI_TRY(check_alias(op, "bias", bias, "y", y, false));
  }
  ZI_TRY(check_alias(op, "x", x, "y", y, false));
  return check_alias(op, "w", w, "y", y, false);
}

Status conv2d_add(const OpEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
                  const Tensor& residual, const Conv2dParams& p, const Tensor& y) {
  ZI_TRY(conv2d(env, x, w, bias, p, y));
  const char* op = "conv2d_add";
  ZI_TRY(act_tensor(env, op, "residual", residual));
  ZI_TRY(check_same_shape(op, "residual", residual, "y", y));
  return check_alias(op, "residual", residual, "y", y, false);
}

// ---- layout ----

Status embedding(const OpEnv& env, const Tensor& table, const Tensor& ids, const Tensor& out) {
  const char* op = "embedding";
  ZI_TRY(float_tensor(env, op, "table", table));
  ZI_TRY(check_rank(op, "table", table, 2));
  ZI_TRY(check_host(op, "ids", ids));
  ZI_TRY(like(env, op, "out", out, "table", table));
  if (ids.dtype() != DType::kI32 || ids.rank() != 1) {
    return InvalidArgument(prefix(op, "ids", ids) + " must be a rank-1 i32 tensor");
  }
  const int64_t n = ids.dim(0), v = table.dim(0), d = table.dim(1);
  // out holds N rows, in any leading shape: [N, D] or [B, S, D].
  if (out.rank() < 1 || out.dim(-1) != d || out.numel() != n * d) {
    return InvalidArgument(prefix(op, "out", out) + " must be " + shape_string({n, d}) +
                           " for ids " + desc(ids) + " and table " + desc(table));
  }
  ZI_TRY(check_alias(op, "table", table, "out", out, false));
  const int32_t* id = ids.data_as<const int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (id[i] < 0 || id[i] >= v) {
      return InvalidArgument("embedding: ids[" + std::to_string(i) +
                             "] = " + std::to_string(id[i]) + " is outside the " +
                             std::to_string(v) + " rows of table " + desc(table));
    }
  }
  return Status::Ok();
}

namespace {

// A latent tensor [B, C, H, W] (f32) against the patch size p (p divides H and W).
Status check_patch_grid(const OpEnv& env, const char* op, const char* name, const Tensor& lat,
                        int p) {
  ZI_TRY(f32_tensor(env, op, name, lat));
  ZI_TRY(check_rank(op, name, lat, 4));
  if (p < 1 || lat.dim(2) % p != 0 || lat.dim(3) % p != 0) {
    return InvalidArgument(prefix(op, name, lat) + ": patch size " + std::to_string(p) +
                           " must be >= 1 and divide H and W");
  }
  return Status::Ok();
}

}  // namespace

Status patchify(const OpEnv& env, const Tensor& latents, int p, const Tensor& tokens) {
  const char* op = "patchify";
  ZI_TRY(check_patch_grid(env, op, "latents", latents, p));
  ZI_TRY(float_tensor(env, op, "tokens", tokens));
  const int64_t b = latents.dim(0), c = latents.dim(1), h = latents.dim(2), w = latents.dim(3);
  const Shape want{b, (h / p) * (w / p), int64_t{p} * p * c};
  if (tokens.shape() != want) {
    return InvalidArgument(prefix(op, "tokens", tokens) + " must be " + shape_string(want) +
                           " for latents " + desc(latents) + " and p " + std::to_string(p));
  }
  return check_alias(op, "latents", latents, "tokens", tokens, false);
}

Status unpatchify(const OpEnv& env, const Tensor& tokens, int p, const Tensor& out) {
  const char* op = "unpatchify";
  ZI_TRY(check_patch_grid(env, op, "out", out, p));
  ZI_TRY(float_tensor(env, op, "tokens", tokens));
  ZI_TRY(check_rank(op, "tokens", tokens, 3));
  const int64_t b = out.dim(0), c = out.dim(1), h = out.dim(2), w = out.dim(3);
  const int64_t ht = h / p, wt = w / p, feat = int64_t{p} * p * c;
  if (tokens.dim(0) != b || tokens.dim(1) < ht * wt || tokens.dim(2) != feat) {
    return InvalidArgument(prefix(op, "tokens", tokens) + " must be [" + std::to_string(b) +
                           ", >= " + std::to_string(ht * wt) + ", " + std::to_string(feat) +
                           "] for out " + desc(out) + " and p " + std::to_string(p));
  }
  return check_alias(op, "tokens", tokens, "out", out, false);
}

// ---- linear algebra ----

Status matmul(const OpEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
              const Tensor& y) {
  const char* op = "matmul";
  ZI_TRY(float_tensor(env, op, "x", x));
  ZI_TRY(like(env, op, "w", w, "x", x));
  ZI_TRY(like(env, op, "y", y, "x", x));
  if (x.rank() < 1) return InvalidArgument(prefix(op, "x", x) + " must have rank >= 1");
  ZI_TRY(check_rank(op, "w", w, 2));
  const int64_t k = x.dim(-1);
  const int64_t n = w.dim(0);
  if (w.dim(1) != k) {
    return InvalidArgument(prefix(op, "x", x) + " and w " + desc(w) + ": K differs (" +
                           std::to_string(k) + " vs " + std::to_string(w.dim(1)) + ")");
  }
  // y holds x's rows, in any leading shape: [B, S, N] or [B * S, N] for x [B, S, K].
  Shape want = x.shape();
  want.back() = n;
  if (y.rank() < 1 || y.dim(-1) != n || y.numel() != shape_numel(want)) {
    return InvalidArgument(prefix(op, "y", y) + " must be " + shape_string(want) + " for x " +
                           desc(x) + " and w " + desc(w));
  }
  if (bias.defined()) {
    ZI_TRY(like(env, op, "bias", bias, "x", x));
    if (bias.numel() != n || bias.rank() != 1) {
      return InvalidArgument(prefix(op, "bias", bias) + " must be [" + std::to_string(n) +
                             "] for w " + desc(w));
    }
    ZI_TRY(check_alias(op, "bias", bias, "y", y, false));
  }
  ZI_TRY(check_alias(op, "x", x, "y", y, false));
  return check_alias(op, "w", w, "y", y, false);
}

Status matmul_swiglu(const OpEnv& env, const Tensor& x, const Tensor& w13, int64_t block,
                     const Tensor& y) {
  const char* op = "matmul_swiglu";
  ZI_TRY(float_tensor(env, op, "x", x));
  ZI_TRY(like(env, op, "w13", w13, "x", x));
  ZI_TRY(like(env, op, "y", y, "x", x));
  if (x.rank() < 1) return InvalidArgument(prefix(op, "x", x) + " must have rank >= 1");
  ZI_TRY(check_rank(op, "w13", w13, 2));
  const int64_t k = x.dim(-1), n = w13.dim(0), f = n / 2;
  if (w13.dim(1) != k || n % 2 != 0) {
    return InvalidArgument(prefix(op, "w13", w13) + " must be [2F, " + std::to_string(k) +
                           "] for x " + desc(x));
  }
  if (block < 0 || (block > 0 && f % block != 0)) {
    return InvalidArgument(std::string(op) + ": row block " + std::to_string(block) +
                           " does not divide F = " + std::to_string(f));
  }
  Shape want = x.shape();
  want.back() = f;
  if (y.rank() < 1 || y.dim(-1) != f || y.numel() != shape_numel(want)) {
    return InvalidArgument(prefix(op, "y", y) + " must be " + shape_string(want) + " for x " +
                           desc(x) + " and w13 " + desc(w13));
  }
  ZI_TRY(check_alias(op, "x", x, "y", y, false));
  return check_alias(op, "w13", w13, "y", y, false);
}

namespace {

// The FP8 weight [N, K] of an FP8 GEMM and its scales: one f32 (`rows` false) or f32 [N].
Status check_fp8_weight(const OpEnv& env, const char* op, const Tensor& w8, const Tensor& w_scale,
                        bool rows) {
  ZI_TRY(tensor(env, op, "w8", w8));
  if (w8.dtype() != DType::kF8E4M3 || w8.rank() != 2) {
    return InvalidArgument(prefix(op, "w8", w8) + " must be f8e4m3 [N, K]");
  }
  ZI_TRY(tensor(env, op, "w_scale", w_scale));
  const bool ok = w_scale.dtype() == DType::kF32 &&
                  (rows ? w_scale.shape() == Shape{w8.dim(0)} : w_scale.numel() == 1);
  if (!ok) {
    return InvalidArgument(prefix(op, "w_scale", w_scale) + " must be " +
                           (rows ? "f32 [" + std::to_string(w8.dim(0)) + "]" : "one f32"));
  }
  return Status::Ok();
}

// x[.., K] against w8 [N, K], y[.., N] holding x's rows, y disjoint from x.
Status check_fp8_rows(const char* op, const Tensor& x, const Tensor& w8, const Tensor& y) {
  const int64_t n = w8.dim(0), k = w8.dim(1);
  if (x.rank() < 1 || x.dim(-1) != k) {
    return InvalidArgument(prefix(op, "x", x) + " does not match w8 " + desc(w8));
  }
  const int64_t m = x.numel() / std::max<int64_t>(k, 1);
  if (y.rank() < 1 || y.dim(-1) != n || y.numel() != m * n) {
    return InvalidArgument(prefix(op, "y", y) + " must hold [" + std::to_string(m) + ", " +
                           std::to_string(n) + "] for x " + desc(x) + " and w8 " + desc(w8));
  }
  return check_alias(op, "x", x, "y", y, false);
}

}  // namespace

Status quantize_fp8(const OpEnv& env, const Tensor& x, const Tensor& x8, const Tensor& scale) {
  const char* op = "quantize_fp8";
  ZI_TRY(float_tensor(env, op, "x", x));
  ZI_TRY(tensor(env, op, "x8", x8));
  if (x8.dtype() != DType::kF8E4M3 || x8.shape() != x.shape()) {
    return InvalidArgument(prefix(op, "x8", x8) + " must be f8e4m3 " + shape_string(x.shape()));
  }
  ZI_TRY(tensor(env, op, "scale", scale));
  if (scale.dtype() != DType::kF32 || scale.numel() != 1) {
    return InvalidArgument(prefix(op, "scale", scale) + " must be one f32");
  }
  return Status::Ok();
}

Status matmul_fp8(const OpEnv& env, const Tensor& x, const Tensor& w8, const Tensor& w_scale,
                  const Tensor& y) {
  const char* op = "matmul_fp8";
  ZI_TRY(check_fp8_weight(env, op, w8, w_scale, false));
  ZI_TRY(act_tensor(env, op, "x", x));
  ZI_TRY(act_tensor(env, op, "y", y));
  return check_fp8_rows(op, x, w8, y);
}

Status matmul_fp8_rows(const OpEnv& env, const Tensor& x, const Tensor& w8, const Tensor& w_scale,
                       const Tensor& bias, const Tensor& y) {
  const char* op = "matmul_fp8_rows";
  ZI_TRY(check_fp8_weight(env, op, w8, w_scale, true));
  ZI_TRY(act_tensor(env, op, "x", x));
  ZI_TRY(act_tensor(env, op, "y", y));
  ZI_TRY(check_vector(env, op, "bias", bias, w8.dim(0), "w8", w8));
  ZI_TRY(check_fp8_rows(op, x, w8, y));
  return check_alias(op, "bias", bias, "y", y, false);
}

Status fp8_rows_out(const OpEnv& env, const char* op, int64_t rows, int64_t cols, const Tensor& q,
                    const Tensor& scale) {
  ZI_TRY(tensor(env, op, "out8", q));
  if (q.dtype() != DType::kF8E4M3 || q.numel() != rows * cols || q.rank() < 1 || q.dim(-1) != cols)
    return InvalidArgument(prefix(op, "out8", q) + " must be f8e4m3 [" + std::to_string(rows) +
                           ", " + std::to_string(cols) + "]");
  ZI_TRY(tensor(env, op, "out_scale", scale));
  if (scale.dtype() != DType::kF32 || scale.numel() != rows)
    return InvalidArgument(prefix(op, "out_scale", scale) + " must be f32 [" +
                           std::to_string(rows) + "]");
  return check_alias(op, "out8", q, "out_scale", scale, false);
}

Status matmul_fp8_quantized(const OpEnv& env, const Tensor& x8, const Tensor& x_scale,
                            const Tensor& w8, const Tensor& w_scale, const Tensor& bias,
                            const Tensor& y) {
  const char* op = "matmul_fp8_quantized";
  ZI_TRY(check_fp8_weight(env, op, w8, w_scale, true));
  ZI_TRY(tensor(env, op, "x8", x8));
  if (x8.dtype() != DType::kF8E4M3)
    return InvalidArgument(prefix(op, "x8", x8) + " must be f8e4m3 [.., K]");
  ZI_TRY(act_tensor(env, op, "y", y));
  ZI_TRY(check_vector(env, op, "bias", bias, w8.dim(0), "w8", w8));
  ZI_TRY(check_fp8_rows(op, x8, w8, y));
  const int64_t m = x8.numel() / std::max<int64_t>(w8.dim(1), 1);
  ZI_TRY(tensor(env, op, "x_scale", x_scale));
  if (x_scale.dtype() != DType::kF32 || x_scale.numel() != m)
    return InvalidArgument(prefix(op, "x_scale", x_scale) + " must be f32 [" + std::to_string(m) +
                           "] (one scale a row of x8 " + desc(x8) + ")");
  return check_alias(op, "bias", bias, "y", y, false);
}

Status matmul_fp8_swiglu(const OpEnv& env, const Tensor& x8, const Tensor& x_scale,
                         const Tensor& w13_8, const Tensor& w13_scale, int64_t block,
                         const Tensor& y, const Tensor& y8, const Tensor& y_scale) {
  const char* op = "matmul_fp8_swiglu";
  ZI_TRY(check_fp8_weight(env, op, w13_8, w13_scale, true));
  ZI_TRY(tensor(env, op, "x8", x8));
  const int64_t n = w13_8.dim(0), k = w13_8.dim(1), f = n / 2;
  if (x8.dtype() != DType::kF8E4M3 || x8.rank() < 1 || x8.dim(-1) != k)
    return InvalidArgument(prefix(op, "x8", x8) + " must be f8e4m3 [.., " + std::to_string(k) +
                           "] for w13_8 " + desc(w13_8));
  if (n % 2 != 0)
    return InvalidArgument(prefix(op, "w13_8", w13_8) + " must have 2F rows (gate and up)");
  if (block < 0 || (block > 0 && f % block != 0))
    return InvalidArgument(std::string(op) + ": row block " + std::to_string(block) +
                           " does not divide F = " + std::to_string(f));
  const int64_t m = x8.numel() / std::max<int64_t>(k, 1);
  ZI_TRY(tensor(env, op, "x_scale", x_scale));
  if (x_scale.dtype() != DType::kF32 || x_scale.numel() != m)
    return InvalidArgument(prefix(op, "x_scale", x_scale) + " must be f32 [" + std::to_string(m) +
                           "] (one scale a row of x8 " + desc(x8) + ")");
  ZI_TRY(act_tensor(env, op, "y", y));
  if (y.rank() < 1 || y.dim(-1) != f || y.numel() != m * f)
    return InvalidArgument(prefix(op, "y", y) + " must hold [" + std::to_string(m) + ", " +
                           std::to_string(f) + "] for x8 " + desc(x8) + " and w13_8 " +
                           desc(w13_8));
  ZI_TRY(check_alias(op, "x8", x8, "y", y, false));
  ZI_TRY(check_alias(op, "x_scale", x_scale, "y", y, false));
  ZI_TRY(check_alias(op, "w13_8", w13_8, "y", y, false));
  ZI_TRY(check_alias(op, "w13_scale", w13_scale, "y", y, false));
  if (y8.defined() != y_scale.defined())
    return InvalidArgument(std::string(op) + ": y8 and y_scale go together (both or neither)");
  if (!y8.defined()) return Status::Ok();
  ZI_TRY(fp8_rows_out(env, op, m, f, y8, y_scale));
  ZI_TRY(check_alias(op, "y", y, "y8", y8, false));
  ZI_TRY(check_alias(op, "w13_8", w13_8, "y8", y8, false));
  return check_alias(op, "y", y, "y_scale", y_scale, false);
}

Status dequantize_fp8_rows(const OpEnv& env, const Tensor& w8, const Tensor& scale,
                           const Tensor& y) {
  const char* op = "dequantize_fp8_rows";
  ZI_TRY(tensor(env, op, "w8", w8));
  if ((w8.dtype() != DType::kF8E4M3 && w8.dtype() != DType::kF8E5M2) || w8.rank() != 2) {
    return InvalidArgument(prefix(op, "w8", w8) + " must be f8e4m3 or f8e5m2 [N, K]");
  }
  ZI_TRY(tensor(env, op, "scale", scale));
  if (scale.dtype() != DType::kF32 || scale.shape() != Shape{w8.dim(0)}) {
    return InvalidArgument(prefix(op, "scale", scale) + " must be f32 [" +
                           std::to_string(w8.dim(0)) + "]");
  }
  ZI_TRY(act_tensor(env, op, "y", y));
  if (y.numel() != w8.numel()) {
    return InvalidArgument(prefix(op, "y", y) + " does not hold w8 " + desc(w8));
  }
  return Status::Ok();
}

}  // namespace zimage::contract
