// Rotary position embeddings, in place on x[B, S, H, Dh]. Both variants do the rotation in fp32
// on values read from the storage type and round once on store (the DiT's reference upcasts to
// fp32, multiplies as complex64 and casts back; Qwen3's bf16 arithmetic differs by one rounding).
#include "backend/cuda/kernels/device_utils.cuh"

namespace zimage::cuda {
namespace {

constexpr int kThreads = 256;

// Rotate-half: pairs (j, j + Dh/2) with tables cos/sin [S, Dh]. Each thread rotates VEC pairs.
template <typename T, int VEC>
__global__ void rope_half_kernel(T* x, const float* cos_t, const float* sin_t, int64_t seq,
                                 int64_t heads, int64_t head_dim, int64_t total_packs) {
  const int64_t half = head_dim / 2;
  const int64_t ppv = half / VEC;  // packs per head vector
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < total_packs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t vec_index = p / ppv;  // (b, s, h) flattened
    const int64_t j0 = (p % ppv) * VEC;
    const int64_t pos = (vec_index / heads) % seq;
    T* xv = x + vec_index * head_dim;
    const float* c = cos_t + pos * head_dim;
    const float* sn = sin_t + pos * head_dim;
    float a[VEC], b[VEC];
    if constexpr (VEC > 1) {
      load_f32<T, VEC>(xv + j0, a);
      load_f32<T, VEC>(xv + half + j0, b);
    } else {
      a[0] = to_f32<T>(xv[j0]);
      b[0] = to_f32<T>(xv[half + j0]);
    }
    float oa[VEC], ob[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const int64_t j = j0 + k;
      oa[k] = a[k] * c[j] - b[k] * sn[j];
      ob[k] = b[k] * c[half + j] + a[k] * sn[half + j];
    }
    if constexpr (VEC > 1) {
      store_f32<T, VEC>(xv + j0, oa);
      store_f32<T, VEC>(xv + half + j0, ob);
    } else {
      xv[j0] = from_f32<T>(oa[0]);
      xv[half + j0] = from_f32<T>(ob[0]);
    }
  }
}

// Interleaved: pairs (2j, 2j+1), freqs [B, S, Dh/2, 2] = (cos, sin). Each thread rotates PAIRS
// adjacent pairs (2 * PAIRS contiguous elements).
template <typename T, int PAIRS>
__global__ void rope_interleaved_kernel(T* x, const float* freqs, int64_t seq_if_shared,
                                        int64_t heads, int64_t head_dim, int64_t total_packs) {
  constexpr int E = 2 * PAIRS;
  const int64_t ppv = head_dim / E;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < total_packs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t vec_index = p / ppv;  // (b, s, h)
    const int64_t e0 = (p % ppv) * E;
    int64_t token = vec_index / heads;  // (b, s)
    if (seq_if_shared > 0) token %= seq_if_shared;
    T* xv = x + vec_index * head_dim + e0;
    const float* f = freqs + token * head_dim + e0;  // Dh/2 pairs * 2 floats = Dh floats/token
    float v[E];
    if constexpr (PAIRS > 1) {
      load_f32<T, E>(xv, v);
    } else {
#pragma unroll
      for (int k = 0; k < E; ++k) v[k] = to_f32<T>(xv[k]);
    }
#pragma unroll
    for (int k = 0; k < PAIRS; ++k) {
      const float c = f[2 * k], s = f[2 * k + 1];
      const float x0 = v[2 * k], x1 = v[2 * k + 1];
      v[2 * k] = x0 * c - x1 * s;
      v[2 * k + 1] = x0 * s + x1 * c;
    }
    if constexpr (PAIRS > 1) {
      store_f32<T, E>(xv, v);
    } else {
#pragma unroll
      for (int k = 0; k < E; ++k) xv[k] = from_f32<T>(v[k]);
    }
  }
}

}  // namespace

cudaError_t launch_rope_half(KType t, void* x, const float* cos, const float* sin, int64_t batch,
                             int64_t seq, int64_t heads, int64_t head_dim, cudaStream_t s) {
  const int64_t vecs = batch * seq * heads;
  if (vecs <= 0 || head_dim <= 0) return cudaSuccess;
  if (head_dim % 2 != 0) return cudaErrorInvalidValue;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    T* xp = static_cast<T*>(x);
    const int64_t half = head_dim / 2;
    if (half % V == 0 && aligned16(x)) {
      const int64_t packs = vecs * (half / V);
      rope_half_kernel<T, V><<<grid_for(packs, kThreads), kThreads, 0, s>>>(xp, cos, sin, seq,
                                                                            heads, head_dim, packs);
    } else {
      const int64_t packs = vecs * half;
      rope_half_kernel<T, 1><<<grid_for(packs, kThreads), kThreads, 0, s>>>(xp, cos, sin, seq,
                                                                            heads, head_dim, packs);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_rope_interleaved(KType t, void* x, const float* freqs, bool freqs_shared,
                                    int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                    cudaStream_t s) {
  const int64_t vecs = batch * seq * heads;
  if (vecs <= 0 || head_dim <= 0) return cudaSuccess;
  if (head_dim % 2 != 0) return cudaErrorInvalidValue;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int P = kVec16<T> / 2;
    T* xp = static_cast<T*>(x);
    const int64_t shared_seq = freqs_shared ? seq : 0;
    if (head_dim % (2 * P) == 0 && aligned16(x)) {
      const int64_t packs = vecs * (head_dim / (2 * P));
      rope_interleaved_kernel<T, P><<<grid_for(packs, kThreads), kThreads, 0, s>>>(
          xp, freqs, shared_seq, heads, head_dim, packs);
    } else {
      const int64_t packs = vecs * (head_dim / 2);
      rope_interleaved_kernel<T, 1><<<grid_for(packs, kThreads), kThreads, 0, s>>>(
          xp, freqs, shared_seq, heads, head_dim, packs);
    }
    return cudaGetLastError();
  });
}

}  // namespace zimage::cuda
