// Runtime LoRAs (lora_runtime.h): resolve a request's patches against a loaded model, then merge
// them into resident weights (rows backed up first) or give the weight a low-rank side GEMM.
#include "model/adapters/lora_runtime.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

#include "core/log.h"
#include "model/adapters/lora_merge.h"

namespace zimage {

namespace {

Result<Tensor> to_f32(const Tensor& t, const std::string& what) {
  Tensor out = Tensor::host(DType::kF32, t.shape());
  if (!out.defined()) return OutOfMemory("LoRA factor " + what + " " + shape_string(t.shape()));
  if (!convert_to_f32(t.dtype(), t.data(), out.data_as<float>(), static_cast<size_t>(t.numel())))
    return Unsupported(what + ": LoRA factor of dtype " + dtype_name(t.dtype()));
  return out;
}

std::string key_list(const std::vector<LoraSkippedKey>& keys, size_t most) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < most; ++i)
    s += (i ? ", '" : "'") + keys[i].key + "' (" + keys[i].reason + ")";
  if (keys.size() > most) s += ", ... (" + std::to_string(keys.size() - most) + " more)";
  return s;
}

// One patch resolved against the model.
struct Use {
  const LoraFile* file = nullptr;
  const LoraPatch* patch = nullptr;
  float scale = 1.0f;  // the whole factor: patch scale x the request's strength
  LoraSlot slot;
};

bool mergeable(const Backend& be, const LoraSlot& s) {
  return s.tensor != nullptr && s.tensor->defined() && s.tensor->device() == be.device() &&
         s.tensor->dtype() == be.act_dtype();
}

// W[rows] += scale · ΔW on the backend, in the act dtype.
Status merge_one(Backend& be, const Use& u, Tensor& rows) {
  const LoraPatch& p = *u.patch;
  const DType act = be.act_dtype();
  Tensor delta;
  if (p.kind == LoraKind::kLowRank) {
    ZI_ASSIGN_OR_RETURN(Tensor up, to_f32(p.up, p.module));      // [rows, r]
    ZI_ASSIGN_OR_RETURN(Tensor down, to_f32(p.down, p.module));  // [r, K]
    const int64_t r = p.rank, k = p.cols;
    float* upf = up.data_as<float>();
    for (int64_t i = 0, n = up.numel(); i < n; ++i) upf[i] *= u.scale;
    Tensor down_t = Tensor::host(DType::kF32, {k, r});  // matmul takes w as [N, K]: downᵀ
    if (!down_t.defined()) return OutOfMemory("LoRA factor " + p.module);
    const float* df = down.data_as<float>();
    float* dt = down_t.data_as<float>();
    for (int64_t j = 0; j < r; ++j)
      for (int64_t c = 0; c < k; ++c) dt[c * r + j] = df[j * k + c];
    ZI_ASSIGN_OR_RETURN(Tensor up_d, be.upload(up, act));
    ZI_ASSIGN_OR_RETURN(Tensor down_d, be.upload(down_t, act));
    ZI_ASSIGN_OR_RETURN(delta, be.alloc(act, {p.rows, k}));
    ZI_TRY(be.matmul(up_d, down_d, Tensor(), delta));  // [rows, K] = up · down
  } else {
    LoraPatch scaled = p;
    scaled.scale = u.scale;
    ZI_ASSIGN_OR_RETURN(Tensor host, lora_delta(scaled));  // [rows, K] f32
    ZI_ASSIGN_OR_RETURN(delta, be.upload(host, act));
  }
  return be.axpby(1.0f, rows, 1.0f, delta, rows);
}

// The side buffers of one linear weight: every low-rank patch on it stacked along the rank.
Result<std::shared_ptr<const LoraSide>> make_side(Backend& be,
                                                  const std::vector<const Use*>& uses) {
  const int64_t n = uses[0]->slot.full_rows, k = uses[0]->slot.cols;
  int64_t rtot = 0;
  for (const Use* u : uses) rtot += u->patch->rank;
  Tensor a = Tensor::host(DType::kF32, {rtot, k});
  Tensor b = Tensor::host(DType::kF32, {n, rtot});  // zero-filled
  if (!a.defined() || !b.defined()) return OutOfMemory("LoRA side factors " + uses[0]->slot.name);
  int64_t r0 = 0;
  for (const Use* u : uses) {
    const LoraPatch& p = *u->patch;
    ZI_ASSIGN_OR_RETURN(Tensor up, to_f32(p.up, p.module));      // [rows, r]
    ZI_ASSIGN_OR_RETURN(Tensor down, to_f32(p.down, p.module));  // [r, K]
    std::copy(down.data_as<float>(), down.data_as<float>() + down.numel(),
              a.data_as<float>() + r0 * k);
    const float* uf = up.data_as<float>();
    float* bf = b.data_as<float>();
    for (int64_t i = 0; i < p.rows; ++i)
      for (int64_t j = 0; j < p.rank; ++j)
        bf[(u->slot.row0 + i) * rtot + r0 + j] = u->scale * uf[i * p.rank + j];
    r0 += p.rank;
  }
  auto side = std::make_shared<LoraSide>();
  ZI_ASSIGN_OR_RETURN(side->a, be.upload(a, be.act_dtype()));
  ZI_ASSIGN_OR_RETURN(side->b, be.upload(b, be.act_dtype()));
  return std::shared_ptr<const LoraSide>(std::move(side));
}

// Every patch resolved against the model; unmatched keys and shapes checked (warn = log the
// lenient skips).
Result<std::vector<Use>> resolve(const std::vector<RuntimeLora>& loras, bool lenient,
                                 const LoraSlotFinder& find, bool warn) {
  std::vector<Use> uses;
  for (const RuntimeLora& l : loras) {
    if (!l.file) return InvalidArgument("LoRA: no file");
    const LoraFile& f = *l.file;
    if (!std::isfinite(l.scale)) return InvalidArgument(f.path + ": LoRA scale is not finite");
    std::vector<LoraSkippedKey> unmatched = f.unmatched;
    for (const LoraPatch& p : f.patches) {
      auto slot = find(p.target);
      if (!slot.ok()) {
        if (slot.status().code() != ErrorCode::kNotFound) return slot.status();
        for (const std::string& k : p.keys) unmatched.push_back({k, slot.status().message()});
        continue;
      }
      if (slot->rows != p.rows || slot->cols != p.cols) {
        std::string keys;
        for (const std::string& k : p.keys) keys += (keys.empty() ? "'" : ", '") + k + "'";
        return FormatError(f.path + ": " + keys + ": an update of " +
                           shape_string({p.rows, p.cols}) + " does not fit " + slot->name + " " +
                           shape_string({slot->rows, slot->cols}));
      }
      uses.push_back({&f, &p, p.scale * l.scale, *slot});
    }
    if (!unmatched.empty()) {
      const std::string what = std::to_string(unmatched.size()) + " of its " +
                               std::to_string(f.key_count) + " keys match no transformer weight";
      if (!lenient)
        return FormatError(f.path + ": " + what + ": " + key_list(unmatched, 4) +
                           " (lenient mode skips them with a warning)");
      if (warn)
        ZI_WARN("LoRA %s: %s; skipped (lenient): %s", f.path.c_str(), what.c_str(),
                key_list(unmatched, 4).c_str());
    }
  }
  return uses;
}

Status apply_into(Backend& be, const std::vector<RuntimeLora>& loras, LoraMethod method,
                  bool lenient, const LoraSlotFinder& find, AppliedLoras& out) {
  // Resolve every patch; group by stored weight, in first-use order.
  ZI_ASSIGN_OR_RETURN(const std::vector<Use> uses, resolve(loras, lenient, find, true));
  std::vector<const void*> order;
  std::map<const void*, std::vector<const Use*>> groups;
  for (const Use& u : uses) {
    const void* id = u.slot.linear ? static_cast<const void*>(u.slot.linear)
                                   : static_cast<const void*>(u.slot.tensor);
    auto [it, inserted] = groups.try_emplace(id);
    if (inserted) order.push_back(id);
    it->second.push_back(&u);
  }
  out.patches = static_cast<int>(uses.size());
  for (const void* id : order) {
    const std::vector<const Use*>& g = groups[id];
    const LoraSlot& s0 = g[0]->slot;
    const bool can_merge = mergeable(be, s0);
    bool all_low_rank = true;
    for (const Use* u : g) all_low_rank = all_low_rank && u->patch->kind == LoraKind::kLowRank;
    const bool can_side = s0.linear != nullptr && all_low_rank;
    bool merge = false;
    switch (method) {
      case LoraMethod::kMerge:
      case LoraMethod::kAuto:
        merge = can_merge;
        break;
      case LoraMethod::kSide:
        merge = !can_side && can_merge;
        break;
    }
    if (method == LoraMethod::kMerge && !can_merge && !can_side)
      return Unsupported(g[0]->file->path + ": '" + g[0]->patch->keys.front() + "': " + s0.name +
                         " cannot take a LoRA at runtime (not resident in the compute dtype, and "
                         "no side GEMM for it)");
    if (!merge && !can_side)
      return Unsupported(g[0]->file->path + ": '" + g[0]->patch->keys.front() + "': " + s0.name +
                         (s0.linear == nullptr ? " is not a linear layer's weight"
                                               : " gets a LoHa / LoKr patch, which has no side "
                                                 "GEMM form") +
                         ", and it is not resident in the compute dtype to merge into");
    std::vector<AppliedLoras::Backup> backups;
    if (merge) {
      // Back up each touched row range once. Under auto, a device too full for the copies gets a
      // side GEMM instead (it needs only the low-rank factors).
      std::map<std::pair<int64_t, int64_t>, bool> saved;
      for (const Use* u : g) {
        const auto range = std::make_pair(u->slot.row0, u->slot.rows);
        if (saved[range]) continue;
        saved[range] = true;
        Tensor rows = u->slot.tensor->slice0(u->slot.row0, u->slot.row0 + u->slot.rows);
        auto copy = be.alloc(rows.dtype(), rows.shape());
        if (!copy.ok()) {
          if (method == LoraMethod::kAuto && can_side &&
              copy.status().code() == ErrorCode::kOutOfMemory) {
            ZI_WARN("LoRA: no device memory to back up %s for a merge; a side GEMM instead",
                    u->slot.name.c_str());
            merge = false;
            backups.clear();
            break;
          }
          return copy.status().with_context("backing up " + u->slot.name + " for a LoRA merge");
        }
        backups.push_back({rows, std::move(copy).value()});
      }
    }
    if (merge) {
      for (AppliedLoras::Backup& b : backups) {
        ZI_TRY(be.convert(b.target, b.saved));
        out.backups.push_back(std::move(b));
      }
      for (const Use* u : g) {
        Tensor rows = u->slot.tensor->slice0(u->slot.row0, u->slot.row0 + u->slot.rows);
        Status st = merge_one(be, *u, rows);
        if (!st.ok()) return st.with_context(u->file->path + ": merging into " + u->slot.name);
      }
      ++out.merged_weights;
    } else {
      auto side = make_side(be, g);
      if (!side.ok()) return side.status().with_context(g[0]->file->path);
      s0.linear->lora = std::move(side).value();
      out.sided.push_back(s0.linear);
      ++out.side_weights;
    }
  }
  return be.synchronize();
}

}  // namespace

const char* lora_method_name(LoraMethod m) {
  switch (m) {
    case LoraMethod::kAuto:
      return "auto";
    case LoraMethod::kMerge:
      return "merge";
    case LoraMethod::kSide:
      return "side";
  }
  return "?";
}

Result<LoraMethod> parse_lora_method(const std::string& s, const std::string& what) {
  if (s == "auto") return LoraMethod::kAuto;
  if (s == "merge") return LoraMethod::kMerge;
  if (s == "side") return LoraMethod::kSide;
  return InvalidArgument(what + ": '" + s + "' is not auto, merge or side");
}

std::string lora_set_key(const std::vector<RuntimeLora>& loras) {
  std::string key;
  for (const RuntimeLora& l : loras) {
    // The file object too: a file re-read after it changed on disk is another set.
    char buf[64];
    std::snprintf(buf, sizeof buf, "%a\x1f%p", static_cast<double>(l.scale),
                  static_cast<const void*>(l.file.get()));
    key += (l.file ? l.file->path : std::string()) + '\x1f' + buf + '\x1e';
  }
  return key;
}

Result<AppliedLoras> apply_runtime_loras(Backend& be, const std::vector<RuntimeLora>& loras,
                                         LoraMethod method, bool lenient,
                                         const LoraSlotFinder& find) {
  AppliedLoras out;
  out.key = lora_set_key(loras);
  out.loras = loras;
  Status st = apply_into(be, loras, method, lenient, find, out);
  if (!st.ok()) {
    Status undo = remove_runtime_loras(be, out);
    if (!undo.ok()) return st.with_context("(and undoing it failed: " + undo.message() + ")");
    return st;
  }
  return out;
}

Status check_runtime_loras(const std::vector<RuntimeLora>& loras, bool lenient,
                           const LoraSlotFinder& find) {
  return resolve(loras, lenient, find, false).status();
}

Status remove_runtime_loras(Backend& be, AppliedLoras& applied) {
  for (LinearWeight* w : applied.sided) w->lora.reset();
  applied.sided.clear();
  // Reverse order, so a row range backed up twice (never: each is saved once) would still end
  // with its oldest bytes.
  for (auto it = applied.backups.rbegin(); it != applied.backups.rend(); ++it)
    ZI_TRY(be.convert(it->saved, it->target));
  applied.backups.clear();
  applied.key.clear();
  applied.loras.clear();
  applied.merged_weights = applied.side_weights = applied.patches = 0;
  return be.synchronize();
}

}  // namespace zimage
