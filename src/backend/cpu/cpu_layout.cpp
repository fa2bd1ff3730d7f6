// CPU model-specific layout ops: embedding row gather and the DiT's patchify / unpatchify
// (spec §4.4 / §4.6): token n = r*(W/p) + s, feature (ph*p + pw)*C + c holds
// latents[c, r*p + ph, s*p + pw].
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_check.h"

namespace zimage::cpu {

Status CpuBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  ZI_TRY(contract::embedding(cpu_env(), table, ids, out));
  const int64_t n = ids.dim(0), d = table.dim(1);
  const int32_t* id = ids.data_as<const int32_t>();
  const float* tp = table.data_as<const float>();
  float* o = out.data_as<float>();
  const size_t row_bytes = static_cast<size_t>(d) * 4;
  pool_.parallel_for(n, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)),
                     [&](int64_t i0, int64_t i1) {
                       for (int64_t i = i0; i < i1; ++i) {
                         std::memcpy(o + i * d, tp + static_cast<int64_t>(id[i]) * d, row_bytes);
                       }
                     });
  return Status::Ok();
}

Status CpuBackend::patchify(const Tensor& latents, int p, Tensor& tokens) {
  ZI_TRY(contract::patchify(cpu_env(), latents, p, tokens));
  const int64_t b = latents.dim(0), c = latents.dim(1), h = latents.dim(2), w = latents.dim(3);
  const int64_t ht = h / p, wt = w / p, feat = int64_t{p} * p * c;
  const float* lp = latents.data_as<const float>();
  float* tp = tokens.data_as<float>();
  pool_.parallel_for(b * ht * wt, std::max<int64_t>(1, 4096 / std::max<int64_t>(feat, 1)),
                     [&](int64_t t0, int64_t t1) {
                       for (int64_t t = t0; t < t1; ++t) {
                         const int64_t bi = t / (ht * wt), r = (t / wt) % ht, s = t % wt;
                         float* tok = tp + t * feat;
                         for (int64_t ph = 0; ph < p; ++ph) {
                           for (int64_t pw = 0; pw < p; ++pw) {
                             const float* src = lp + ((bi * c) * h + r * p + ph) * w + s * p + pw;
                             float* dst = tok + (ph * p + pw) * c;
                             for (int64_t ch = 0; ch < c; ++ch) dst[ch] = src[ch * h * w];
                           }
                         }
                       }
                     });
  return Status::Ok();
}

Status CpuBackend::unpatchify(const Tensor& tokens, int p, float alpha, Tensor& out) {
  ZI_TRY(contract::unpatchify(cpu_env(), tokens, p, out));
  const int64_t b = out.dim(0), c = out.dim(1), h = out.dim(2), w = out.dim(3);
  const int64_t wt = w / p, feat = int64_t{p} * p * c;
  const int64_t seq = tokens.dim(1);
  const float* tp = tokens.data_as<const float>();
  float* o = out.data_as<float>();
  // One output row (bi, ch, y) at a time: y = r*p + ph, x = s*p + pw.
  pool_.parallel_for(b * c * h, std::max<int64_t>(1, 4096 / std::max<int64_t>(w, 1)),
                     [&](int64_t r0, int64_t r1) {
                       for (int64_t row = r0; row < r1; ++row) {
                         const int64_t bi = row / (c * h), ch = (row / h) % c, y = row % h;
                         const int64_t r = y / p, ph = y % p;
                         float* dst = o + row * w;
                         for (int64_t x = 0; x < w; ++x) {
                           const int64_t s = x / p, pw = x % p;
                           const float* tok = tp + (bi * seq + r * wt + s) * feat;
                           dst[x] = alpha * tok[(ph * p + pw) * c + ch];
                         }
                       }
                     });
  return Status::Ok();
}

}  // namespace zimage::cpu
