// CPU scaled-dot-product attention, the reference for the fused CUDA kernels. Per (batch, head)
// and per block of queries: S = scale · Q Kᵀ (sgemm, reading q/k in place through leading
// dimensions, no transposes), masked softmax with max subtraction row by row, O = P V (sgemm
// writing straight into out). GQA: q head h reads kv head h / (Hq / Hkv). Masks: keys
// >= key_len[b] are excluded (and not even computed), causal rows i see keys <= i. A row whose
// keys are all masked outputs zeros instead of NaN.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_check.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/fp8_attention.h"
#include "core/dtype.h"

namespace zimage::cpu {

Status CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionParams& p, Tensor& out) {
  ZI_TRY(contract::attention(cpu_env(), q, k, v, p, out));
  const int64_t b = q.dim(0), sq = q.dim(1), hq = q.dim(2), d = q.dim(3);
  const int64_t sk = k.dim(1), hkv = k.dim(2);
  if (hq * d >= INT_MAX || hkv * d >= INT_MAX || sk >= INT_MAX) {
    return Unsupported("attention: q " + desc(q) + " / k " + desc(k) +
                       ": dimensions must stay below 2^31 for the BLAS");
  }
  if (out.numel() == 0) return Status::Ok();
  set_blas_threads(threads_);

  // Scores of one block of queries at a time (attention_score_floats_, 64 MiB by default): never
  // the whole [Sq, Sk] matrix (16 GiB for the VAE's 65536-pixel attention at 2048²).
  const int64_t qblock = std::clamp<int64_t>(attention_score_floats_ / std::max<int64_t>(sk, 1), 1,
                                             std::max<int64_t>(sq, 1));
  auto scratch = HostStorage::allocate(static_cast<size_t>(qblock * std::max<int64_t>(sk, 1)) * 4);
  if (!scratch) return OutOfMemory("attention: score buffer for k " + desc(k));
  float* scores = static_cast<float*>(scratch->data());

  const int64_t group = hq / hkv;
  const int64_t q_ld = hq * d, kv_ld = hkv * d;
  const float* qp = q.data_as<const float>();
  const float* kp = k.data_as<const float>();
  const float* vp = v.data_as<const float>();
  float* op_ = out.data_as<float>();

  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t klen = p.key_len.empty() ? sk : p.key_len[static_cast<size_t>(bi)];
    for (int64_t h = 0; h < hq; ++h) {
      const float* qh = qp + bi * sq * q_ld + h * d;             // rows of stride q_ld
      const float* kh = kp + bi * sk * kv_ld + (h / group) * d;  // rows of stride kv_ld
      const float* vh = vp + bi * sk * kv_ld + (h / group) * d;
      float* oh = op_ + bi * sq * q_ld + h * d;
      for (int64_t q0 = 0; q0 < sq; q0 += qblock) {
        const int64_t nq = std::min(qblock, sq - q0);
        if (klen == 0 || d == 0) {  // every key masked (or empty heads): zeros
          for (int64_t i = 0; i < nq; ++i) std::memset(oh + (q0 + i) * q_ld, 0, d * 4);
          continue;
        }
        // scores[nq, klen] = scale · Q[q0:q0+nq] · K[:klen]ᵀ
        sgemm_nt(nq, klen, d, p.scale, qh + q0 * q_ld, q_ld, kh, kv_ld, 0.0f, scores, klen);
        pool_.parallel_for(nq, std::max<int64_t>(1, 8192 / klen), [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            float* row = scores + i * klen;
            const int64_t valid = p.causal ? std::min(klen, q0 + i + 1) : klen;
            if (valid <= 0) {
              std::fill(row, row + klen, 0.0f);
              continue;
            }
            float mx = row[0];
            for (int64_t j = 1; j < valid; ++j) mx = std::max(mx, row[j]);
            double sum = 0.0;
            for (int64_t j = 0; j < valid; ++j) {
              row[j] = std::exp(row[j] - mx);
              sum += row[j];
            }
            const float inv = static_cast<float>(1.0 / sum);
            for (int64_t j = 0; j < valid; ++j) row[j] *= inv;
            std::fill(row + valid, row + klen, 0.0f);
          }
        });
        // O[q0:q0+nq] = P[nq, klen] · V[:klen]
        sgemm_nn(nq, d, klen, 1.0f, scores, klen, vh, kv_ld, 0.0f, oh + q0 * q_ld, q_ld);
      }
    }
  }
  return Status::Ok();
}

namespace {

// x rounded to e4m3 after dividing by its scale (multiplying by inv = 1 / scale, clamped to the
// format's range), as the CUDA kernels do; the e4m3 value itself, not scaled back.
float e4m3_of(float x, float inv) {
  return f8e4m3_to_f32(f32_to_f8e4m3(std::clamp(x * inv, -kFp8Max, kFp8Max)));
}

float max_abs(const Tensor& t) {
  const float* d = t.data_as<const float>();
  float m = 0.f;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(d[i]));
  return m;
}

}  // namespace

// The oracle of the FP8 attention (Backend::attention_packed_fp8): the bf16 path's prologue on a
// copy, q, k and v rounded to e4m3 with their scales (the values kept, the scales folded into the
// softmax scale and applied to each head's output), then the exact attention above.
Status CpuBackend::attention_packed_fp8(const Tensor& qkv, int64_t hq, int64_t hkv,
                                        const Tensor& norm_q, const Tensor& norm_k, float eps,
                                        const Tensor& freqs, const AttentionParams& p,
                                        Tensor& out) {
  constexpr const char* op = "attention_packed_fp8";
  if (!qkv.defined() || qkv.rank() != 3 || hq <= 0 || hkv <= 0 || hq % hkv != 0 ||
      qkv.dim(2) % (hq + 2 * hkv) != 0)
    return InvalidArgument(std::string(op) + ": qkv must be [B, S, (Hq + 2*Hkv) * Dh] (qkv " +
                           (qkv.defined() ? desc(qkv) : std::string("undefined")) + ")");
  if (!norm_q.defined() || !norm_k.defined())
    return InvalidArgument(std::string(op) + ": needs the q and k norm weights (their scales)");
  for (const Tensor* t : {&qkv, &norm_q, &norm_k})
    if (t->device() != Device::kCPU || t->dtype() != DType::kF32)
      return InvalidArgument(std::string(op) + ": " + desc(*t) + " is not a host f32 tensor");
  const int64_t b = qkv.dim(0), s = qkv.dim(1), f = qkv.dim(2), dh = f / (hq + 2 * hkv);
  const int64_t rows = b * s;
  ZI_ASSIGN_OR_RETURN(Tensor work, alloc(DType::kF32, qkv.shape()));
  std::memcpy(work.data(), qkv.data(), static_cast<size_t>(qkv.numel()) * 4);
  ZI_TRY(qk_norm_rope_packed(work, hq, hkv, norm_q, norm_k, eps, freqs));

  const float sq = fp8_attention_qk_scale(max_abs(norm_q), static_cast<int>(dh));
  const float sk = fp8_attention_qk_scale(max_abs(norm_k), static_cast<int>(dh));
  std::vector<float> sv(static_cast<size_t>(hkv), 0.f);  // per KV head: max |v|, then the scale
  float* w = work.data_as<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < hkv; ++h) {
      const float* vh = w + r * f + (hq + hkv + h) * dh;
      for (int64_t i = 0; i < dh; ++i)
        sv[static_cast<size_t>(h)] = std::max(sv[static_cast<size_t>(h)], std::fabs(vh[i]));
    }
  std::vector<float> inv_v(sv.size());
  for (size_t h = 0; h < sv.size(); ++h) {
    sv[h] = fp8_attention_v_scale(sv[h]);
    inv_v[h] = 1.0f / sv[h];
  }
  const float inv_q = 1.0f / sq, inv_k = 1.0f / sk;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = w + r * f;
    for (int64_t i = 0; i < hq * dh; ++i) row[i] = e4m3_of(row[i], inv_q);
    for (int64_t i = hq * dh; i < (hq + hkv) * dh; ++i) row[i] = e4m3_of(row[i], inv_k);
    for (int64_t i = 0; i < hkv * dh; ++i) {
      float& x = row[(hq + hkv) * dh + i];
      x = e4m3_of(x, inv_v[static_cast<size_t>(i / dh)]);
    }
  }
  AttentionParams p8 = p;
  p8.scale = p.scale * sq * sk;
  ZI_TRY(attention_packed(work, hq, hkv, p8, out));
  float* o = out.data_as<float>();
  const int64_t group = hq / hkv;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < hq; ++h) {
      const float scale = sv[static_cast<size_t>(h / group)];
      for (int64_t i = 0; i < dh; ++i) o[(r * hq + h) * dh + i] *= scale;
    }
  return Status::Ok();
}

}  // namespace zimage::cpu
