// See model_source.h.
#include "io/model/model_source.h"

#include "core/log.h"
#include "io/fs/file_io.h"
#include "io/model/infer_config.h"
#include "io/model/model_folder.h"

namespace zimage {
namespace {

const char* flag_of(Component c) {
  return c == Component::kTransformer   ? "dit"
         : c == Component::kTextEncoder ? "text-encoder"
                                        : "vae";
}

// Chooses the config of a file component: the folder's when the shapes agree, else the inferred.
template <typename Config>
void choose(Config& current, const Config& inferred, bool have_folder, std::string& origin,
            const std::string& what, const std::string& file) {
  if (have_folder && same_shapes(current, inferred)) {
    origin = "model folder config (same shapes)";
    return;
  }
  if (have_folder)
    ZI_INFO("%s: %s differs in shape from the model folder's; using the shapes of %s", what.c_str(),
            file.c_str(), file.c_str());
  current = inferred;
  origin = "inferred from the tensor shapes";
}

}  // namespace

std::string ModelPaths::describe() const {
  std::string s = model_dir;
  auto add = [&s](const char* what, const std::string& f) {
    if (!f.empty()) s += std::string(s.empty() ? "" : " + ") + what + " " + f;
  };
  add("dit", transformer_file);
  add("text encoder", text_encoder_file);
  add("vae", vae_file);
  return s;
}

Result<ModelSource> ModelSource::open(const ModelPaths& paths) {
  ModelSource m;
  m.paths_ = paths;
  for (Component c : {Component::kTransformer, Component::kTextEncoder, Component::kVae})
    m.parts_[static_cast<int>(c)] = Part{};
  const bool have_folder = !paths.model_dir.empty();
  const std::string* files[] = {&paths.transformer_file, &paths.text_encoder_file, &paths.vae_file};
  if (!have_folder) {
    std::string missing;
    for (Component c : {Component::kTransformer, Component::kTextEncoder, Component::kVae}) {
      if (files[static_cast<int>(c)]->empty())
        missing += (missing.empty() ? "" : ", ") + std::string(flag_of(c)) + " file";
    }
    if (!missing.empty())
      return InvalidArgument(
          "no model folder given: without one, the transformer, text encoder "
          "and VAE files are all needed (missing: " +
          missing + ")");
    if (paths.tokenizer_dir.empty())
      return InvalidArgument("no model folder given: a tokenizer folder is needed");
  }
  if (have_folder) {
    ZI_ASSIGN_OR_RETURN(ModelFolder folder, ModelFolder::open(paths.model_dir));
    m.folder_dir_ = folder.dir();
    m.configs_ = folder.configs();
    m.tokenizer_dir_ = folder.tokenizer_dir();
  } else {
    m.configs_ = zimage_turbo_reference_configs();
    m.configs_.scheduler = published_scheduler_config();
  }
  if (!paths.tokenizer_dir.empty()) {
    if (!path_is_folder(paths.tokenizer_dir))
      return NotFound(paths.tokenizer_dir + ": no such tokenizer folder");
    if (!path_is_file(paths.tokenizer_dir + "/tokenizer.json"))
      return NotFound(paths.tokenizer_dir +
                      "/tokenizer.json: no such file (the tokenizer is needed)");
    m.tokenizer_dir_ = paths.tokenizer_dir;
  }

  for (Component c : {Component::kTransformer, Component::kTextEncoder, Component::kVae}) {
    const std::string& file = *files[static_cast<int>(c)];
    if (file.empty()) continue;
    Part& p = m.parts_[static_cast<int>(c)];
    p.file = file;
    ZI_ASSIGN_OR_RETURN(ComponentWeights opened, open_component_file(file, c));
    p.fp8 = opened.fp8;
    const TensorShapes shapes = tensor_shapes(opened.store);
    const std::string what = std::string(component_name(c));
    if (c == Component::kTransformer) {
      ZI_ASSIGN_OR_RETURN(TransformerConfig inferred, infer_transformer_config(shapes, file));
      choose(m.configs_.transformer, inferred, have_folder, p.config_origin, what, file);
    } else if (c == Component::kTextEncoder) {
      ZI_ASSIGN_OR_RETURN(TextEncoderConfig inferred, infer_text_encoder_config(shapes, file));
      choose(m.configs_.text_encoder, inferred, have_folder, p.config_origin, what, file);
    } else {
      ZI_ASSIGN_OR_RETURN(VaeConfig inferred, infer_vae_config(shapes, file));
      choose(m.configs_.vae, inferred, have_folder, p.config_origin, what, file);
    }
  }

  // Cross-component checks, naming the sources that disagree.
  auto origin = [&m](Component c) {
    const std::string& f = m.file(c);
    return f.empty() ? m.folder_dir_ + "/" + component_name(c) : f;
  };
  const ZImageConfigs& cf = m.configs_;
  if (cf.transformer.cap_feat_dim != cf.text_encoder.hidden_size)
    return FormatError(
        "the transformer (" + origin(Component::kTransformer) +
        ") takes caption features of width " + std::to_string(cf.transformer.cap_feat_dim) +
        " but the text encoder (" + origin(Component::kTextEncoder) + ") has hidden size " +
        std::to_string(cf.text_encoder.hidden_size) + ": they are not parts of one model");
  if (cf.transformer.in_channels != cf.vae.latent_channels)
    return FormatError("the transformer (" + origin(Component::kTransformer) + ") has " +
                       std::to_string(cf.transformer.in_channels) +
                       " latent channels but the VAE (" + origin(Component::kVae) + ") has " +
                       std::to_string(cf.vae.latent_channels) +
                       ": they are not parts of one model");
  return m;
}

const std::string& ModelSource::file(Component c) const {
  return part(c).file;
}

const std::string& ModelSource::config_origin(Component c) const {
  return part(c).config_origin;
}

const Fp8Summary& ModelSource::fp8(Component c) const {
  return part(c).fp8;
}

Result<WeightStore> ModelSource::open_weights(Component c) const {
  ZI_ASSIGN_OR_RETURN(ComponentWeights cw, open_component(c));
  return std::move(cw.store);
}

Result<ComponentWeights> ModelSource::open_component(Component c) const {
  const Part& p = part(c);
  if (!p.file.empty()) return open_component_file(p.file, c);
  ZI_ASSIGN_OR_RETURN(WeightStore ws, WeightStore::open(folder_dir_ + "/" + component_name(c)));
  ComponentWeights cw;
  cw.store = std::move(ws);
  cw.fp8_index = std::make_shared<ScaledFp8Index>();
  return cw;
}

Result<WeightStore> ModelSource::open_weights(const std::string& component) const {
  for (Component c : {Component::kTransformer, Component::kTextEncoder, Component::kVae})
    if (component == component_name(c)) return open_weights(c);
  return InvalidArgument("'" + component +
                         "' is not a weight component (transformer, text_encoder, vae)");
}

}  // namespace zimage
