// Per-request LoRAs on the Engine (GenerateRequest::loras): files parsed through the engine's
// LoraCache, then made the transformer's runtime set (model/adapters/lora_runtime.h) before the request's
// DiT forwards.
#include "api/engine_impl.h"
#include "api/guarded.h"

namespace zimage {

Result<std::vector<RuntimeLora>> Engine::Impl::resolve_loras(const std::vector<LoraSpec>& specs) {
  std::vector<RuntimeLora> out;
  for (const LoraSpec& s : specs) {
    ZI_ASSIGN_OR_RETURN(std::shared_ptr<const LoraFile> f, lora_cache->get(s.path));
    out.push_back({std::move(f), s.scale});
  }
  return out;
}

Status Engine::Impl::use_loras(const std::vector<RuntimeLora>& loras) {
  return pipeline->transformer().set_loras(loras, lora_method, options.lora_lenient);
}

Status Engine::check_loras(const std::vector<LoraSpec>& loras) const {
  return guarded("Engine::check_loras", [&]() -> Status {
    if (loras.empty()) return Status::Ok();
    ZI_ASSIGN_OR_RETURN(std::vector<RuntimeLora> set, impl_->resolve_loras(loras));
    return impl_->pipeline->transformer().check_loras(set, impl_->options.lora_lenient);
  });
}

}  // namespace zimage
