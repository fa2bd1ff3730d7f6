// read_lora (lora.h): groups a LoRA file's keys by module, checks every factor, and makes the
// patches with their scales. The key grammar is in lora_keys.cpp.
#include "io/lora/lora.h"

#include <cmath>
#include <set>

#include "io/fs/json_util.h"
#include "io/weights/safetensors.h"

namespace zimage {

namespace {

std::string q(const std::string& s) {
  return "'" + json_util::printable(s) + "'";
}

struct Part {
  std::string key;
  std::string suffix;
  Tensor t;
};

struct Group {
  std::map<LoraPart, Part> parts;
  std::vector<std::string> keys;
  LoraModuleMap map;
  bool redundant = false;

  const Part* get(LoraPart p) const {
    auto it = parts.find(p);
    return it == parts.end() ? nullptr : &it->second;
  }
};

std::string unsupported_reason(const std::string& suffix) {
  if (suffix == ".dora_scale")
    return "a DoRA magnitude (dora_scale): zimage applies plain LoRAs only (diffusers drops these "
           "keys with a warning)";
  if (suffix == ".hada_t1" || suffix == ".hada_t2" || suffix == ".lokr_t2")
    return "a LyCORIS Tucker core, which only convolutions use; the transformer has none";
  if (suffix == ".lora_B.bias" || suffix == ".lora_up.bias") return "a LoRA bias (not supported)";
  if (suffix == ".diff" || suffix == ".diff_b") return "a full-weight difference (not supported)";
  return "a LoRA part zimage does not apply (" + suffix + ")";
}

// Every value finite, checked in chunks so a big tensor needs no big buffer.
Status check_values(const Part& p, const std::string& file) {
  if (!dtype_is_float(p.t.dtype()))
    return FormatError(file + ": LoRA key " + q(p.key) + " has non-float dtype " +
                       dtype_name(p.t.dtype()));
  const int64_t n = p.t.numel();
  const size_t es = dtype_size(p.t.dtype());
  float buf[4096];
  for (int64_t i = 0; i < n; i += 4096) {
    const size_t m = static_cast<size_t>(std::min<int64_t>(4096, n - i));
    convert_to_f32(p.t.dtype(), static_cast<const char*>(p.t.data()) + i * es, buf, m);
    for (size_t j = 0; j < m; ++j)
      if (!std::isfinite(buf[j]))
        return FormatError(file + ": LoRA key " + q(p.key) + " holds NaN or Inf");
  }
  return Status::Ok();
}

Status check_matrix(const Part& p, const std::string& file) {
  if (p.t.rank() != 2 || p.t.dim(0) < 1 || p.t.dim(1) < 1)
    return FormatError(file + ": LoRA key " + q(p.key) + " has shape " + shape_string(p.t.shape()) +
                       ", expected a matrix (the transformer's LoRA targets are all linear)");
  return check_values(p, file);
}

// A required factor, or a FormatError naming what it belongs to.
Result<const Part*> need(const Group& g, LoraPart part, const char* what, const std::string& module,
                         const std::string& file) {
  if (const Part* p = g.get(part)) {
    ZI_TRY(check_matrix(*p, file));
    return p;
  }
  return FormatError(file + ": LoRA module " + q(module) + " has no " + what + " (it has " +
                     q(g.keys.front()) + ")");
}

Status rank_mismatch(const std::string& file, const Part& a, const Part& b) {
  return FormatError(file + ": LoRA keys " + q(a.key) + " " + shape_string(a.t.shape()) + " and " +
                     q(b.key) + " " + shape_string(b.t.shape()) +
                     " do not fit together (their inner dimensions differ)");
}

std::string style_of(const std::string& suffix) {
  if (suffix == ".lora_A.weight" || suffix == ".lora_B.weight") return "lora_A/lora_B";
  if (suffix == ".lora_A.default.weight" || suffix == ".lora_B.default.weight")
    return "lora_A/lora_B.default";
  if (suffix == ".lora_down.weight" || suffix == ".lora_up.weight") return "lora_down/lora_up";
  if (suffix == ".lora.down.weight" || suffix == ".lora.up.weight") return "lora.down/lora.up";
  if (suffix.rfind(".lora_linear_layer", 0) == 0) return "lora_linear_layer.down/up";
  if (suffix.rfind(".hada_", 0) == 0) return "LoHa hada_w*";
  if (suffix.rfind(".lokr_", 0) == 0) return "LoKr lokr_w*";
  return "";
}

std::string family_of(const std::string& prefix) {
  if (prefix == "transformer.") return "diffusers/PEFT";
  if (prefix == "diffusion_model." || prefix == "model.diffusion_model.")
    return "ai-toolkit/diffusion-pipe/ComfyUI";
  if (prefix.rfind("lora_unet_", 0) == 0) return "kohya/musubi";
  if (prefix.rfind("lycoris_", 0) == 0) return "LyCORIS";
  if (prefix.rfind("lora_transformer_", 0) == 0) return "OneTrainer";
  return "PEFT";
}

std::string describe_format(const std::map<std::string, Group>& groups, bool peft_config) {
  std::map<std::string, size_t> prefixes;
  std::set<std::string> styles;
  bool alpha = false, comfy = false, fused = false;
  for (const auto& [module, g] : groups) {
    if (g.map.targets.empty()) continue;
    ++prefixes[g.map.prefix];
    for (const auto& [part, p] : g.parts) {
      if (part == LoraPart::kAlpha) alpha = true;
      const std::string s = style_of(p.suffix);
      if (!s.empty()) styles.insert(s);
    }
    comfy |= g.map.comfy_name;
    fused |= g.map.fused_qkv;
  }
  if (prefixes.empty()) return "unrecognised";
  std::string top;
  size_t most = 0;
  std::string plist;
  for (const auto& [p, n] : prefixes) {
    if (n > most) most = n, top = p;
    plist += (plist.empty() ? "" : ", ") + (p.empty() ? std::string("no prefix") : p);
  }
  std::string slist;
  for (const std::string& s : styles) slist += (slist.empty() ? "" : ", ") + s;
  std::string out = family_of(top) + " (" + plist + "; " + slist + (alpha ? " + alpha" : "");
  if (peft_config) out += "; PEFT config in lora_adapter_metadata";
  if (comfy) out += "; ComfyUI module names";
  if (fused) out += "; fused attention.qkv";
  return out + ")";
}

// The scale of a low-rank group: user x alpha / rank x PEFT's lora_alpha / r for the module.
Result<double> low_rank_scale(const Group& g, const std::string& module, int64_t rank, double user,
                              const std::optional<PeftScaling>& peft,
                              const std::optional<double>& alpha, const std::string& file) {
  double s = user * (alpha ? *alpha / static_cast<double>(rank) : 1.0);
  if (!peft) return s;
  const std::string name = g.map.targets.size() == 1 ? g.map.targets[0].module : module;
  ZI_ASSIGN_OR_RETURN(double r, peft->rank_for(name));
  ZI_ASSIGN_OR_RETURN(double a, peft->alpha_for(name));
  if (r != static_cast<double>(rank))
    return FormatError(file + ": LoRA module " + q(module) + " has rank " + std::to_string(rank) +
                       " but its lora_adapter_metadata says r = " + std::to_string(r));
  return s * (peft->use_rslora ? a / std::sqrt(r) : a / r);
}

// Patches of one group (already mapped, not redundant) appended to out.patches.
Status make_patches(const std::string& module, const Group& g, LoraFile& out,
                    const std::optional<PeftScaling>& peft) {
  const std::string& file = out.path;
  bool lr = false, hada = false, lokr = false;
  for (const auto& [part, p] : g.parts) {
    lr |= part == LoraPart::kDown || part == LoraPart::kUp;
    hada |= part >= LoraPart::kHadaW1A && part <= LoraPart::kHadaW2B;
    lokr |= part >= LoraPart::kLokrW1 && part <= LoraPart::kLokrW2B;
  }
  if (int(lr) + int(hada) + int(lokr) > 1)
    return FormatError(file + ": LoRA module " + q(module) + " mixes LoRA, LoHa and LoKr keys");
  if (!lr && !hada && !lokr)
    return FormatError(file + ": LoRA key " + q(g.keys.front()) +
                       " has no LoRA weights next to it");
  std::optional<double> alpha;
  if (const Part* a = g.get(LoraPart::kAlpha)) {
    ZI_TRY(check_values(*a, file));
    if (a->t.numel() != 1)
      return FormatError(file + ": LoRA key " + q(a->key) + " has shape " +
                         shape_string(a->t.shape()) + ", expected one number");
    float v = 0;
    convert_to_f32(a->t.dtype(), a->t.data(), &v, 1);
    alpha = v;
  }
  LoraPatch base;
  base.module = module;
  base.keys = g.keys;
  int64_t n = 0, k = 0;
  double scale = out.user_scale;
  if (lr) {
    base.kind = LoraKind::kLowRank;
    ZI_ASSIGN_OR_RETURN(const Part* down,
                        need(g, LoraPart::kDown, "down (lora_A) weight", module, file));
    ZI_ASSIGN_OR_RETURN(const Part* up, need(g, LoraPart::kUp, "up (lora_B) weight", module, file));
    if (down->t.dim(0) != up->t.dim(1)) return rank_mismatch(file, *down, *up);
    base.rank = down->t.dim(0);
    n = up->t.dim(0), k = down->t.dim(1);
    base.down = down->t, base.up = up->t;
    ZI_ASSIGN_OR_RETURN(scale, low_rank_scale(g, module, base.rank, scale, peft, alpha, file));
  } else if (hada) {
    base.kind = LoraKind::kLoHa;
    ZI_ASSIGN_OR_RETURN(const Part* w1a, need(g, LoraPart::kHadaW1A, "hada_w1_a", module, file));
    ZI_ASSIGN_OR_RETURN(const Part* w1b, need(g, LoraPart::kHadaW1B, "hada_w1_b", module, file));
    ZI_ASSIGN_OR_RETURN(const Part* w2a, need(g, LoraPart::kHadaW2A, "hada_w2_a", module, file));
    ZI_ASSIGN_OR_RETURN(const Part* w2b, need(g, LoraPart::kHadaW2B, "hada_w2_b", module, file));
    if (w1a->t.dim(1) != w1b->t.dim(0)) return rank_mismatch(file, *w1a, *w1b);
    if (w2a->t.dim(1) != w2b->t.dim(0)) return rank_mismatch(file, *w2a, *w2b);
    if (w1a->t.dim(0) != w2a->t.dim(0) || w1b->t.dim(1) != w2b->t.dim(1))
      return FormatError(file + ": LoHa module " + q(module) + ": (hada_w1_a · hada_w1_b) and " +
                         "(hada_w2_a · hada_w2_b) have different shapes");
    base.rank = w1b->t.dim(0);
    n = w1a->t.dim(0), k = w1b->t.dim(1);
    base.w1_a = w1a->t, base.w1_b = w1b->t, base.w2_a = w2a->t, base.w2_b = w2b->t;
    if (alpha) scale *= *alpha / static_cast<double>(base.rank);
  } else {
    base.kind = LoraKind::kLoKr;
    Shape f[2];  // the two Kronecker factors' shapes
    int64_t rank = 0;
    const LoraPart full[2] = {LoraPart::kLokrW1, LoraPart::kLokrW2};
    const LoraPart pa[2] = {LoraPart::kLokrW1A, LoraPart::kLokrW2A};
    const LoraPart pb[2] = {LoraPart::kLokrW1B, LoraPart::kLokrW2B};
    Tensor* dst_full[2] = {&base.w1, &base.w2};
    Tensor* dst_a[2] = {&base.w1_a, &base.w2_a};
    Tensor* dst_b[2] = {&base.w1_b, &base.w2_b};
    for (int i = 0; i < 2; ++i) {
      const std::string w = "lokr_w" + std::to_string(i + 1);
      if (const Part* p = g.get(full[i])) {
        if (g.get(pa[i]) || g.get(pb[i]))
          return FormatError(file + ": LoKr module " + q(module) + " has both " + w + " and " + w +
                             "_a/_b");
        ZI_TRY(check_matrix(*p, file));
        *dst_full[i] = p->t;
        f[i] = p->t.shape();
        continue;
      }
      ZI_ASSIGN_OR_RETURN(const Part* a, need(g, pa[i], (w + "_a").c_str(), module, file));
      ZI_ASSIGN_OR_RETURN(const Part* b, need(g, pb[i], (w + "_b").c_str(), module, file));
      if (a->t.dim(1) != b->t.dim(0)) return rank_mismatch(file, *a, *b);
      *dst_a[i] = a->t, *dst_b[i] = b->t;
      f[i] = {a->t.dim(0), b->t.dim(1)};
      if (i == 1 || rank == 0) rank = b->t.dim(0);  // diffusers: rows of w2_b, else of w1_b
    }
    base.rank = rank;
    n = f[0][0] * f[1][0], k = f[0][1] * f[1][1];
    if (alpha && rank > 0) scale *= *alpha / static_cast<double>(rank);
  }
  base.scale = static_cast<float>(scale);
  if (g.map.fused_qkv && n % 3 != 0)
    return FormatError(file + ": LoRA module " + q(module) + " targets the fused attention.qkv " +
                       "but its output has " + std::to_string(n) + " rows, not a multiple of 3");
  const int64_t rows = g.map.fused_qkv ? n / 3 : n;
  for (const LoraTarget& t : g.map.targets) {
    LoraPatch p = base;
    p.target = t.module + ".weight";
    p.rows = rows;
    p.cols = k;
    if (t.part >= 0 && p.kind == LoraKind::kLowRank) {
      p.up = base.up.slice0(t.part * rows, (t.part + 1) * rows);
    } else if (t.part >= 0) {
      p.delta_row0 = t.part * rows;
    }
    out.patches.push_back(std::move(p));
  }
  return Status::Ok();
}

// Keys that repeat another group's update, which diffusers skips too (Anime-Z style files carry
// both): a fused qkv next to to_q/to_k/to_v of the same block, a bare `out` next to `to_out.0`.
void mark_redundant(std::map<std::string, Group>& groups) {
  std::set<std::string> split_targets;
  for (const auto& [m, g] : groups)
    if (!g.map.fused_qkv && !g.map.comfy_name)
      for (const LoraTarget& t : g.map.targets) split_targets.insert(t.module);
  for (auto& [m, g] : groups) {
    if (!g.map.fused_qkv &&
        !(g.map.comfy_name && g.map.targets.size() == 1 &&
          g.map.targets[0].module.find(".attention.to_out.0") != std::string::npos))
      continue;
    for (const LoraTarget& t : g.map.targets)
      if (split_targets.count(t.module)) g.redundant = true;
  }
}

}  // namespace

Result<LoraFile> read_lora(const std::string& path, float scale) {
  if (!std::isfinite(scale))
    return InvalidArgument(path + ": LoRA scale " + std::to_string(scale) + " is not finite");
  ZI_ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsFile> file, SafetensorsFile::open(path));
  LoraFile out;
  out.path = path;
  out.user_scale = scale;
  out.file = file;
  out.key_count = file->tensors().size();

  std::optional<PeftScaling> peft;
  auto md = file->metadata().find("lora_adapter_metadata");
  if (md != file->metadata().end()) {
    ZI_ASSIGN_OR_RETURN(peft, parse_peft_metadata(md->second, path));
  }

  std::map<std::string, Group> groups;
  bool any_lora_key = false;
  for (const SafetensorsTensorInfo& info : file->tensors()) {
    std::optional<LoraKey> key = split_lora_key(info.name);
    if (!key) {
      out.unmatched.push_back(
          {info.name,
           "not a LoRA key (no lora_A/lora_B, lora_down/lora_up, alpha, LoHa or LoKr "
           "suffix)"});
      continue;
    }
    any_lora_key = true;
    if (key->part == LoraPart::kUnsupported) {
      out.unmatched.push_back({info.name, unsupported_reason(key->suffix)});
      continue;
    }
    ZI_ASSIGN_OR_RETURN(Tensor t, file->tensor(info.name));
    Group& g = groups[key->module];
    auto [it, inserted] = g.parts.emplace(key->part, Part{info.name, key->suffix, t});
    if (!inserted)
      return FormatError(path + ": LoRA keys " + q(it->second.key) + " and " + q(info.name) +
                         " are the same part of one module");
    g.keys.push_back(info.name);
  }
  if (!any_lora_key)
    return FormatError(path + ": none of its " + std::to_string(out.key_count) +
                       " tensors is a LoRA key (lora_A/lora_B, lora_down/lora_up, LoHa, LoKr): "
                       "is it a LoRA file?");
  for (auto& [module, g] : groups) g.map = map_lora_module(module);
  mark_redundant(groups);
  out.format = describe_format(groups, peft.has_value());

  std::map<std::string, std::string> owner;  // target (+ qkv part) -> the module patching it
  for (const auto& [module, g] : groups) {
    if (g.map.targets.empty()) {
      for (const std::string& k : g.keys) out.unmatched.push_back({k, g.map.reason});
      continue;
    }
    if (g.redundant) {
      for (const std::string& k : g.keys)
        out.redundant.push_back({k, "repeats the split to_q/to_k/to_v or to_out.0 keys"});
      continue;
    }
    for (const LoraTarget& t : g.map.targets) {
      auto [it, inserted] = owner.emplace(t.module, module);
      if (!inserted)
        return FormatError(path + ": LoRA modules " + q(it->second) + " and " + q(module) +
                           " both patch " + t.module + ".weight");
    }
    ZI_TRY(make_patches(module, g, out, peft));
  }
  return out;
}

}  // namespace zimage
