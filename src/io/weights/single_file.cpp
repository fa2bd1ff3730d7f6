// See single_file.h.
#include "io/weights/single_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <set>

#include "io/gguf/gguf.h"
#include "io/fs/json_util.h"
#include "io/weights/safetensors.h"

namespace zimage {
namespace {

struct Rule {
  Component c;
  std::vector<std::string> prefixes;  // tried in order
  std::vector<std::string> markers;   // one of them under the prefix means "present"
};

const std::array<Rule, 3>& rules() {
  static const std::array<Rule, 3> r = {
      Rule{Component::kTransformer,
           {"model.diffusion_model.", "diffusion_model.", ""},
           {"cap_embedder.1.weight"}},
      Rule{Component::kTextEncoder,
           {"text_encoders.qwen3_4b.transformer.", "text_encoders.qwen3_4b.", "cond_stage_model.",
            ""},
           {"model.embed_tokens.weight", "embed_tokens.weight"}},
      Rule{Component::kVae, {"vae.", "first_stage_model.", ""}, {"decoder.conv_in.weight"}}};
  return r;
}

// Top-level namespaces that belong to some component of a checkpoint (and to no other).
const std::vector<std::string>& component_namespaces() {
  static const std::vector<std::string> n = {"model.diffusion_model.", "diffusion_model.",
                                             "text_encoders.",         "cond_stage_model.",
                                             "conditioner.",           "vae.",
                                             "first_stage_model."};
  return n;
}

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

SingleFileLayout::Part& part_of(SingleFileLayout& l, Component c) {
  return c == Component::kTransformer   ? l.transformer
         : c == Component::kTextEncoder ? l.text_encoder
                                        : l.vae;
}

std::string q(const std::string& s) {
  return "'" + json_util::printable(s) + "'";
}

}  // namespace

const char* component_name(Component c) {
  switch (c) {
    case Component::kTransformer:
      return "transformer";
    case Component::kTextEncoder:
      return "text_encoder";
    case Component::kVae:
      return "vae";
  }
  return "?";
}

const SingleFileLayout::Part& SingleFileLayout::part(Component c) const {
  return c == Component::kTransformer   ? transformer
         : c == Component::kTextEncoder ? text_encoder
                                        : vae;
}

std::string SingleFileLayout::describe() const {
  std::string s;
  for (Component c : {Component::kTransformer, Component::kTextEncoder, Component::kVae}) {
    const Part& p = part(c);
    if (!p.present) continue;
    s += (s.empty() ? "" : ", ") + std::string(component_name(c));
    if (!p.prefix.empty()) s += " (prefix " + q(p.prefix) + ")";
  }
  return s.empty() ? "no Z-Image component" : s;
}

SingleFileLayout detect_single_file(const std::vector<std::string>& names) {
  const std::set<std::string> set(names.begin(), names.end());
  SingleFileLayout l;
  for (const Rule& r : rules()) {
    for (const std::string& p : r.prefixes) {
      const bool found = std::any_of(r.markers.begin(), r.markers.end(),
                                     [&](const std::string& m) { return set.count(p + m) != 0; });
      if (found) {
        part_of(l, r.c) = {true, p};
        break;
      }
    }
  }
  return l;
}

Result<ComponentWeights> open_component_file(const std::string& path, Component c) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return NotFound(path + ": no such file");
  if (!S_ISREG(st.st_mode))
    return InvalidArgument(path + ": not a file (give a single .safetensors file)");
  // A .gguf file (io/gguf/gguf_weights.h) has its own quantisation and no safetensors header.
  const bool gguf = file_has_gguf_magic(path);
  std::shared_ptr<SafetensorsFile> file;
  if (!gguf) {
    ZI_ASSIGN_OR_RETURN(file, SafetensorsFile::open(path));
  }
  ZI_ASSIGN_OR_RETURN(WeightStore ws, WeightStore::open(path));
  const SingleFileLayout layout = detect_single_file(ws.names());
  const SingleFileLayout::Part& mine = layout.part(c);
  if (!mine.present) {
    return NotFound(path + ": holds no " + std::string(component_name(c)) + " tensors (it holds " +
                    layout.describe() + ")");
  }
  // Drop what belongs to the file's other components; keep whatever else is at the top level,
  // so the loader names it as unexpected.
  for (const std::string& n : ws.names()) {
    bool other = false;
    for (Component o : {Component::kTransformer, Component::kTextEncoder, Component::kVae}) {
      const SingleFileLayout::Part& p = layout.part(o);
      if (o != c && p.present && !p.prefix.empty() && starts_with(n, p.prefix)) other = true;
    }
    if (!mine.prefix.empty() && !starts_with(n, mine.prefix)) {
      for (const std::string& ns : component_namespaces())
        if (starts_with(n, ns)) other = true;
    }
    if (other) ZI_TRY(ws.remove(n));
  }
  ZI_TRY(ws.strip_prefix(mine.prefix));
  ComponentWeights out;
  out.store = std::move(ws);
  out.prefix = mine.prefix;
  auto index = std::make_shared<ScaledFp8Index>();
  if (file) {
    ZI_ASSIGN_OR_RETURN(out.fp8, apply_scaled_fp8(out.store, file, mine.prefix, index.get()));
  }
  out.fp8_index = std::move(index);
  return out;
}

}  // namespace zimage
