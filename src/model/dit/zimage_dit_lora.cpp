// Runtime LoRAs on the DiT (zimage_dit.h set_loras, model/adapters/lora_runtime.h): the diffusers
// weight names mapped onto the loaded blocks (q|k|v and w1|w3 are stored fused), and the set
// switched.
#include <cstdlib>
#include <string>

#include "core/log.h"
#include "model/dit/zimage_dit.h"

namespace zimage {

namespace {

bool take_prefix(std::string& s, const std::string& p) {
  if (s.compare(0, p.size(), p) != 0) return false;
  s.erase(0, p.size());
  return true;
}

}  // namespace

Result<LoraSlot> ZImageDiT::lora_slot(const std::string& canonical) {
  const int64_t d = cfg_.dim, f = cfg_.ffn_hidden();
  auto whole = [&](const std::string& name, Tensor& t, LinearWeight* lw) -> Result<LoraSlot> {
    LoraSlot s;
    s.name = "transformer weight " + name;
    s.linear = lw;
    s.tensor = &t;
    if (!t.defined() || t.rank() != 2) return Unsupported(s.name + " is not held as a matrix");
    s.rows = s.full_rows = t.dim(0);
    s.cols = t.dim(1);
    return s;
  };
  const std::string key =
      std::to_string(cfg_.patch_size) + "-" + std::to_string(cfg_.f_patch_size) + ".";
  if (canonical == "t_embedder.mlp.0.weight") return whole(canonical, t_w1_, nullptr);
  if (canonical == "t_embedder.mlp.2.weight") return whole(canonical, t_w2_, nullptr);
  if (canonical == "cap_embedder.1.weight") return whole(canonical, cap_w_, nullptr);
  if (canonical == "all_x_embedder." + key + "weight") return whole(canonical, x_w_, nullptr);
  if (canonical == "all_final_layer." + key + "linear.weight")
    return whole(canonical, final_w_, nullptr);
  if (canonical == "all_final_layer." + key + "adaLN_modulation.1.weight")
    return whole(canonical, final_ada_w_, nullptr);

  std::string rest = canonical;
  std::vector<Block>* blocks = nullptr;
  for (auto [name, vec] :
       {std::pair{"layers.", &layers_}, std::pair{"noise_refiner.", &noise_refiner_},
        std::pair{"context_refiner.", &context_refiner_}}) {
    if (take_prefix(rest, name)) {
      blocks = vec;
      break;
    }
  }
  const auto not_found = NotFound("the model has no weight " + canonical);
  if (blocks == nullptr) return not_found;
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string::npos || dot > 6) return not_found;
  for (size_t i = 0; i < dot; ++i)
    if (rest[i] < '0' || rest[i] > '9') return not_found;
  const size_t index = std::strtoul(rest.substr(0, dot).c_str(), nullptr, 10);
  if (index >= blocks->size()) return not_found;
  Block& b = (*blocks)[index];
  const std::string leaf = rest.substr(dot + 1);
  // The linear weight [full_rows, cols] and the part of its rows. The sizes come from the config:
  // a block streamed from the weight files holds no tensor between forwards (its slot views do).
  auto part = [&](LinearWeight& lw, int64_t row0, int64_t rows, int64_t full_rows,
                  int64_t cols) -> Result<LoraSlot> {
    LoraSlot s;
    s.name = "transformer weight " + canonical;
    s.linear = &lw;
    s.tensor = &lw.w;
    s.row0 = row0;
    s.rows = rows;
    s.full_rows = full_rows;
    s.cols = cols;
    return s;
  };
  if (leaf == "attention.to_q.weight") return part(b.wqkv, 0, d, 3 * d, d);
  if (leaf == "attention.to_k.weight") return part(b.wqkv, d, d, 3 * d, d);
  if (leaf == "attention.to_v.weight") return part(b.wqkv, 2 * d, d, 3 * d, d);
  if (leaf == "attention.to_out.0.weight") return part(b.wo, 0, d, d, d);
  if (leaf == "feed_forward.w1.weight") return part(b.w13, 0, f, 2 * f, d);
  if (leaf == "feed_forward.w3.weight") return part(b.w13, f, f, 2 * f, d);
  if (leaf == "feed_forward.w2.weight") return part(b.w2, 0, d, d, f);
  if (leaf == "adaLN_modulation.0.weight" && b.modulated) {
    if (!b.adaln_w.defined())  // streamed from the weight files: nothing to merge into
      return Unsupported("transformer weight " + canonical +
                         " streams from the weight files (--vram-budget) and has no side GEMM: "
                         "a LoRA cannot patch it at runtime");
    return whole(canonical, b.adaln_w, nullptr);
  }
  return not_found;
}

Status ZImageDiT::set_loras(const std::vector<RuntimeLora>& loras, LoraMethod method,
                            bool lenient) {
  const std::string key = lora_set_key(loras);
  if (key == lora_applied_.key) return Status::Ok();
  // Whatever follows changes weights: refined captions made before are stale.
  weights_version_ = next_weights_version();
  const bool had_side = !lora_applied_.sided.empty();
  Status st = remove_runtime_loras(be_, lora_applied_);
  if (had_side) release_graphs();
  if (!st.ok()) return st.with_context("taking the previous LoRAs off the transformer");
  if (loras.empty()) return block_ffn_weights();  // the base model: every w1|w3 fused again
  // A LoRA's w1 and w3 rows are in the files' order: a w1|w3 weight it patches goes back to gate
  // rows first (and its feed-forward to the unfused path) before the merge or side GEMM.
  bool reordered = false;
  auto slot = [this, &reordered](const std::string& c) -> Result<LoraSlot> {
    ZI_ASSIGN_OR_RETURN(LoraSlot s, lora_slot(c));
    if (s.linear != nullptr && s.linear->swiglu_block > 0) {
      ZI_TRY(set_swiglu_block(be_, *s.linear, 0));
      reordered = true;
    }
    return s;
  };
  auto applied = apply_runtime_loras(be_, loras, method, lenient, slot);
  if (reordered) release_graphs();
  if (!applied.ok()) {
    release_graphs();  // a failed apply may have set and dropped side GEMMs
    return applied.status();
  }
  lora_applied_ = std::move(applied).value();
  if (!lora_applied_.sided.empty()) release_graphs();
  ZI_INFO("transformer: %zu runtime LoRA(s), %d patches: %d weights merged, %d side GEMMs (%s)",
          loras.size(), lora_applied_.patches, lora_applied_.merged_weights,
          lora_applied_.side_weights, lora_method_name(method));
  return Status::Ok();
}

}  // namespace zimage
