// The text-to-image loop, step for step as diffusers' ZImagePipeline.__call__ runs it (see
// text_to_image.h for the data flow). Latents, the scheduler and the CFG arithmetic are float32
// on the host, exactly as the reference keeps them; only the models run on the backend.
#include "pipeline/text_to_image.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include "core/log.h"
#include "core/text.h"
#include "pipeline/controlnet.h"
#include "pipeline/finite_check.h"
#include "pipeline/host_dump.h"
#include "pipeline/latent_preview.h"
#include "pipeline/rng.h"
#include "pipeline/scheduler.h"

namespace zimage {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void dump_ids(DebugSink* dbg, Backend& host, const std::string& name,
              const std::vector<int32_t>& ids) {
  if (dbg == nullptr || !dbg->wants(name)) return;
  std::vector<float> f(ids.begin(), ids.end());  // ids < 2^24: exact in float
  dump_host(dbg, host, name, f.data(), {static_cast<int64_t>(f.size())});
}

}  // namespace

uint8_t to_u8(float x) {
  const float v = std::nearbyint(x * 255.0f);  // default rounding mode: ties to even
  if (!(v > 0.0f)) return 0;                   // also NaN
  if (v >= 255.0f) return 255;
  return static_cast<uint8_t>(v);
}

TextToImage::TextToImage(TextToImageComponents parts, Backend& be)
    : c_(std::move(parts)),
      be_(be),
      host_(make_cpu_backend(1)),
      noise_pool_(std::make_unique<ThreadPool>(
          static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)))) {}

Result<std::unique_ptr<TextToImage>> TextToImage::create(TextToImageComponents parts, Backend& be) {
  if (!parts.tokenizer || !parts.text_encoder || !parts.transformer || !parts.vae)
    return InvalidArgument("text-to-image pipeline: a component is missing");
  const TransformerConfig& tc = parts.transformer->config();
  if (parts.text_encoder->config().hidden_size != tc.cap_feat_dim) {
    return FormatError("text encoder hidden_size " +
                       std::to_string(parts.text_encoder->config().hidden_size) +
                       " != transformer cap_feat_dim " + std::to_string(tc.cap_feat_dim));
  }
  if (parts.vae->config().latent_channels != tc.in_channels) {
    return FormatError("vae latent_channels " +
                       std::to_string(parts.vae->config().latent_channels) +
                       " != transformer in_channels " + std::to_string(tc.in_channels));
  }
  // Switches read here, so that every way of making a pipeline (load, the benchmarks' own
  // assembly) honours them (env_switch: unset keeps the setting, 0 or 1 sets it).
  // ZIMAGE_CAPTION_CACHE=0: every step's forward refines its captions itself (the A/B switch of
  // set_refine_captions_once; the images are the same bits either way).
  bool refine_once = true;
  ZI_TRY(env_switch("ZIMAGE_CAPTION_CACHE", refine_once));
  // ZIMAGE_DIT_GRAPHS=0: every DiT forward eager, none recorded (to weigh a recording's cost,
  // ~20 ms at the first step, against what replaying saves over a few steps).
  bool graphs = parts.transformer->use_graphs();
  ZI_TRY(env_switch("ZIMAGE_DIT_GRAPHS", graphs));
  parts.transformer->set_use_graphs(graphs);
  std::unique_ptr<TextToImage> p(new TextToImage(std::move(parts), be));
  p->set_refine_captions_once(refine_once);
  return p;
}

int TextToImage::vae_factor() const {
  return c_.vae->config().spatial_factor();
}
int TextToImage::size_multiple() const {
  return vae_factor() * c_.transformer->config().patch_size;
}
int TextToImage::latent_channels() const {
  return c_.transformer->config().in_channels;
}
int TextToImage::max_image_tokens_side() const {
  const auto& lens = c_.transformer->config().axes_lens;
  return lens.size() >= 3 ? std::min(lens[1], lens[2]) : 0;
}

Status TextToImage::check(const GenerateRequest& req) const {
  const int m = size_multiple();
  if (req.width <= 0 || req.width % m != 0)
    return FieldError("width", std::to_string(req.width) + " must be a positive multiple of " +
                                   std::to_string(m) + " for this model");
  if (req.height <= 0 || req.height % m != 0)
    return FieldError("height", std::to_string(req.height) + " must be a positive multiple of " +
                                    std::to_string(m) + " for this model");
  const int side = max_image_tokens_side() * m;
  if (req.width > side) {
    return FieldError(
        "width", std::to_string(req.width) + " exceeds the model's limit " + std::to_string(side));
  }
  if (req.height > side) {
    return FieldError("height", std::to_string(req.height) + " exceeds the model's limit " +
                                    std::to_string(side));
  }
  if (req.prompts.empty()) return FieldError("prompts", "at least one prompt is needed");
  if (req.images_per_prompt < 1) return FieldError("images_per_prompt", "must be at least 1");
  if (req.max_sequence_length < 1) return FieldError("max_sequence_length", "must be at least 1");
  if (req.steps < 1) return FieldError("steps", "must be at least 1");
  ZI_TRY(check_control(req));
  // Prompt length against the DiT's position limit, before anything runs. Prompts are cut at
  // max_sequence_length tokens, so only a limit below that needs the tokenizer.
  const int64_t limit = c_.transformer->max_caption_tokens();
  if (req.max_sequence_length > limit) {
    const auto check_prompt = [&](const std::string& text, const std::string& field) -> Status {
      auto ids = encode_prompt(*c_.tokenizer, text, req.max_sequence_length);
      if (!ids.ok()) return ids.status().with_context(field).with_field(field);
      if (static_cast<int64_t>(ids->size()) > limit) {
        return FieldError(
            field,
            std::to_string(ids->size()) + " tokens (chat template included) exceed this model's " +
                "limit of " + std::to_string(limit) + " (transformer axes_lens[0] = " +
                std::to_string(c_.transformer->config().axes_lens[0]) +
                "); shorten it or set max_sequence_length to at most " + std::to_string(limit));
      }
      return Status::Ok();
    };
    for (size_t i = 0; i < req.prompts.size(); ++i)
      ZI_TRY(check_prompt(req.prompts[i], "prompts[" + std::to_string(i) + "]"));
    if (req.guidance > 0.0f)
      ZI_TRY(check_prompt(req.negative_prompt.value_or(""), "negative_prompt"));
  }
  return Status::Ok();
}

Result<std::vector<Tensor>> TextToImage::encode_prompts(const GenerateRequest& req, bool cfg,
                                                        const TextToImageHooks& hooks,
                                                        PhaseTimings& t, double start_s,
                                                        double& encoder_t0) {
  // Tokenize: chat template, ids, right truncation at max_sequence_length (spec §3.1-3.2).
  double t0 = now_s();
  std::vector<std::vector<int32_t>> ids;
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    auto r = encode_prompt(*c_.tokenizer, req.prompts[i], req.max_sequence_length);
    if (!r.ok()) {
      const std::string field = "prompts[" + std::to_string(i) + "]";
      return r.status().with_context(field).with_field(field);
    }
    dump_ids(hooks.debug, *host_, "tokens." + std::to_string(i), r.value());
    ids.push_back(std::move(r).value());
  }
  if (cfg) {  // one negative prompt serves every prompt (diffusers repeats it per prompt)
    auto r =
        encode_prompt(*c_.tokenizer, req.negative_prompt.value_or(""), req.max_sequence_length);
    if (!r.ok()) return r.status().with_context("negative_prompt").with_field("negative_prompt");
    dump_ids(hooks.debug, *host_, "tokens.negative", r.value());
    ids.push_back(std::move(r).value());
  }
  t.tokenize_s = now_s() - t0;

  if (hooks.cancel != nullptr && hooks.cancel->load())
    return Cancelled("generation cancelled before the text encoder");
  if (hooks.on_progress) hooks.on_progress({Phase::kTextEncoder, 0, 0, now_s() - start_s});
  // Positives and the negative run as one right-padded batch: causal attention makes each
  // prompt's real-token outputs independent of the others (spec §3.2).
  encoder_t0 = now_s();
  ZI_ASSIGN_OR_RETURN(std::vector<Tensor> embeds, c_.text_encoder->encode(ids, hooks.debug));
  if (embeds.size() != ids.size())
    return InternalError("text encoder returned " + std::to_string(embeds.size()) +
                         " embeddings for " + std::to_string(ids.size()) + " prompts");
  return embeds;
}

Status TextToImage::finish_text_encoder(const std::vector<Tensor>& embeds, bool cfg,
                                        const TextToImageHooks& hooks, PhaseTimings& t,
                                        double encoder_t0) {
  ZI_TRY(be_.synchronize());
  t.text_encoder_s = now_s() - encoder_t0;
  for (size_t i = 0; i < embeds.size(); ++i) {
    const bool neg = cfg && i + 1 == embeds.size();
    const std::string name = neg ? "negative_embeds" : "prompt_embeds." + std::to_string(i);
    debug_tensor(hooks.debug, name, be_, embeds[i]);
  }
  return Status::Ok();
}

Result<std::unique_ptr<DenoiseState>> TextToImage::begin(const GenerateRequest& req,
                                                         const TextToImageHooks& hooks) {
  // A request that ended without finish() (cancelled, failed) leaves its caption tokens here:
  // they go before this one's text encoder runs. A request still denoising beside this one
  // refines its captions once more at its next step (~0.4 ms at 1024²).
  caption_cache_ = CaptionCache();
  auto st = std::make_unique<DenoiseState>();
  st->start_s = now_s();
  ZI_TRY(check(req));
  st->req = req;
  st->hooks = hooks;
  auto cancelled = [&] { return hooks.cancel != nullptr && hooks.cancel->load(); };
  auto report = [&](Phase ph, int step, int total) {
    if (hooks.on_progress) hooks.on_progress({ph, step, total, now_s() - st->start_s});
  };
  st->cfg = req.guidance > 0.0f;  // diffusers: do_classifier_free_guidance = scale > 0

  // The latent's size and the schedule first: nothing fails between the text encoder's start and
  // its wait but the noise below.
  st->n = static_cast<int64_t>(req.prompts.size()) * req.images_per_prompt;
  st->channels = latent_channels();
  st->h = req.height / vae_factor();
  st->w = req.width / vae_factor();
  const int64_t p = c_.transformer->config().patch_size;
  ZI_ASSIGN_OR_RETURN(
      FlowMatchEulerScheduler sched,
      FlowMatchEulerScheduler::create(c_.scheduler, req.steps, (st->h / p) * (st->w / p)));
  st->scheduler = std::move(sched);

  // 1-2. Tokenize and encode the prompts (and the negative prompt under CFG).
  if (cancelled()) return Cancelled("generation cancelled before it started");
  report(Phase::kTokenize, 0, 0);
  double encoder_t0 = 0;
  ZI_ASSIGN_OR_RETURN(st->embeds,
                      encode_prompts(req, st->cfg, hooks, st->timings, st->start_s, encoder_t0));

  // 3. Noise: ONE generator per request, [n, C, h, w] in one call (diffusers' prepare_latents):
  // a request's noise does not depend on what it is batched with.
  TorchCpuGenerator gen(req.seed);
  const bool image_start = req.control_image || req.init_image;
  Tensor noise;
  if (!image_start) {
    // Text to image: the noise is made on the host while the backend runs the text encoder
    // (~5 ms of torch's Box-Muller for a 1024² latent, as long as the encoder at 35 tokens). A
    // failure here still waits for the encoder (its own error first), so none of its work or
    // its faults reach the next request.
    Status made = gen.skip_images(req.first_image, st->channels * st->h * st->w);
    if (made.ok()) {
      auto r = gen.randn({st->n, st->channels, st->h, st->w}, noise_pool_.get());
      if (r.ok())
        noise = std::move(r).value();
      else
        made = r.status();
    }
    if (!made.ok()) {
      const Status waited = be_.synchronize();
      return waited.ok() ? made : waited;
    }
  }
  ZI_TRY(finish_text_encoder(st->embeds, st->cfg, hooks, st->timings, encoder_t0));
  if (req.control_image) {
    // ControlNet (pipeline/controlnet.h): the control context from the posterior means (no draw),
    // then the text-to-image noise; with init_image and mask that is ControlNet inpainting.
    if (cancelled()) return Cancelled("generation cancelled before the VAE encode");
    report(Phase::kVaeEncode, 0, 0);
    const double t0 = now_s();
    ZI_ASSIGN_OR_RETURN(VaeEncoder * enc, vae_encoder());
    ZI_ASSIGN_OR_RETURN(Tensor ctx, prepare_control_context(
                                        req, controlnet_->config().control_in_dim, *enc, be_,
                                        {st->n, st->channels, st->h, st->w}, hooks.debug, *host_));
    ZI_ASSIGN_OR_RETURN(st->control, be_.upload(ctx, DType::kF32));
    st->timings.vae_encode_s = now_s() - t0;
    ZI_TRY(gen.skip_images(req.first_image, st->channels * st->h * st->w));
    ZI_ASSIGN_OR_RETURN(noise, gen.randn({st->n, st->channels, st->h, st->w}, noise_pool_.get()));
    dump_host(hooks.debug, *host_, "init_noise", noise.data_as<float>(), noise.shape());
    ZI_ASSIGN_OR_RETURN(st->latents, be_.upload(noise, DType::kF32));
  } else if (req.init_image) {
    // Image-to-image / inpainting: the same generator first samples the image's posterior, then
    // draws the noise (pipeline/image_to_image.h has the order).
    if (cancelled()) return Cancelled("generation cancelled before the VAE encode");
    report(Phase::kVaeEncode, 0, 0);
    const double t0 = now_s();
    ZI_ASSIGN_OR_RETURN(VaeEncoder * enc, vae_encoder());
    ZI_ASSIGN_OR_RETURN(ImageStart start, prepare_image_start(req, *st->scheduler, *enc, be_, gen,
                                                              {st->n, st->channels, st->h, st->w},
                                                              hooks.debug, *host_));
    st->timings.vae_encode_s = now_s() - t0;
    st->first_step = start.first_step;
    st->step = start.first_step;
    st->inpaint = std::move(start.inpaint);
    ZI_ASSIGN_OR_RETURN(st->latents, be_.upload(start.latents, DType::kF32));
  } else {
    dump_host(hooks.debug, *host_, "init_noise", noise.data_as<float>(), noise.shape());
    ZI_ASSIGN_OR_RETURN(st->latents, be_.upload(noise, DType::kF32));
  }
  if (cancelled()) return Cancelled("generation cancelled before denoising");
  report(Phase::kDenoise, 0, st->steps_total());
  return st;
}

Status TextToImage::step(const std::vector<DenoiseState*>& states) {
  if (states.empty()) return Status::Ok();
  const DenoiseState& first = *states.front();
  const double t0 = now_s();
  ZI_ASSIGN_OR_RETURN(const StepBatch batch, step_batch(states));
  // DiT input: every state's latents (twice under CFG), in row order, copied on the backend.
  ZI_ASSIGN_OR_RETURN(Tensor in, stack_rows(batch, &DenoiseState::latents));
  // A single request keeps its own debug sink and names; a batch runs without dumps. Steps are
  // named and reported by their number in the request's loop (diffusers' i), which starts at 0
  // also when an init image skips the first t_start steps of the schedule.
  DebugSink* dbg = batch.parts.size() == 1 ? first.hooks.debug : nullptr;
  const std::string step_name = "step" + std::to_string(first.steps_done());
  ControlResiduals residuals;
  const bool control = first.control.defined();
  // The caption tokens, refined once per batch of captions where the forward reads them (not with
  // dumps, which each step makes, nor when the forward is split over several GPUs).
  const ZImageDiT::RefinedCaptions* refined = nullptr;
  if (refine_once_ && dbg == nullptr && !split_forward(control)) {
    auto r = refined_captions(batch);
    if (!r.ok())
      return r.status().with_context("denoising step " + std::to_string(first.steps_done()));
    refined = *r;
  }
  if (control) ZI_TRY(control_residuals(batch, in, dbg, step_name, refined, residuals));
  Tensor out;
  ZI_TRY(dit_forward(batch, in, control ? &residuals : nullptr, dbg, step_name, refined, out));
  residuals = ControlResiduals();
  in = Tensor();

  // NaN/Inf never reach the image silently (a black picture): one count over the whole output,
  // read back with the step's only synchronisation; per request only when it is not zero.
  ZI_ASSIGN_OR_RETURN(const int64_t bad_total, be_.count_nonfinite(out));
  for (const StepPart& pt : batch.parts) {
    Tensor o = out.slice0(pt.row0, pt.row0 + pt.rows);  // [rows, C, h, w]
    debug_tensor(pt.st->hooks.debug, "dit_out.step" + std::to_string(pt.st->steps_done()), be_, o);
    if (bad_total > 0) ZI_TRY(check_dit_output(*pt.st, o));
    ZI_TRY(advance(pt, o));
  }
  const double took = now_s() - t0;
  for (const StepPart& pt : batch.parts) {
    DenoiseState& st = *pt.st;
    st.timings.dit_s.push_back(took);
    if (st.hooks.on_progress)
      st.hooks.on_progress(
          {Phase::kDenoise, st.steps_done(), st.steps_total(), now_s() - st.start_s});
    // Only a request that asked pays for its preview (a projection and a w·h·3-byte download).
    if (st.hooks.on_preview &&
        (st.hooks.preview_enabled == nullptr || st.hooks.preview_enabled->load())) {
      ZI_ASSIGN_OR_RETURN(Preview p,
                          latent_preview(be_, st.latents, st.steps_done(), st.steps_total()));
      st.hooks.on_preview(p);
    }
  }
  return Status::Ok();
}

Result<TextToImage::StepBatch> TextToImage::step_batch(
    const std::vector<DenoiseState*>& states) const {
  const DenoiseState& first = *states.front();
  const int64_t ch = first.channels, h = first.h, w = first.w;
  StepBatch batch;
  for (DenoiseState* st : states) {
    if (st == nullptr || st->done() || st->h != h || st->w != w || st->channels != ch)
      return InvalidArgument("denoising step: states must be unfinished and of one latent size");
    const int i = st->step;
    const float g =
        st->cfg ? st->scheduler->guidance_at(i, st->req.guidance, st->req.cfg_truncation) : 0.0f;
    const int64_t n = st->n, per = st->req.images_per_prompt;
    const int64_t r = g > 0.0f ? 2 * n : n;
    batch.parts.push_back({st, batch.rows, r, g});
    for (int64_t k = 0; k < r; ++k) {
      batch.t_model.push_back(st->scheduler->model_time(i));
      // Caption of row k: prompt k/per's embedding (p0, p0, p1, p1, ...), the negative after n.
      batch.caps.push_back(k < n ? st->embeds[static_cast<size_t>(k / per)] : st->embeds.back());
    }
    batch.rows += r;
  }
  // ControlNet requests batch only with each other, at one control scale.
  if (first.control.defined()) {
    if (!controlnet_) return InvalidArgument("control_image: no ControlNet loaded");
    for (const StepPart& pt : batch.parts)
      if (!pt.st->control.defined() || pt.st->req.control_scale != first.req.control_scale)
        return InvalidArgument(
            "denoising step: ControlNet requests batch only with each other, "
            "at one control scale");
  } else {
    for (const StepPart& pt : batch.parts)
      if (pt.st->control.defined())
        return InvalidArgument("denoising step: ControlNet requests batch only with each other");
  }
  return batch;
}

Result<Tensor> TextToImage::stack_rows(const StepBatch& batch, Tensor DenoiseState::*field) const {
  const Tensor& f0 = batch.parts.front().st->*field;
  ZI_ASSIGN_OR_RETURN(Tensor rows,
                      be_.alloc(DType::kF32, {batch.rows, f0.dim(1), f0.dim(2), f0.dim(3)}));
  for (const StepPart& pt : batch.parts) {
    const Tensor& src = pt.st->*field;
    Tensor pos_rows = rows.slice0(pt.row0, pt.row0 + pt.st->n);
    ZI_TRY(be_.convert(src, pos_rows));
    if (pt.guidance > 0.0f) {
      Tensor neg_rows = rows.slice0(pt.row0 + pt.st->n, pt.row0 + 2 * pt.st->n);
      ZI_TRY(be_.convert(src, neg_rows));
    }
  }
  return rows;
}

Status TextToImage::control_residuals(const StepBatch& batch, const Tensor& in, DebugSink* dbg,
                                      const std::string& step_name,
                                      const ZImageDiT::RefinedCaptions* refined,
                                      ControlResiduals& residuals) {
  // The control context repeated as the latents are.
  const DenoiseState& first = *batch.parts.front().st;
  ZI_ASSIGN_OR_RETURN(Tensor ctl, stack_rows(batch, &DenoiseState::control));
  return controlnet_
      ->forward(in, batch.t_model, batch.caps, ctl, first.req.control_scale, residuals, dbg,
                "controlnet." + step_name, refined)
      .with_context("denoising step " + std::to_string(first.steps_done()));
}

bool TextToImage::split_forward(bool control) const {
  // Without ControlNet residuals or runtime LoRAs, which only rank 0 holds.
  return seqpar_ && !control && c_.transformer->applied_loras().empty();
}

Status TextToImage::dit_forward(const StepBatch& batch, const Tensor& in,
                                const ControlResiduals* residuals, DebugSink* dbg,
                                const std::string& step_name,
                                const ZImageDiT::RefinedCaptions* refined, Tensor& out) {
  const DenoiseState& first = *batch.parts.front().st;
  const std::string context = "denoising step " + std::to_string(first.steps_done());
  // Sequence parallel (pipeline/seqpar.h) where it can.
  if (split_forward(residuals != nullptr))
    return seqpar_->forward(*c_.transformer, in, batch.t_model, batch.caps, out)
        .with_context(context);
  if (refined != nullptr)
    return c_.transformer
        ->forward_refined(in, batch.t_model, *refined, out, dbg, "dit." + step_name, residuals)
        .with_context(context);
  return c_.transformer
      ->forward(in, batch.t_model, batch.caps, out, dbg, "dit." + step_name, residuals)
      .with_context(context);
}

Result<const ZImageDiT::RefinedCaptions*> TextToImage::refined_captions(const StepBatch& batch) {
  ZImageDiT& dit = *c_.transformer;
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.storage() == b.storage() && a.byte_offset() == b.byte_offset() &&
           a.dtype() == b.dtype() && a.shape() == b.shape();
  };
  CaptionCache& c = caption_cache_;
  bool hit = c.refined.defined() && c.refined.weights_version == dit.weights_version() &&
             c.caps.size() == batch.caps.size();
  for (size_t i = 0; hit && i < batch.caps.size(); ++i) hit = same(c.caps[i], batch.caps[i]);
  if (!hit) {
    c = CaptionCache();  // the old tokens go before the new ones are made
    ZI_ASSIGN_OR_RETURN(c.refined, dit.refine_captions(batch.caps));
    c.caps = batch.caps;
  }
  return &c.refined;
}

Status TextToImage::check_dit_output(DenoiseState& st, const Tensor& o) {
  ZI_ASSIGN_OR_RETURN(const int64_t bad, be_.count_nonfinite(o));
  if (bad == 0) return Status::Ok();
  return nonfinite_error("denoising step " + std::to_string(st.steps_done()) + ": the DiT output",
                         bad, o.numel(), "transformer", &st.embeds);
}

Status TextToImage::advance(const StepPart& pt, const Tensor& o) {
  DenoiseState& st = *pt.st;
  const int i = st.step;
  const int64_t n = st.n;
  const Tensor pos = o.slice0(0, n);
  const Tensor neg = pt.guidance > 0.0f ? o.slice0(n, 2 * n) : Tensor();
  const float dt = st.scheduler->dt(i);
  if (!device_step_ || (pt.guidance > 0.0f && st.req.cfg_normalization > 0.0f)) {
    ZI_TRY(host_step(st, pos, neg, pt.guidance, dt));
  } else {
    // latents += dt·(−(pos + g·(pos − neg))), on the backend with the host's roundings.
    ZI_TRY(be_.guided_euler_step(pos, neg, pt.guidance, dt, st.latents));
  }
  if (st.inpaint) ZI_TRY(inpaint_step(st, i));
  debug_tensor(st.hooks.debug, "latents.step" + std::to_string(st.steps_done()), be_, st.latents);
  st.step = i + 1;
  return Status::Ok();
}

Status TextToImage::host_step(DenoiseState& st, const Tensor& pos, const Tensor& neg, float g,
                              float dt) {
  // cfg_normalization clips each image's guided prediction to a multiple of the positive one's
  // norm: a reduction whose float32 result must equal the reference's, so it runs on the host
  // (in double, in order) as diffusers' CPU reference does. Rarely used (off by default). The
  // same path, without the clip, is the "host scheduler" ablation of zimage bench.
  const int64_t n = st.n, sample = st.channels * st.h * st.w;
  const bool cfg = g > 0.0f;
  Tensor pos_h = Tensor::host(DType::kF32, pos.shape());
  Tensor neg_h = cfg ? Tensor::host(DType::kF32, neg.shape()) : Tensor();
  Tensor lat_h = Tensor::host(DType::kF32, st.latents.shape());
  if (!pos_h.defined() || (cfg && !neg_h.defined()) || !lat_h.defined())
    return OutOfMemory("host buffers for the denoising step");
  ZI_TRY(be_.download(pos, pos_h));
  if (cfg) ZI_TRY(be_.download(neg, neg_h));
  ZI_TRY(be_.download(st.latents, lat_h));
  std::vector<float> velocity(static_cast<size_t>(n * sample));
  for (int64_t j = 0; j < n; ++j) {
    const float* p = pos_h.data_as<float>() + j * sample;
    float* pred = velocity.data() + j * sample;
    if (cfg) {
      cfg_combine(p, neg_h.data_as<float>() + j * sample, g, pred, static_cast<size_t>(sample));
      if (st.req.cfg_normalization > 0.0f)
        cfg_renormalize(p, pred, static_cast<size_t>(sample), st.req.cfg_normalization);
    } else {
      std::copy(p, p + sample, pred);
    }
  }
  for (float& v : velocity) v = -v;
  euler_step(lat_h.data_as<float>(), velocity.data(), dt, velocity.size());
  ZI_ASSIGN_OR_RETURN(st.latents, be_.upload(lat_h, DType::kF32));
  return Status::Ok();
}

Status TextToImage::inpaint_step(DenoiseState& st, int i) {
  // The known region back at the noise level of the next step, on the host in float32 as the
  // reference computes it (1 MB at 1024²: small next to a DiT forward).
  Tensor lat_h = Tensor::host(DType::kF32, st.latents.shape());
  if (!lat_h.defined()) return OutOfMemory("host buffer for the inpainting blend");
  ZI_TRY(be_.download(st.latents, lat_h));
  inpaint_blend(*st.inpaint, *st.scheduler, i, {st.n, st.channels, st.h, st.w},
                lat_h.data_as<float>());
  ZI_ASSIGN_OR_RETURN(st.latents, be_.upload(lat_h, DType::kF32));
  return Status::Ok();
}

Result<VaeEncoder*> TextToImage::vae_encoder() {
  if (c_.vae_encoder) return c_.vae_encoder.get();
  if (paths_.model_dir.empty() && paths_.vae_file.empty())
    return Unsupported("init_image: this pipeline was assembled without a VAE encoder")
        .with_field("init_image");
  ZI_ASSIGN_OR_RETURN(c_.vae_encoder, load_vae_encoder(paths_, be_));
  return c_.vae_encoder.get();
}

Result<TextToImageOutput> TextToImage::finish(DenoiseState& st) {
  if (!st.done()) return InvalidArgument("finish: the request has steps left");
  const TextToImageHooks& hooks = st.hooks;
  auto cancelled = [&] { return hooks.cancel != nullptr && hooks.cancel->load(); };
  const GenerateRequest& req = st.req;
  st.embeds.clear();                // frees the text features on the backend before the VAE runs
  caption_cache_ = CaptionCache();  // and the caption tokens refined from them
  TextToImageOutput result;
  result.timings = st.timings;

  // 5. VAE decode and conversion to 8-bit RGB.
  if (cancelled()) return Cancelled("generation cancelled before the VAE decode");
  if (hooks.on_progress) hooks.on_progress({Phase::kVae, 0, 0, now_s() - st.start_s});
  const double t0 = now_s();
  const int64_t n = st.n;
  const size_t per_image = static_cast<size_t>(req.height) * req.width * 3;
  if (!float_image_ && !vae_should_tile(*c_.vae, vae_tiling_, n, st.h, st.w)) {
    // The bytes made on the backend (VaeDecoder::decode_rgb8): no f32 image on the host.
    int64_t bad = 0;
    auto rgb = c_.vae->decode_rgb8(st.latents, &bad, hooks.debug, hooks.cancel);
    if (!rgb.ok()) {
      if (rgb.status().code() == ErrorCode::kCancelled) return rgb.status();
      return rgb.status().with_context("vae decode");
    }
    result.timings.vae_s = now_s() - t0;
    const Shape want{n, req.height, req.width, 3};
    if (rgb->shape() != want || rgb->dtype() != DType::kU8 || rgb->device() != Device::kCPU) {
      return InternalError("vae decode_rgb8 returned " + rgb->describe() + ", expected u8" +
                           shape_string(want) + " on the host");
    }
    if (bad > 0) return nonfinite_error("vae decode: the image", bad, rgb->numel(), "vae", nullptr);
    if (cancelled()) return Cancelled("generation cancelled during the VAE decode");
    const uint8_t* px = static_cast<const uint8_t*>(rgb->data());
    for (int64_t i = 0; i < n; ++i) {
      Image img;
      img.width = req.width;
      img.height = req.height;
      img.rgb.assign(px + i * per_image, px + (i + 1) * per_image);
      result.images.push_back(std::move(img));
    }
    result.timings.total_s = now_s() - st.start_s;
    ZI_INFO("generated %lld image(s) %dx%d in %.3f s", static_cast<long long>(n), req.width,
            req.height, result.timings.total_s);
    return result;
  }
  auto image = vae_decode_with_policy(*c_.vae, st.latents, vae_tiling_, hooks.debug, hooks.cancel);
  if (!image.ok()) {
    if (image.status().code() == ErrorCode::kCancelled) return image.status();
    return image.status().with_context("vae decode");
  }
  result.image = std::move(image).value();
  result.timings.vae_s = now_s() - t0;
  const Shape want{n, req.height, req.width, 3};
  if (result.image.shape() != want || result.image.dtype() != DType::kF32 ||
      result.image.device() != Device::kCPU) {
    return InternalError("vae decode returned " + result.image.describe() + ", expected f32" +
                         shape_string(want) + " on the host");
  }
  const float* px = result.image.data_as<float>();
  if (const int64_t bad = count_nonfinite(px, static_cast<size_t>(result.image.numel())); bad > 0)
    return nonfinite_error("vae decode: the image", bad, result.image.numel(), "vae", nullptr);
  // A Ctrl-C that arrived during the last VAE block or the download still stops the call.
  if (cancelled()) return Cancelled("generation cancelled during the VAE decode");
  for (int64_t i = 0; i < n; ++i) {
    Image img;
    img.width = req.width;
    img.height = req.height;
    img.rgb.resize(per_image);
    for (size_t k = 0; k < per_image; ++k) img.rgb[k] = to_u8(px[i * per_image + k]);
    result.images.push_back(std::move(img));
  }
  result.timings.total_s = now_s() - st.start_s;
  ZI_INFO("generated %lld image(s) %dx%d in %.3f s", static_cast<long long>(n), req.width,
          req.height, result.timings.total_s);
  return result;
}

Status TextToImage::nonfinite_error(const std::string& what, int64_t bad, int64_t total,
                                    const std::string& component,
                                    const std::vector<Tensor>* embeds) {
  const std::string counted = what + " holds " + std::to_string(bad) + " NaN/Inf value(s) of " +
                              std::to_string(total) + " (the image would be black)";
  const auto diagnose = [&](const std::string& c) {
    if (paths_.model_dir.empty() && paths_.transformer_file.empty() &&
        paths_.text_encoder_file.empty() && paths_.vae_file.empty())
      return std::string("no model folder to check the ") + c + " weights";
    return diagnose_weights(paths_, c);
  };
  if (embeds != nullptr) {  // NaN in the prompt features makes every DiT output NaN
    for (const Tensor& e : *embeds) {
      Tensor h = Tensor::host(DType::kF32, e.shape());
      if (!h.defined() || !be_.download(e, h).ok()) break;
      if (count_nonfinite(h.data_as<float>(), static_cast<size_t>(h.numel())) > 0) {
        const std::string d = diagnose("text_encoder");
        const ErrorCode code = d.find("NaN/Inf value") != std::string::npos
                                   ? ErrorCode::kFormat
                                   : ErrorCode::kUnsupported;
        return Status(code, counted +
                                "; it comes from the text encoder, whose output holds "
                                "NaN/Inf: " +
                                d);
      }
    }
  }
  const std::string d = diagnose(component);
  const ErrorCode code =
      d.find("NaN/Inf value") != std::string::npos ? ErrorCode::kFormat : ErrorCode::kUnsupported;
  return Status(code, counted + ": " + d);
}

Result<TextToImageOutput> TextToImage::run(const GenerateRequest& req,
                                           const TextToImageHooks& hooks) {
  ZI_ASSIGN_OR_RETURN(std::unique_ptr<DenoiseState> st, begin(req, hooks));
  while (!st->done()) {
    if (hooks.cancel != nullptr && hooks.cancel->load())
      return Cancelled("generation cancelled at step " + std::to_string(st->steps_done()) + " of " +
                       std::to_string(st->steps_total()));
    ZI_TRY(step({st.get()}));
  }
  return finish(*st);
}

Status TextToImage::load_controlnet(const std::string& path) {
  // The memory planner does not count a ControlNet (up to ~6 GB in bf16 for 2.x): with a budget
  // the load would silently exceed it, or the streamed transformer could not serve it.
  if (plan_.budget > 0)
    return Unsupported("--controlnet " + path +
                       ": a device-memory budget (--vram-budget) with a ControlNet is not "
                       "supported yet; run without the budget");
  ZI_ASSIGN_OR_RETURN(controlnet_, ZImageControlNet::load(path, *c_.transformer, be_));
  return Status::Ok();
}

Status TextToImage::check_control(const GenerateRequest& req) const {
  if (!req.control_image) return Status::Ok();
  if (!controlnet_)
    return FieldError("control_image", "no ControlNet loaded (give --controlnet PATH)");
  if (!std::isfinite(req.control_scale))
    return FieldError("control_scale", "must be a finite number");
  if (req.strength) return FieldError("strength", "does not apply to ControlNet requests");
  if (req.init_image && !req.mask)
    return FieldError("init_image",
                      "with a control_image it needs a mask (ControlNet inpainting); diffusers "
                      "has no ControlNet image-to-image for Z-Image");
  const int need = 2 * latent_channels() + 1;
  if (req.mask && controlnet_->config().control_in_dim < need)
    return FieldError(
        "mask", "ControlNet inpainting needs a ControlNet with mask channels (2.x); " +
                    controlnet_->path() + " has " +
                    std::to_string(controlnet_->config().control_in_dim) + " control channels");
  return Status::Ok();
}

}  // namespace zimage
