// merge_loras (lora_merge.h): resolve LoRA patches against the transformer's WeightStore,
// check them, report them, and turn each targeted tensor into W + Σ scale · ΔW.
#include "model/adapters/lora_merge.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <thread>

#include "backend/cpu/cpu_gemm.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "io/fs/json_util.h"
#include "io/weights/safetensors.h"

namespace zimage {

namespace {

std::string q(const std::string& s) {
  return "'" + json_util::printable(s) + "'";
}

bool starts_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}

// The DiT loader's prefix rule (model/dit/zimage_dit_weights.cpp): single files carry one.
std::string store_prefix(const WeightStore& ws) {
  for (const char* cand : {"model.diffusion_model.", "diffusion_model."})
    if (ws.contains(std::string(cand) + "x_pad_token")) return cand;
  return "";
}

Result<Tensor> to_f32(const Tensor& t) {
  Tensor out = Tensor::host(DType::kF32, t.shape());
  if (!out.defined()) return OutOfMemory("LoRA factor " + shape_string(t.shape()));
  if (!convert_to_f32(t.dtype(), t.data(), out.data_as<float>(), static_cast<size_t>(t.numel())))
    return Unsupported(std::string("LoRA factor of dtype ") + dtype_name(t.dtype()));
  return out;
}

// a [m, r] · b [r, n] -> [m, n], times alpha (float32, OpenBLAS).
Result<Tensor> matmul(const Tensor& a, const Tensor& b, float alpha) {
  ZI_ASSIGN_OR_RETURN(Tensor af, to_f32(a));
  ZI_ASSIGN_OR_RETURN(Tensor bf, to_f32(b));
  const int64_t m = a.dim(0), r = a.dim(1), n = b.dim(1);
  Tensor c = Tensor::host(DType::kF32, {m, n});
  if (!c.defined()) return OutOfMemory("LoRA delta " + shape_string({m, n}));
  cpu::sgemm_nn(m, n, r, alpha, af.data_as<float>(), r, bf.data_as<float>(), n, 0.0f,
                c.data_as<float>(), n);
  return c;
}

Result<Tensor> factor(const Tensor& full, const Tensor& a, const Tensor& b) {
  if (full.defined()) return to_f32(full);
  return matmul(a, b, 1.0f);
}

// The leaf of a target for the compact --verbose list: "layers.3.attention.to_q.weight" ->
// ("layers.3", "attention.to_q").
std::pair<std::string, std::string> block_and_leaf(const std::string& target) {
  std::string t = target.substr(0, target.size() - std::string(".weight").size());
  for (const char* b : {"layers.", "noise_refiner.", "context_refiner."}) {
    if (!starts_with(t, b)) continue;
    const size_t dot = t.find('.', std::string(b).size());
    if (dot != std::string::npos) return {t.substr(0, dot), t.substr(dot + 1)};
  }
  return {"top level", t};
}

std::string key_list(const std::vector<LoraSkippedKey>& keys, size_t shown) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < shown; ++i)
    out += (i ? ", " : "") + q(keys[i].key) + " (" + keys[i].reason + ")";
  if (keys.size() > shown) out += " and " + std::to_string(keys.size() - shown) + " more";
  return out;
}

struct Resolved {
  std::shared_ptr<const LoraPatch> patch;
  StoreTarget where;
};

Status shape_error(const LoraFile& lora, const LoraPatch& p, const StoreTarget& where) {
  std::string keys;
  for (const std::string& k : p.keys) {
    const SafetensorsTensorInfo* info = lora.file ? lora.file->find(k) : nullptr;
    keys += (keys.empty() ? "LoRA key " : ", ") + q(k) +
            (info ? " " + shape_string(info->shape) : std::string());
  }
  return FormatError(lora.path + ": " + keys + ": an update of " + shape_string({p.rows, p.cols}) +
                     " does not fit " + p.target + " " + shape_string({where.rows, where.cols}) +
                     (where.name != p.target ? " (stored as " + where.name + ")" : ""));
}

void log_lora(const LoraFile& lora, const std::vector<Resolved>& applied) {
  ZI_INFO("LoRA %s (scale %g): %s; %zu keys -> %zu patches", lora.path.c_str(),
          static_cast<double>(lora.user_scale), lora.format.c_str(), lora.key_count,
          applied.size());
  std::map<std::string, std::string> lines;  // block -> "leaf r4, leaf r2 ..."
  std::vector<std::string> order;
  for (const Resolved& r : applied) {
    const LoraPatch& p = *r.patch;
    auto [block, leaf] = block_and_leaf(p.target);
    std::string item =
        leaf + " " +
        (p.kind == LoraKind::kLowRank ? "" : std::string(lora_kind_name(p.kind)) + " ") + "r" +
        std::to_string(p.rank);
    if (p.scale != lora.user_scale) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " x%.4g", static_cast<double>(p.scale));
      item += buf;
    }
    if (r.where.name != p.target) {  // another name in the store: ComfyUI's layout
      std::string shown = r.where.name.substr(0, r.where.name.size() - 7);  // no ".weight"
      const size_t pos = shown.find(block + ".");
      if (block != "top level" && pos != std::string::npos)
        shown = shown.substr(pos + block.size() + 1);
      item += " -> " + shown;
      if (r.where.row0 != 0 || shown.find("qkv") != std::string::npos)
        item += "[" + std::to_string(r.where.row0) + ":" +
                std::to_string(r.where.row0 + r.where.rows) + "]";
    }
    if (!lines.count(block)) order.push_back(block);
    std::string& line = lines[block];
    line += (line.empty() ? "" : ", ") + item;
  }
  for (const std::string& b : order) ZI_INFO("  %s: %s", b.c_str(), lines[b].c_str());
  for (const LoraSkippedKey& k : lora.redundant)
    ZI_INFO("  skipped %s: %s", k.key.c_str(), k.reason.c_str());
}

// dst[0, n) += src[0, n) on the pool; false when a sum is not finite (a scale far too large).
bool add_into(float* dst, const float* src, int64_t n, ThreadPool& pool) {
  std::atomic<bool> finite{true};
  pool.parallel_for(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    bool ok = true;
    for (int64_t i = b; i < e; ++i) {
      dst[i] += src[i];
      ok &= std::isfinite(dst[i]);
    }
    if (!ok) finite.store(false, std::memory_order_relaxed);
  });
  return finite.load();
}

Status overflow() {
  return FormatError("the sum overflows float32 (is a LoRA scale far too large?)");
}

// Adds a low-rank patch's scale · up · down into its rows of w, in blocks of kBlockRows rows
// counted from the patch's first row: the same products in the same order whichever tensor (and
// row offset) the patch lands in, and no full-size temporary.
Status add_low_rank(const LoraPatch& p, float* w_rows, ThreadPool& pool) {
  constexpr int64_t kBlockRows = 256;
  ZI_ASSIGN_OR_RETURN(Tensor up, to_f32(p.up));      // [rows, r]
  ZI_ASSIGN_OR_RETURN(Tensor down, to_f32(p.down));  // [r, cols]
  const int64_t r = p.rank, cols = p.cols;
  Tensor block = Tensor::host(DType::kF32, {std::min(kBlockRows, p.rows), cols});
  if (!block.defined()) return OutOfMemory("LoRA delta block for " + p.target);
  for (int64_t r0 = 0; r0 < p.rows; r0 += kBlockRows) {
    const int64_t m = std::min(kBlockRows, p.rows - r0);
    cpu::sgemm_nn(m, cols, r, p.scale, up.data_as<float>() + r0 * r, r, down.data_as<float>(), cols,
                  0.0f, block.data_as<float>(), cols);
    if (!add_into(w_rows + r0 * cols, block.data_as<float>(), m * cols, pool)) return overflow();
  }
  return Status::Ok();
}

// base (any float dtype) + every patch's scale · ΔW at its rows, in float32. The elementwise
// passes run on `pool` (a full-size weight has 40M elements), the products in OpenBLAS. A sum
// that is not finite is an error.
Result<Tensor> merged(const Tensor& base, const std::vector<Resolved>& patches,
                      const std::string& name, ThreadPool& pool) {
  if (!dtype_is_float(base.dtype()))
    return Unsupported("LoRA merge of " + name + ": non-float dtype " + dtype_name(base.dtype()));
  // Not zero-filled (Tensor::host is): every element is written by the conversion below, whose
  // threads also take the first-touch page faults.
  const int64_t n = base.numel();
  auto storage = HostStorage::allocate(static_cast<size_t>(n) * sizeof(float));
  if (!storage) return OutOfMemory("LoRA merge of " + name);
  Tensor w(std::move(storage), 0, DType::kF32, base.shape());
  const size_t es = dtype_size(base.dtype());
  pool.parallel_for(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    convert_to_f32(base.dtype(), static_cast<const char*>(base.data()) + b * es,
                   w.data_as<float>() + b, static_cast<size_t>(e - b));
  });
  // The CPU ops set their own BLAS thread count before each call; the merge may use every core.
  cpu::set_blas_threads(pool.size());
  for (const Resolved& r : patches) {
    float* rows = w.data_as<float>() + r.where.row0 * r.where.cols;
    Status st;
    if (r.patch->kind == LoraKind::kLowRank) {
      st = add_low_rank(*r.patch, rows, pool);
    } else {
      auto delta = lora_delta(*r.patch);  // [rows, cols], scale applied
      st = delta.status();
      if (delta.ok() && !add_into(rows, delta->data_as<float>(), delta->numel(), pool))
        st = overflow();
    }
    if (!st.ok()) return st.with_context("LoRA merge of " + name);
  }
  return w;
}

}  // namespace

Result<StoreTarget> resolve_dit_weight(const WeightStore& ws, const std::string& canonical) {
  const std::string pre = store_prefix(ws);
  auto found = [&](const std::string& name, int64_t part, int parts) -> Result<StoreTarget> {
    ZI_ASSIGN_OR_RETURN(WeightInfo info, ws.info(name));
    if (info.shape.size() != 2 || info.shape[0] % parts != 0)
      return FormatError(ws.path() + ": " + name + " has shape " + shape_string(info.shape) +
                         ", not a linear weight a LoRA can patch");
    StoreTarget t;
    t.name = name;
    t.rows = info.shape[0] / parts;
    t.row0 = part * t.rows;
    t.cols = info.shape[1];
    return t;
  };
  if (ws.contains(pre + canonical)) return found(pre + canonical, 0, 1);
  // ComfyUI's names for the same weights.
  for (int part = 0; part < 3; ++part) {
    static const char* kQkv[] = {".attention.to_q.weight", ".attention.to_k.weight",
                                 ".attention.to_v.weight"};
    const std::string leaf = kQkv[part];
    if (canonical.size() > leaf.size() &&
        canonical.compare(canonical.size() - leaf.size(), leaf.size(), leaf) == 0) {
      const std::string fused =
          pre + canonical.substr(0, canonical.size() - leaf.size()) + ".attention.qkv.weight";
      if (ws.contains(fused)) return found(fused, part, 3);
    }
  }
  std::string alt;
  const std::string out0 = ".attention.to_out.0.weight";
  if (canonical.size() > out0.size() &&
      canonical.compare(canonical.size() - out0.size(), out0.size(), out0) == 0) {
    alt = canonical.substr(0, canonical.size() - out0.size()) + ".attention.out.weight";
  } else if (starts_with(canonical, "all_x_embedder.")) {
    alt = "x_embedder.weight";
  } else if (starts_with(canonical, "all_final_layer.")) {
    const size_t dot = canonical.find('.', std::string("all_final_layer.").size());
    if (dot != std::string::npos) alt = "final_layer." + canonical.substr(dot + 1);
  }
  if (!alt.empty() && ws.contains(pre + alt)) return found(pre + alt, 0, 1);
  return NotFound("the model has no weight " + canonical);
}

Result<Tensor> lora_delta(const LoraPatch& p) {
  const int64_t rows = p.rows, cols = p.cols;
  if (p.kind == LoraKind::kLowRank) {
    if (p.up.dim(0) != rows || p.down.dim(1) != cols)
      return InternalError("LoRA patch " + p.target + ": factors do not match its size");
    return matmul(p.up, p.down, p.scale);  // [rows, r] · [r, cols]
  }
  Tensor full;  // the module's whole delta, before the row cut
  if (p.kind == LoraKind::kLoHa) {
    ZI_ASSIGN_OR_RETURN(full, matmul(p.w1_a, p.w1_b, p.scale));
    ZI_ASSIGN_OR_RETURN(Tensor b, matmul(p.w2_a, p.w2_b, 1.0f));
    float* f = full.data_as<float>();
    const float* g = b.data_as<float>();
    for (int64_t i = 0, n = full.numel(); i < n; ++i) f[i] *= g[i];
  } else {
    ZI_ASSIGN_OR_RETURN(Tensor w1, factor(p.w1, p.w1_a, p.w1_b));  // [a, b]
    ZI_ASSIGN_OR_RETURN(Tensor w2, factor(p.w2, p.w2_a, p.w2_b));  // [c, d]
    const int64_t a = w1.dim(0), b = w1.dim(1), c = w2.dim(0), d = w2.dim(1);
    full = Tensor::host(DType::kF32, {a * c, b * d});
    if (!full.defined()) return OutOfMemory("LoKr delta for " + p.target);
    const float* x = w1.data_as<float>();
    const float* y = w2.data_as<float>();
    float* o = full.data_as<float>();
    for (int64_t i = 0; i < a; ++i)
      for (int64_t k = 0; k < c; ++k)
        for (int64_t j = 0; j < b; ++j) {
          const float s = p.scale * x[i * b + j];
          float* row = o + (i * c + k) * (b * d) + j * d;
          for (int64_t l = 0; l < d; ++l) row[l] = s * y[k * d + l];
        }
  }
  if (full.dim(1) != cols || p.delta_row0 + rows > full.dim(0))
    return InternalError("LoRA patch " + p.target + ": delta does not match its size");
  if (p.delta_row0 == 0 && rows == full.dim(0)) return full;
  Tensor cut = Tensor::host(DType::kF32, {rows, cols});
  if (!cut.defined()) return OutOfMemory("LoRA delta for " + p.target);
  std::copy(full.data_as<float>() + p.delta_row0 * cols,
            full.data_as<float>() + (p.delta_row0 + rows) * cols, cut.data_as<float>());
  return cut;
}

Status merge_loras(WeightStore& ws, const std::vector<LoraSpec>& loras, bool lenient, int threads) {
  // store tensor -> its patches, in --lora order
  std::map<std::string, std::vector<Resolved>> by_tensor;
  std::vector<std::string> tensor_order;
  for (const LoraSpec& spec : loras) {
    ZI_ASSIGN_OR_RETURN(LoraFile lora, read_lora(spec.path, spec.scale));
    std::vector<Resolved> applied;
    for (const LoraPatch& p : lora.patches) {
      auto where = resolve_dit_weight(ws, p.target);
      if (!where.ok()) {
        if (where.status().code() != ErrorCode::kNotFound) return where.status();
        for (const std::string& k : p.keys) {
          const bool listed = std::any_of(lora.unmatched.begin(), lora.unmatched.end(),
                                          [&](const LoraSkippedKey& u) { return u.key == k; });
          if (!listed) lora.unmatched.push_back({k, where.status().message()});
        }
        continue;
      }
      if (where->rows != p.rows || where->cols != p.cols) return shape_error(lora, p, *where);
      applied.push_back({std::make_shared<const LoraPatch>(p), *where});
    }
    if (!lora.unmatched.empty()) {
      const std::string what = std::to_string(lora.unmatched.size()) + " of its " +
                               std::to_string(lora.key_count) + " keys match no transformer weight";
      if (!lenient)
        return FormatError(lora.path + ": " + what + ": " + key_list(lora.unmatched, 4) +
                           " (--lora-lenient skips them with a warning)");
      ZI_WARN("LoRA %s: %s; skipped (lenient): %s", lora.path.c_str(), what.c_str(),
              key_list(lora.unmatched, 4).c_str());
    }
    if (!lora.redundant.empty())
      ZI_WARN(
          "LoRA %s: %zu key(s) repeat the split to_q/to_k/to_v or to_out.0 keys of the same "
          "blocks and are skipped, as diffusers skips them",
          lora.path.c_str(), lora.redundant.size());
    log_lora(lora, applied);
    for (Resolved& r : applied) {
      auto [it, inserted] = by_tensor.try_emplace(r.where.name);
      if (inserted) tensor_order.push_back(r.where.name);
      it->second.push_back(std::move(r));
    }
  }
  if (tensor_order.empty()) return Status::Ok();
  // Host threads for the merges, alive as long as the store's merged tensors can be made.
  auto pool = std::make_shared<ThreadPool>(threads);
  for (const std::string& name : tensor_order) {
    std::vector<Resolved> patches = std::move(by_tensor[name]);
    ZI_TRY(ws.transform(name, DType::kF32, [patches, name, pool](const Tensor& base) {
      return merged(base, patches, name, *pool);
    }));
  }
  return Status::Ok();
}

}  // namespace zimage
