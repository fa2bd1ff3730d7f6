// ZImageDiT's caption side (spec §4): cap_embedder and pad tokens, the context refiner, their
// RoPE rows, and the caption tokens refined once for a denoising loop (refine_captions,
// forward_refined; the rest of forward is zimage_dit.cpp).
#include <algorithm>
#include <atomic>

#include "model/common/load_util.h"
#include "model/dit/zimage_dit.h"

namespace zimage {

Result<Tensor> ZImageDiT::caption_rope_host(const std::vector<int64_t>& cap_len,
                                            const std::vector<int64_t>& cap_pad,
                                            int64_t lp_max) const {
  const int64_t b = static_cast<int64_t>(cap_len.size()), half = cfg_.head_dim() / 2;
  Tensor cap_f = Tensor::host(DType::kF32, {b, lp_max, half, 2});  // batch-padding rows stay 0
  if (!cap_f.defined()) return OutOfMemory("transformer RoPE tables");
  for (int64_t i = 0; i < b; ++i) {
    float* fc = cap_f.data_as<float>() + i * lp_max * half * 2;
    for (int64_t j = 0; j < cap_pad[i]; ++j) {  // caption token j (pads included) -> (1 + j, 0, 0)
      if (!rope_row(1 + j, 0, 0, fc + j * half * 2)) {
        return InvalidArgument(
            "transformer: caption of " + std::to_string(cap_len[i]) +
            " tokens exceeds RoPE axes_lens[0] = " + std::to_string(cfg_.axes_lens[0]));
      }
    }
  }
  return cap_f;
}

Result<ZImageDiT::Layout> ZImageDiT::caption_layout(const std::vector<int64_t>& cap_len,
                                                    Tensor* host) {
  Layout L;
  L.b = static_cast<int64_t>(cap_len.size());
  L.cap_len = cap_len;
  L.cap_pad.resize(cap_len.size());
  for (size_t i = 0; i < cap_len.size(); ++i) L.cap_pad[i] = padded(cap_len[i]);
  L.lp_max = *std::max_element(L.cap_pad.begin(), L.cap_pad.end());
  for (int64_t pad : L.cap_pad) L.ragged = L.ragged || pad != L.lp_max;
  ZI_ASSIGN_OR_RETURN(Tensor cap_f, caption_rope_host(cap_len, L.cap_pad, L.lp_max));
  ZI_ASSIGN_OR_RETURN(L.cap_freqs, load::upload_host(be_, cap_f, DType::kF32));
  if (host != nullptr) *host = std::move(cap_f);
  return L;
}

Result<Tensor> ZImageDiT::embed_caption(const Layout& L, const std::vector<Tensor>& caps) {
  const int64_t b = L.b, lp_max = L.lp_max, d = cfg_.dim;
  const DType act = be_.act_dtype();
  const Tensor none;
  ZI_ASSIGN_OR_RETURN(Tensor cap, load::alloc(be_, act, {b, lp_max, d}, "dit.caption_tokens"));
  if (L.ragged) ZI_TRY(be_.fill(cap, 0.0f));
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = L.cap_len[i], pad = L.cap_pad[i];
    ZI_ASSIGN_OR_RETURN(Tensor cn, load::alloc(be_, act, {len, cfg_.cap_feat_dim}, "dit.cap_norm"));
    ZI_TRY(be_.rms_norm(caps[i], cap_norm_, cfg_.norm_eps, none, cn));  // [L_i, Fc]
    Tensor rows = cap.view({b * lp_max, d}).slice0(i * lp_max, i * lp_max + len);
    ZI_TRY(be_.matmul(cn, cap_w_, cap_b_, rows));  // [L_i, D]
    if (pad > len)
      ZI_TRY(be_.copy_2d(cap_pad_, 0, d, cap, (i * lp_max + len) * d, d, pad - len, d));  // pads
  }
  return cap;
}

Result<Tensor> ZImageDiT::caption_tokens(const Pass& P, const std::vector<Tensor>& caps,
                                         const Scratch& scratch) {
  ZI_ASSIGN_OR_RETURN(Tensor cap, embed_caption(P.L, caps));  // [B, Lp, D]
  debug_tensor(P.dbg, P.pfx + ".cap_embed", be_, cap);
  ZI_TRY(run_stage(P, Stage::kContextRefiner, cap, P.L.cap_freqs, scratch));
  return cap;
}

Status ZImageDiT::forward_refined(const Tensor& latents, const std::vector<float>& t_model,
                                  const RefinedCaptions& caps, Tensor& out, DebugSink* dbg,
                                  const std::string& pfx, const ControlResiduals* control) {
  return forward_impl(latents, t_model, nullptr, &caps, out, dbg, pfx, control);
}

uint64_t ZImageDiT::next_weights_version() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

Status ZImageDiT::skip_streamed_context(bool skip) {
  if (!streamer_) return Status::Ok();
  std::vector<bool> skipped(static_cast<size_t>(streamer_->units()), false);
  const int first = static_cast<int>(noise_refiner_.size());
  for (int i = 0; skip && i < static_cast<int>(context_refiner_.size()); ++i)
    if (const int unit = unit_of_block_[first + i]; unit >= 0) skipped[unit] = true;
  return streamer_->set_skipped(std::move(skipped));
}

Result<ZImageDiT::RefinedCaptions> ZImageDiT::refine_captions(const std::vector<Tensor>& caps,
                                                              DebugSink* dbg,
                                                              const std::string& pfx) {
  ZI_ASSIGN_OR_RETURN(std::vector<int64_t> cap_len, check_captions(caps));
  ZI_ASSIGN_OR_RETURN(Layout L, caption_layout(cap_len));
  // Eager, once per loop (a few dozen ops): in a scratch for the captions' rows only.
  ZI_ASSIGN_OR_RETURN(std::shared_ptr<Scratch> scratch, make_scratch(L.b, L.lp_max));
  Pass P{L, Tensor(), dbg, pfx, nullptr};
  RefinedCaptions r;
  refining_ = true;
  auto tokens = caption_tokens(P, caps, *scratch);
  refining_ = false;
  if (!tokens.ok()) return tokens.status();
  r.tokens = std::move(tokens).value();
  ++caption_refinements_;
  r.cap_len = std::move(cap_len);
  r.weights_version = weights_version_;
  return r;
}

Result<std::vector<int64_t>> ZImageDiT::check_captions(const std::vector<Tensor>& caps) const {
  if (caps.empty()) return InvalidArgument("transformer: no caption tensors");
  std::vector<int64_t> cap_len(caps.size());
  for (size_t i = 0; i < caps.size(); ++i) {
    const Tensor& c = caps[i];
    if (!c.defined() || c.rank() != 2 || c.dim(1) != cfg_.cap_feat_dim || c.dim(0) < 1) {
      return InvalidArgument("transformer: caption " + std::to_string(i) + " must be [L, " +
                             std::to_string(cfg_.cap_feat_dim) + "] with L >= 1, got " +
                             (c.defined() ? c.describe() : std::string("undefined")));
    }
    cap_len[i] = c.dim(0);
  }
  return cap_len;
}

Status ZImageDiT::check_refined(const RefinedCaptions& r, int64_t b) const {
  const int64_t n = static_cast<int64_t>(r.cap_len.size());
  if (!r.defined() || n != b)
    return InvalidArgument("transformer: batch " + std::to_string(b) +
                           " but refined captions for " + std::to_string(r.defined() ? n : 0) +
                           " (refine_captions makes them)");
  int64_t lp_max = 0;
  for (int64_t len : r.cap_len) {
    if (len < 1) return InvalidArgument("transformer: refined captions of an empty caption");
    lp_max = std::max(lp_max, padded(len));
  }
  const Shape want{b, lp_max, cfg_.dim};
  if (r.tokens.shape() != want || r.tokens.dtype() != be_.act_dtype())
    return InvalidArgument("transformer: refined caption tokens must be " + shape_string(want) +
                           " in the act dtype, got " + r.tokens.describe());
  if (r.weights_version != weights_version_)
    return InvalidArgument(
        "transformer: refined captions made before the weights changed (runtime LoRAs set or "
        "taken off since): refine them again");
  return Status::Ok();
}

}  // namespace zimage
