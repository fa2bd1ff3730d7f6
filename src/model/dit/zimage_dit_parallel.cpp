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
                        check_inputs(latents, t_model, &caps, nullptr, out));
    // This forward runs the context refiner itself: a refined forward before it may have told
    // the streamer to pass over those blocks.
    ZI_TRY(skip_streamed_context(false));
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
      ZI_TRY(alloc_graph_buffers(latents, caps, out, g));
      it = par_graphs_.emplace(key, std::move(g)).first;
    }
    Graphed& g = it->second;
    ZI_TRY(be_.convert(latents, g.latents));
    for (size_t i = 0; i < caps.size(); ++i) ZI_TRY(be_.convert(caps[i], g.caps[i]));
    ZI_TRY(be_.convert(sinusoid, g.sinusoid));
    if (!g.work) {  // the recording's warm-up run leaves the results: no replay this time
      ZI_ASSIGN_OR_RETURN(g.work, be_.record([&] {
        return compute_parallel(comm, g.layout, g.latents, g.sinusoid, g.caps, g.out);
      }));
    } else {
      ZI_TRY(g.work->replay());
    }
    return be_.convert(g.out, out);
  };
  Status st = run();
  if (!st.ok()) comm.abort(st);
  return st;
}

Status ZImageDiT::compute_parallel(Communicator& comm, const Layout& L, const Tensor& latents,
                                   const Tensor& sinusoid, const std::vector<Tensor>& caps,
                                   Tensor& out) {
  const int64_t b = L.b, s_max = L.s_max, tf = cfg_.token_features();
  const int r = comm.rank();
  // The blocks of `st` on this rank's tokens xr [B, S_r, D], Ulysses attention through `uly`
  // (attention over the whole sequence of S tokens).
  Pass P{L, Tensor(), nullptr, {}, nullptr};
  auto run_split = [&](Stage st, Tensor& xr, const Tensor& freqs_r, Ulysses& uly) -> Status {
    ZI_ASSIGN_OR_RETURN(std::shared_ptr<Scratch> s, make_scratch(b, xr.dim(1)));
    const AttentionFn attn = [&uly](const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionParams& a,
                                    Tensor& o) { return uly.attention(q, k, v, a, o); };
    return run_stage(P, st, xr, freqs_r, *s, &attn);  // [B, S_r, D]
  };

  // ---- replicated on every rank: as compute() up to the unified sequence ----
  ZI_TRY(timestep_embedding(sinusoid, P.c));                     // [B, adaln]
  ZI_TRY(modulate_all(P));                                       // every block's modulation
  ZI_ASSIGN_OR_RETURN(Tensor tokens, patch_tokens(L, latents));  // [B, N, p*p*C]
  ZI_ASSIGN_OR_RETURN(Tensor x, embed_image(L, tokens));         // [B, Np, D]
  tokens = Tensor();
  {  // noise refiner: split over the image tokens as well, then gathered whole
    Ulysses uly(be_, comm, b, L.np, cfg_.n_heads, cfg_.head_dim());
    ZI_TRY(uly.alloc());
    const int64_t t0 = uly.tokens().first[r], sr = uly.tokens().count[r];
    ZI_ASSIGN_OR_RETURN(Tensor xr, take_rows(be_, x, t0, sr));            // [B, S_r, D]
    ZI_ASSIGN_OR_RETURN(Tensor fr, take_rows(be_, L.img_freqs, t0, sr));  // [B, S_r, Dh/2, 2]
    ZI_TRY(run_split(Stage::kNoiseRefiner, xr, fr, uly));
    ZI_TRY(gather_rows(be_, comm, uly.tokens(), xr, x));  // [B, Np, D] on every rank
  }
  ZI_ASSIGN_OR_RETURN(Tensor cap, embed_caption(L, caps));  // [B, Lp, D]
  {
    ZI_ASSIGN_OR_RETURN(std::shared_ptr<Scratch> s, make_scratch(b, L.lp_max));
    ZI_TRY(run_stage(P, Stage::kContextRefiner, cap, L.cap_freqs, *s));  // [B, Lp, D]
  }
  ZI_ASSIGN_OR_RETURN(Tensor u, unify(L, std::move(x), std::move(cap)));  // [B, S, D]

  // ---- this rank's tokens through the main layers ----
  Ulysses uly(be_, comm, b, s_max, cfg_.n_heads, cfg_.head_dim());
  ZI_TRY(uly.alloc());
  const int64_t t0 = uly.tokens().first[r], sr = uly.tokens().count[r];
  ZI_ASSIGN_OR_RETURN(Tensor ur, take_rows(be_, u, t0, sr));            // [B, S_r, D]
  ZI_ASSIGN_OR_RETURN(Tensor fr, take_rows(be_, L.uni_freqs, t0, sr));  // [B, S_r, Dh/2, 2]
  u = Tensor();
  ZI_TRY(run_split(Stage::kLayers, ur, fr, uly));

  // ---- final layer on this rank's tokens, gathered ----
  ZI_ASSIGN_OR_RETURN(Tensor o, final_layer(ur, P.c));  // [B, S_r, p*p*C]
  ZI_ASSIGN_OR_RETURN(Tensor whole,
                      load::alloc(be_, be_.act_dtype(), {b, s_max, tf}, "dit.final_whole"));
  ZI_TRY(gather_rows(be_, comm, uly.tokens(), o, whole));                      // [B, S, p*p*C]
  return be_.unpatchify(whole, static_cast<int>(cfg_.patch_size), 1.0f, out);  // [B, C, h, w] f32
}

}  // namespace zimage
