// Sequence-parallel DiT forward (docs/PARALLEL.md). Every rank gets the same inputs and runs:
//   c, image tokens                                                      replicated (whole)
//   noise refiner on this rank's share of the image tokens (Ulysses as below), then gathered
//   caption tokens + context refiner                                     replicated (whole)
//   u = [image ; caption] per item                                       [B, S, D], whole
//   u_r = tokens [t0_r, t0_r + S_r) of every item                        [B, S_r, D], this rank
//   main layers on u_r; in each, after the token-local q/k norms and RoPE:
//     q, k, v [B, S_r, H, Dh] --all-to-all--> [B, S, H_r, Dh] (this rank's heads, every token)
//     attention over the whole sequence with forward's masks             [B, S, H_r, Dh]
//     out --all-to-all--> [B, S_r, H, Dh]
//   final layer on u_r, gathered on every rank to [B, S, p*p*C], unpatchify.
// Tokens and heads split as evenly as they go: the first S % P ranks take one token more, the
// first H % P ranks one head more (Z-Image's 30 heads over 4 ranks: 8, 8, 7, 7).
#include <algorithm>
#include <cmath>

#include "model/common/load_util.h"
#include "model/dit/zimage_dit.h"

namespace zimage {

namespace {

constexpr float kFinalNormEps = 1e-6f;  // as compute(): FinalLayer LayerNorm, no affine

// n items over p ranks: counts (the first n % p one larger) and their offsets.
struct Split {
  std::vector<int64_t> count, first;
  Split(int64_t n, int p) : count(p), first(p) {
    int64_t at = 0;
    for (int r = 0; r < p; ++r) {
      count[r] = n / p + (r < n % p ? 1 : 0);
      first[r] = at;
      at += count[r];
    }
  }
};

// copy_2d that skips empty blocks (a rank may hold no head when P exceeds the head count).
Status copy_block(Backend& be, const Tensor& src, int64_t so, int64_t ss, Tensor& dst, int64_t d_o,
                  int64_t ds, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return Status::Ok();
  return be.copy_2d(src, so, ss, dst, d_o, ds, rows, cols);
}

// Rows [t0, t0 + n) of every item of src [B, S, ...] as a new tensor [B, n, ...].
Result<Tensor> take_rows(Backend& be, const Tensor& src, int64_t t0, int64_t n) {
  const int64_t b = src.dim(0), s = src.dim(1), w = src.numel() / (b * s);
  Shape shape = src.shape();
  shape[1] = n;
  ZI_ASSIGN_OR_RETURN(Tensor dst, load::alloc(be, src.dtype(), shape, "dit.shard"));
  for (int64_t i = 0; i < b; ++i)
    ZI_TRY(copy_block(be, src, (i * s + t0) * w, w, dst, i * n * w, w, n, w));
  return dst;
}

// Every rank's rows (mine: [B, S_r, W], the rank's share of `split`) gathered into whole
// [B, S, W] on every rank.
Status gather_rows(Backend& be, Communicator& comm, const Split& split, const Tensor& mine,
                   Tensor& whole) {
  const int p = comm.size();
  const int64_t b = whole.dim(0), s = whole.dim(1), w = whole.numel() / (b * s);
  std::vector<int64_t> counts(p);
  for (int i = 0; i < p; ++i) counts[i] = b * split.count[i] * w;
  if (b == 1) return comm.all_gather_v(mine, whole, counts);  // rank order is token order
  ZI_ASSIGN_OR_RETURN(Tensor buf, load::alloc(be, whole.dtype(), {b * s * w}, "dit.gathered"));
  ZI_TRY(comm.all_gather_v(mine, buf, counts));
  int64_t at = 0;  // [rank][B][S_i][W] -> [B][S][W]
  for (int i = 0; i < p; ++i) {
    const int64_t si = split.count[i];
    for (int64_t bi = 0; bi < b; ++bi)
      ZI_TRY(
          copy_block(be, buf, at + bi * si * w, w, whole, (bi * s + split.first[i]) * w, w, si, w));
    at += counts[i];
  }
  return Status::Ok();
}

// Ulysses attention of one rank: the exchange buffers (sized once per forward) and the steps.
class Ulysses {
 public:
  Ulysses(Backend& be, Communicator& comm, int64_t b, int64_t s, int64_t h, int64_t dh)
      : be_(be),
        comm_(comm),
        p_(comm.size()),
        r_(comm.rank()),
        b_(b),
        s_(s),
        h_(h),
        dh_(dh),
        tok_(s, comm.size()),
        head_(h, comm.size()) {}

  const Split& tokens() const { return tok_; }

  Status alloc() {
    const DType t = be_.act_dtype();
    const int64_t sr = tok_.count[r_], hr = head_.count[r_];
    // a: this rank's q|k|v to send, later the attention output it receives back;
    // z: q|k|v received, later the attention output to send back.
    const int64_t a = std::max<int64_t>(3 * b_ * sr * h_ * dh_, 1);
    const int64_t z = std::max<int64_t>(3 * b_ * s_ * hr * dh_, 1);
    ZI_ASSIGN_OR_RETURN(a_, load::alloc(be_, t, {a}, "dit.ulysses_send"));
    ZI_ASSIGN_OR_RETURN(z_, load::alloc(be_, t, {z}, "dit.ulysses_recv"));
    const Shape full{b_, s_, std::max<int64_t>(hr, 1), dh_};  // [B, S, H_r, Dh]
    for (Tensor* x : {&qf_, &kf_, &vf_, &of_}) {
      ZI_ASSIGN_OR_RETURN(*x, load::alloc(be_, t, full, "dit.ulysses_heads"));
    }
    return Status::Ok();
  }

  // q, k, v, o: [B, S_r, H, Dh] of this rank's tokens.
  Status attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& ap,
                   Tensor& o) {
    const int64_t sr = tok_.count[r_], hr = head_.count[r_], hd = h_ * dh_;
    const Tensor* qkv[3] = {&q, &k, &v};
    Tensor* full[3] = {&qf_, &kf_, &vf_};
    // ---- tokens -> heads: to rank j, [3][B*S_r][H_j*Dh] (its heads of this rank's tokens) ----
    std::vector<int64_t> send(p_), recv(p_);
    int64_t at = 0;
    for (int j = 0; j < p_; ++j) {
      const int64_t w = head_.count[j] * dh_;
      for (int t = 0; t < 3; ++t)
        ZI_TRY(copy_block(be_, *qkv[t], head_.first[j] * dh_, hd, a_, at + t * b_ * sr * w, w,
                          b_ * sr, w));
      send[j] = 3 * b_ * sr * w;
      recv[j] = 3 * b_ * tok_.count[j] * hr * dh_;
      at += send[j];
    }
    ZI_TRY(comm_.all_to_all_v(a_, send, z_, recv));
    // from rank i, [3][B][S_i][H_r*Dh]: its tokens of this rank's heads -> [B, S, H_r, Dh]
    const int64_t w = hr * dh_;
    at = 0;
    for (int i = 0; i < p_; ++i) {
      const int64_t si = tok_.count[i];
      for (int t = 0; t < 3; ++t)
        for (int64_t bi = 0; bi < b_; ++bi)
          ZI_TRY(copy_block(be_, z_, at + (t * b_ + bi) * si * w, w, *full[t],
                            (bi * s_ + tok_.first[i]) * w, w, si, w));
      at += recv[i];
    }
    if (hr > 0) ZI_TRY(be_.attention(qf_, kf_, vf_, ap, of_));  // every token, H_r heads
    // ---- heads -> tokens: to rank i, [B][S_i][H_r*Dh] ----
    at = 0;
    for (int i = 0; i < p_; ++i) {
      const int64_t si = tok_.count[i];
      for (int64_t bi = 0; bi < b_; ++bi)
        ZI_TRY(
            copy_block(be_, of_, (bi * s_ + tok_.first[i]) * w, w, z_, at + bi * si * w, w, si, w));
      send[i] = b_ * si * w;
      recv[i] = b_ * sr * head_.count[i] * dh_;
      at += send[i];
    }
    ZI_TRY(comm_.all_to_all_v(z_, send, a_, recv));
    // from rank j, [B*S_r][H_j*Dh] -> its heads' columns of o
    at = 0;
    for (int j = 0; j < p_; ++j) {
      const int64_t wj = head_.count[j] * dh_;
      ZI_TRY(copy_block(be_, a_, at, wj, o, head_.first[j] * dh_, hd, b_ * sr, wj));
      at += recv[j];
    }
    return Status::Ok();
  }

 private:
  Backend& be_;
  Communicator& comm_;
  int p_, r_;
  int64_t b_, s_, h_, dh_;
  Split tok_, head_;
  Tensor a_, z_, qf_, kf_, vf_, of_;
};

}  // namespace

Status ZImageDiT::forward_parallel(Communicator& comm, const Tensor& latents,
                                   const std::vector<float>& t_model,
                                   const std::vector<Tensor>& caps, Tensor& out) {
  if (comm.size() == 1) return forward(latents, t_model, caps, out);  // the ordinary path
  auto run = [&]() -> Status {
    ZI_ASSIGN_OR_RETURN(const std::vector<int64_t> cap_len,
                        check_inputs(latents, t_model, caps, out));
    const int64_t b = latents.dim(0), lh = latents.dim(2), lw = latents.dim(3);
    Tensor sin_host = timestep_sinusoid(t_model);  // [B, 256] f32
    if (!sin_host.defined()) return OutOfMemory("timestep sinusoid");
    ZI_ASSIGN_OR_RETURN(Layout lay, make_layout(b, lh, lw, cap_len));
    if (lay.np < comm.size())
      return InvalidArgument("transformer: " + std::to_string(lay.np) +
                             " image tokens cannot split over " + std::to_string(comm.size()) +
                             " ranks");
    ZI_ASSIGN_OR_RETURN(Tensor sinusoid, load::upload_host(be_, sin_host, be_.act_dtype()));
    // Every rank takes the same branch: the same communicator kind, backend kind and settings.
    if (!comm.recordable() || !use_graphs_ || no_graphs_ || streamer_)
      return compute_parallel(comm, lay, latents, sinusoid, caps, out);

    // Recorded (as forward): fixed buffers per input shape, recorded once on every rank at
    // once (the recording's warm-up run exchanges as an eager forward does), then replayed.
    std::vector<int64_t> key{b, lh, lw, comm.size()};
    key.insert(key.end(), cap_len.begin(), cap_len.end());
    auto it = par_graphs_.find(key);
    if (it == par_graphs_.end()) {
      if (par_graphs_.size() >= max_graphs_) par_graphs_.clear();
      Graphed g;
      g.layout = std::move(lay);
      ZI_ASSIGN_OR_RETURN(g.latents,
                          load::alloc(be_, DType::kF32, latents.shape(), "dit.graph_in"));
      ZI_ASSIGN_OR_RETURN(g.sinusoid,
                          load::alloc(be_, be_.act_dtype(), {b, kTimeFreqDim}, "dit.graph_t"));
      for (const Tensor& c : caps) {
        ZI_ASSIGN_OR_RETURN(Tensor cc, load::alloc(be_, c.dtype(), c.shape(), "dit.graph_caption"));
        g.caps.push_back(cc);
      }
      ZI_ASSIGN_OR_RETURN(g.out, load::alloc(be_, DType::kF32, out.shape(), "dit.graph_out"));
      it = par_graphs_.emplace(key, std::move(g)).first;
    }
    Graphed& g = it->second;
    ZI_TRY(be_.convert(latents, g.latents));
    for (size_t i = 0; i < caps.size(); ++i) ZI_TRY(be_.convert(caps[i], g.caps[i]));
    ZI_TRY(be_.convert(sinusoid, g.sinusoid));
    if (!g.work) {
      ZI_ASSIGN_OR_RETURN(g.work, be_.record([&] {
        return compute_parallel(comm, g.layout, g.latents, g.sinusoid, g.caps, g.out);
      }));
    }
    ZI_TRY(g.work->replay());
    return be_.convert(g.out, out);
  };
  Status st = run();
  if (!st.ok()) comm.abort(st);
  return st;
}

Status ZImageDiT::compute_parallel(Communicator& comm, const Layout& L, const Tensor& latents,
                                   const Tensor& sinusoid, const std::vector<Tensor>& caps,
                                   Tensor& out) {
  const int64_t p = cfg_.patch_size, d = cfg_.dim, half = cfg_.head_dim() / 2;
  const int64_t tf = cfg_.token_features();
  const int64_t b = L.b, n_img = L.n_img, np = L.np, lp_max = L.lp_max, s_max = L.s_max;
  const DType act = be_.act_dtype();
  const Tensor none;
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(2 * half));

  // ---- replicated on every rank: as compute() up to the unified sequence ----
  Tensor c;
  ZI_TRY(timestep_embedding(sinusoid, c));  // [B, adaln]
  ZI_ASSIGN_OR_RETURN(Tensor tokens, load::alloc(be_, act, {b, n_img, tf}, "dit.patches"));
  ZI_TRY(be_.patchify(latents, static_cast<int>(p), tokens));  // [B, N, p*p*C]
  ZI_ASSIGN_OR_RETURN(Tensor xe, load::alloc(be_, act, {b * n_img, d}, "dit.x_embed"));
  ZI_TRY(be_.matmul(tokens.view({b * n_img, tf}), x_w_, x_b_, xe));  // [B*N, D]
  tokens = Tensor();
  ZI_ASSIGN_OR_RETURN(Tensor x, load::alloc(be_, act, {b, np, d}, "dit.image_tokens"));
  for (int64_t i = 0; i < b; ++i) {
    ZI_TRY(be_.copy_2d(xe, i * n_img * d, d, x, i * np * d, d, n_img, d));  // real
    if (np > n_img)
      ZI_TRY(be_.copy_2d(x_pad_, 0, d, x, (i * np + n_img) * d, d, np - n_img, d));  // pads
  }
  xe = Tensor();
  const int r = comm.rank();
  // Blocks [first, last) (execution order) on this rank's tokens xr [B, S_r, D], Ulysses
  // attention through `uly` (attention over the whole sequence of S tokens).
  auto run_split = [&](int first, int last, Tensor& xr, const Tensor& freqs_r, const Tensor& cmod,
                       const AttentionParams& ap, Ulysses& uly) -> Status {
    ZI_ASSIGN_OR_RETURN(std::shared_ptr<Scratch> s, make_scratch(b, xr.dim(1)));
    const AttentionFn attn = [&uly](const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionParams& a,
                                    Tensor& o) { return uly.attention(q, k, v, a, o); };
    for (int bi = first; bi < last; ++bi) {
      ZI_ASSIGN_OR_RETURN(Block blk, use_block(bi));
      ZI_TRY(run_block(blk, xr, freqs_r, cmod, ap, *s, &attn));  // [B, S_r, D]
      ZI_TRY(done_block(bi));
    }
    return Status::Ok();
  };
  {  // noise refiner: split over the image tokens as well, then gathered whole
    Ulysses uly(be_, comm, b, np, cfg_.n_heads, cfg_.head_dim());
    ZI_TRY(uly.alloc());
    const int64_t t0 = uly.tokens().first[r], sr = uly.tokens().count[r];
    ZI_ASSIGN_OR_RETURN(Tensor xr, take_rows(be_, x, t0, sr));            // [B, S_r, D]
    ZI_ASSIGN_OR_RETURN(Tensor fr, take_rows(be_, L.img_freqs, t0, sr));  // [B, S_r, Dh/2, 2]
    const AttentionParams ap{attn_scale, false, {}};
    ZI_TRY(run_split(0, static_cast<int>(noise_refiner_.size()), xr, fr, c, ap, uly));
    ZI_TRY(gather_rows(be_, comm, uly.tokens(), xr, x));  // [B, Np, D] on every rank
  }
  ZI_ASSIGN_OR_RETURN(Tensor cap, load::alloc(be_, act, {b, lp_max, d}, "dit.caption_tokens"));
  if (L.ragged) ZI_TRY(be_.fill(cap, 0.0f));
  for (int64_t i = 0; i < b; ++i) {
    ZI_ASSIGN_OR_RETURN(Tensor cn,
                        load::alloc(be_, act, {L.cap_len[i], cfg_.cap_feat_dim}, "dit.cap_norm"));
    ZI_TRY(be_.rms_norm(caps[i], cap_norm_, cfg_.norm_eps, none, cn));  // [L_i, Fc]
    Tensor rows = cap.view({b * lp_max, d}).slice0(i * lp_max, i * lp_max + L.cap_len[i]);
    ZI_TRY(be_.matmul(cn, cap_w_, cap_b_, rows));  // [L_i, D]
    if (L.cap_pad[i] > L.cap_len[i])
      ZI_TRY(be_.copy_2d(cap_pad_, 0, d, cap, (i * lp_max + L.cap_len[i]) * d, d,
                         L.cap_pad[i] - L.cap_len[i], d));  // pads
  }
  {
    ZI_ASSIGN_OR_RETURN(std::shared_ptr<Scratch> s, make_scratch(b, lp_max));
    AttentionParams ap{attn_scale, false, {}};
    if (L.ragged)
      for (int64_t i = 0; i < b; ++i) ap.key_len.push_back(static_cast<int32_t>(L.cap_pad[i]));
    for (size_t l = 0; l < context_refiner_.size(); ++l) {
      const int bi = static_cast<int>(noise_refiner_.size() + l);
      ZI_ASSIGN_OR_RETURN(Block blk, use_block(bi));
      ZI_TRY(run_block(blk, cap, L.cap_freqs, none, ap, *s));  // [B, Lp, D]
      ZI_TRY(done_block(bi));
    }
  }
  ZI_ASSIGN_OR_RETURN(Tensor u, load::alloc(be_, act, {b, s_max, d}, "dit.unified"));
  if (L.ragged) ZI_TRY(be_.fill(u, 0.0f));
  for (int64_t i = 0; i < b; ++i) {
    ZI_TRY(be_.copy_2d(x, i * np * d, d, u, i * s_max * d, d, np, d));  // image
    ZI_TRY(be_.copy_2d(cap, i * lp_max * d, d, u, (i * s_max + np) * d, d, L.cap_pad[i], d));
  }
  x = Tensor();
  cap = Tensor();

  // ---- this rank's tokens through the main layers ----
  Ulysses uly(be_, comm, b, s_max, cfg_.n_heads, cfg_.head_dim());
  ZI_TRY(uly.alloc());
  const int64_t t0 = uly.tokens().first[r], sr = uly.tokens().count[r];
  ZI_ASSIGN_OR_RETURN(Tensor ur, take_rows(be_, u, t0, sr));            // [B, S_r, D]
  ZI_ASSIGN_OR_RETURN(Tensor fr, take_rows(be_, L.uni_freqs, t0, sr));  // [B, S_r, Dh/2, 2]
  u = Tensor();
  {
    AttentionParams ap{attn_scale, false, {}};
    if (L.ragged)
      for (int64_t i = 0; i < b; ++i) ap.key_len.push_back(static_cast<int32_t>(L.seq[i]));
    const int first = static_cast<int>(noise_refiner_.size() + context_refiner_.size());
    ZI_TRY(run_split(first, first + static_cast<int>(layers_.size()), ur, fr, c, ap, uly));
  }

  // ---- final layer on this rank's tokens, gathered: LayerNorm ⊙ (1 + scale), Linear ----
  ZI_ASSIGN_OR_RETURN(Tensor sc, load::alloc(be_, act, {b, cfg_.adaln_dim()}, "dit.final_silu"));
  ZI_TRY(be_.silu(c, sc));  // [B, adaln]
  ZI_ASSIGN_OR_RETURN(Tensor scale, load::alloc(be_, act, {b, d}, "dit.final_scale"));
  ZI_TRY(be_.matmul(sc, final_ada_w_, final_ada_b_, scale));  // [B, D]
  ZI_TRY(be_.add(scale, ones_, scale));                       // 1 + scale
  ZI_ASSIGN_OR_RETURN(Tensor y, load::alloc(be_, act, {b * sr, d}, "dit.final_norm"));
  ZI_TRY(be_.layer_norm(ur.view({b * sr, d}), none, none, kFinalNormEps, scale, y));  // [B*S_r, D]
  ZI_ASSIGN_OR_RETURN(Tensor o, load::alloc(be_, act, {b * sr, tf}, "dit.final"));
  ZI_TRY(be_.matmul(y, final_w_, final_b_, o));  // [B*S_r, p*p*C]
  ZI_ASSIGN_OR_RETURN(Tensor whole, load::alloc(be_, act, {b, s_max, tf}, "dit.final_whole"));
  ZI_TRY(gather_rows(be_, comm, uly.tokens(), o.view({b, sr, tf}), whole));  // [B, S, p*p*C]
  return be_.unpatchify(whole, static_cast<int>(p), 1.0f, out);              // [B, C, h, w] f32
}

}  // namespace zimage
