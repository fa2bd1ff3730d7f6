// GGUF -> WeightStore (see gguf_weights.h): every tensor becomes a computed entry whose maker is
// a zero-copy view (plain types) or a dequantisation (quantised types), under its store name.
#include "io/gguf/gguf_weights.h"

#include <cctype>
#include <map>
#include <memory>

#include "core/thread_pool.h"
#include "io/gguf/gguf.h"
#include "io/gguf/gguf_quants.h"
#include "io/fs/json_util.h"

namespace zimage {
namespace {

std::string in_quotes(const std::string& s) {
  return "'" + json_util::printable(s) + "'";
}

// Dequantisation threads, started on the first large quantised tensor and shared by every GGUF
// store (the CPU backend's pool belongs to a backend; a store has none).
ThreadPool* dequant_pool() {
  static ThreadPool* pool = new ThreadPool(0);  // never destroyed: safe at exit
  return pool;
}

// llama.cpp's per-block tensor names (gguf-py tensor_mapping) -> transformers' Qwen3 names.
//
// No RoPE permutation to undo: llama.cpp's converter permutes the q/k rows of *Llama* checkpoints
// (LlamaModel.permute) because it runs that architecture with interleaved ("normal") RoPE while
// HF stores the half-split layout; its Qwen3 converter (Qwen3Model -> Qwen2Model ->
// TextModel.modify_tensors) writes q_proj / k_proj unchanged, since llama.cpp applies NEOX
// (half-split) RoPE to Qwen2/Qwen3 -- the layout of transformers' rotate_half, which the Qwen3
// encoder here implements.
const std::map<std::string, std::string>& qwen3_block_names() {
  static const auto* m = new std::map<std::string, std::string>{
      {"attn_norm", "input_layernorm"},    {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},      {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"}, {"ffn_norm", "post_attention_layernorm"},
      {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  return *m;
}

std::string qwen3_name(const std::string& t) {
  if (t == "token_embd.weight") return "model.embed_tokens.weight";
  if (t == "output_norm.weight") return "model.norm.weight";
  if (t == "output.weight") return "lm_head.weight";
  // blk.<N>.<part>.<weight|bias>
  if (t.rfind("blk.", 0) != 0) return t;
  size_t i = 4;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  if (i == 4 || i >= t.size() || t[i] != '.') return t;
  const std::string layer = t.substr(4, i - 4);
  const size_t dot = t.rfind('.');
  if (dot <= i) return t;
  const std::string part = t.substr(i + 1, dot - i - 1), suffix = t.substr(dot + 1);
  if (suffix != "weight" && suffix != "bias") return t;
  auto it = qwen3_block_names().find(part);
  if (it == qwen3_block_names().end()) return t;
  return "model.layers." + layer + "." + it->second + "." + suffix;
}

// The PyTorch shape of tensor `ti`: ComfyUI-GGUF's recorded original shape when present (its
// element count must match), else ne reversed.
Result<Shape> logical_shape(const GgufFile& f, const GgufTensorInfo& ti) {
  const std::string key = "comfy.gguf.orig_shape." + ti.name;
  if (!f.find(key)) return ti.shape();
  auto dims = f.get_int_array(key);
  if (!dims.ok()) return dims.status().with_context("tensor " + in_quotes(ti.name));
  Shape shape(dims->begin(), dims->end());
  for (int64_t d : shape) {
    if (d < 0) {
      return FormatError(f.path() + ": " + key + " holds a negative dimension " +
                         shape_string(shape));
    }
  }
  if (shape.size() > 8 || shape_numel(shape) != ti.numel()) {
    return FormatError(f.path() + ": " + key + " = " + shape_string(shape) +
                       " does not fit the stored " + shape_string(ti.shape()) + " (" +
                       std::to_string(ti.numel()) + " elements)");
  }
  return shape;
}

}  // namespace

std::string gguf_store_name(const std::string& arch, const std::string& tensor) {
  return arch == "qwen3" ? qwen3_name(tensor) : tensor;
}

Result<WeightStore> open_gguf_weights(const std::string& path) {
  ZI_ASSIGN_OR_RETURN(std::shared_ptr<GgufFile> file, GgufFile::open(path));
  return gguf_weight_store(std::move(file));
}

Result<WeightStore> gguf_weight_store(std::shared_ptr<const GgufFile> file) {
  const std::string& path = file->path();
  const std::string arch = file->architecture();
  WeightStore store = WeightStore::empty(path);
  std::map<std::string, std::string> origin;  // store name -> GGUF name
  for (const GgufTensorInfo& ti : file->tensors()) {
    const GgmlTypeInfo* tinfo = ggml_type_info(ti.type);
    DType plain = DType::kF32;
    const bool is_plain = ggml_plain_dtype(ti.type, &plain);
    if (!is_plain && !(tinfo && tinfo->dequantizable)) {
      return Unsupported(path + ": tensor " + in_quotes(ti.name) + " has type " +
                         ggml_type_name(ti.type) + ", which zimage cannot dequantise (it reads " +
                         ggml_dequantizable_type_list() + ")");
    }
    ZI_ASSIGN_OR_RETURN(Shape shape, logical_shape(*file, ti));
    ComputedWeight w;
    w.info = WeightInfo{is_plain ? plain : DType::kF32, shape, path};
    w.stored_bytes = ti.bytes;
    const std::string name = ti.name;
    if (is_plain) {
      w.make = [file, name, shape]() -> Result<Tensor> {
        ZI_ASSIGN_OR_RETURN(Tensor t, file->tensor(name));
        return t.view(shape);
      };
    } else {
      w.make = [file, name, shape]() -> Result<Tensor> {
        ZI_ASSIGN_OR_RETURN(Tensor t, file->dequantize(name, dequant_pool()));
        return t.view(shape);
      };
    }
    w.packed = [file, name, shape]() -> Result<PackedWeight> {
      ZI_ASSIGN_OR_RETURN(GgufPackedView v, file->packed(name));
      PackedWeight p;
      p.ggml_type = static_cast<uint32_t>(v.type);
      p.shape = shape;
      p.rows = v.rows;
      p.cols = v.cols;
      p.data = v.data;
      p.bytes = v.bytes;
      p.keep = file;
      return p;
    };
    const std::string store_name = gguf_store_name(arch, ti.name);
    auto [it, inserted] = origin.emplace(store_name, ti.name);
    if (!inserted) {
      return FormatError(path + ": tensors " + in_quotes(it->second) + " and " +
                         in_quotes(ti.name) + " both map to " + in_quotes(store_name));
    }
    ZI_TRY(store.add_computed(store_name, std::move(w)));
  }
  store.add_backing_file(path, file->file_size(), file);
  return store;
}

}  // namespace zimage
