// Continuous batching on the Engine (include/zimage/zimage.h, batch_*): the server's step
// scheduler adds requests as they arrive and calls batch_step() in a loop. Why in the engine and
// not in the server: the pipeline's state between steps (latents, scheduler, encoded prompts)
// stays behind the public API, and the same begin/step/finish pieces run generate().
#include <utility>
#include <vector>

#include "api/engine_impl.h"

namespace zimage {

Result<uint64_t> Engine::batch_add(const GenerateRequest& req, const GenerateHooks& hooks) {
  return guarded("Engine::batch_add", [&]() -> Result<uint64_t> {
    ZI_TRY(validate_impl(req));
    BatchEntry entry;
    if (!hooks.dump_dir.empty()) {
      ZI_TRY(prepare_dump_dir(hooks.dump_dir));
      entry.sink = make_directory_dump_sink(hooks.dump_dir, hooks.dump_filter);
    }
    TextToImageHooks h;
    h.on_progress = hooks.on_progress;
    h.on_preview = hooks.on_preview;
    h.preview_enabled = hooks.preview_enabled;
    h.cancel = hooks.cancel;
    h.debug = entry.sink.get();
    ZI_ASSIGN_OR_RETURN(entry.loras, impl_->resolve_loras(req.loras));
    entry.lora_key = lora_set_key(entry.loras);
    std::lock_guard<std::mutex> lock(impl_->mu);
    ZI_TRY(impl_->backend->bind_thread());
    ZI_ASSIGN_OR_RETURN(entry.state, impl_->pipeline->begin(req, h));
    const uint64_t id = impl_->next_batch_id++;
    impl_->batch.emplace(id, std::move(entry));
    return id;
  });
}

Engine::Memory Engine::memory() const {
  const Backend::MemoryUse m = impl_->backend->memory_use();  // the allocator locks itself
  return {m.in_use, m.reserved, m.peak_in_use};
}

int Engine::batch_active() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int>(impl_->batch.size());
}

std::vector<BatchOutcome> Engine::batch_step() {
  std::vector<BatchOutcome> out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& batch = impl_->batch;
  auto finish_one = [&](uint64_t id, Result<GenerateResult> r) {
    BatchOutcome o;
    o.id = id;
    o.result = std::move(r);
    out.push_back(std::move(o));
    batch.erase(id);
  };
  const Status bound = guarded("Engine::batch_step", [&] { return impl_->backend->bind_thread(); });
  if (!bound.ok()) {
    std::vector<uint64_t> ids;
    for (const auto& [id, e] : batch) ids.push_back(id);
    for (uint64_t id : ids) finish_one(id, bound);
    return out;
  }
  // Cancelled requests leave before the step.
  std::vector<uint64_t> cancelled;
  for (const auto& [id, e] : batch) {
    const auto* flag = e.state->hooks.cancel;
    if (flag != nullptr && flag->load()) cancelled.push_back(id);
  }
  for (uint64_t id : cancelled) {
    const DenoiseState& st = *batch.at(id).state;
    finish_one(id, Cancelled("generation cancelled at step " + std::to_string(st.steps_done()) +
                             " of " + std::to_string(st.steps_total())));
  }
  if (batch.empty()) return out;

  // The step: every request of the oldest one's size and LoRA set, in arrival order.
  const BatchEntry& first = batch.begin()->second;
  const DenoiseState& oldest = *first.state;
  std::vector<uint64_t> ids;
  std::vector<DenoiseState*> states;
  for (auto& [id, e] : batch) {
    // ControlNet requests step together only with ControlNet requests of the same scale.
    const bool same_control =
        e.state->control.defined() == oldest.control.defined() &&
        (!oldest.control.defined() || e.state->req.control_scale == oldest.req.control_scale);
    if (e.state->h == oldest.h && e.state->w == oldest.w && e.lora_key == first.lora_key &&
        !e.state->done() && same_control) {
      ids.push_back(id);
      states.push_back(e.state.get());
    }
  }
  const Status stepped = guarded("Engine::batch_step", [&] {
    ZI_TRY(impl_->use_loras(first.loras));
    return impl_->pipeline->step(states);
  });
  if (!stepped.ok()) {
    for (uint64_t id : ids) finish_one(id, stepped);
    return out;
  }
  // Finished requests: VAE decode, one request at a time (its own image batch, as generate()).
  for (uint64_t id : ids) {
    BatchEntry& e = batch.at(id);
    if (!e.state->done()) continue;
    Result<GenerateResult> r = guarded("Engine::batch_step", [&]() -> Result<GenerateResult> {
      ZI_ASSIGN_OR_RETURN(TextToImageOutput o, impl_->pipeline->finish(*e.state));
      if (e.sink) ZI_TRY(e.sink->status());
      GenerateResult g;
      g.images = std::move(o.images);
      g.timings = std::move(o.timings);
      g.seed = e.state->req.seed;
      g.device = impl_->backend->name();
      return g;
    });
    finish_one(id, std::move(r));
  }
  return out;
}

}  // namespace zimage
