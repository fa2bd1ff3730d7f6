// Opening and loading the transformer alone (pipeline/transformer_load.h).
#include "pipeline/transformer_load.h"

#include <utility>

#include "core/log.h"
#include "io/fs/file_io.h"
#include "io/fs/json_util.h"
#include "io/model/infer_config.h"
#include "io/model/model_folder.h"
#include "io/weights/single_file.h"
#include "model/adapters/lora_merge.h"

namespace zimage {

namespace {

// A transformer folder: config.json parsed and validated before any weight is opened.
Result<TransformerSource> open_folder(const std::string& dir) {
  const std::string config = dir + "/config.json";
  ZI_ASSIGN_OR_RETURN(std::string text, json_util::read_text(config, 16 << 20));
  TransformerSource src;
  ZI_ASSIGN_OR_RETURN(src.config, parse_transformer_config(text, config));
  ZI_ASSIGN_OR_RETURN(src.weights, WeightStore::open(dir));
  src.description = dir + " (config.json)";
  return src;
}

}  // namespace

Result<TransformerSource> open_transformer_source(const std::string& path) {
  if (path.empty()) return NotFound("no transformer path given");
  if (path_is_folder(path)) {
    if (path_is_file(path + "/transformer/config.json")) return open_folder(path + "/transformer");
    if (path_is_file(path + "/config.json")) return open_folder(path);
    return NotFound(path +
                    ": neither a model folder (transformer/config.json) nor a transformer folder "
                    "(config.json)");
  }
  if (!path_is_file(path)) return NotFound(path + ": no such file or folder");
  ZI_ASSIGN_OR_RETURN(ComponentWeights cw, open_component_file(path, Component::kTransformer));
  TransformerSource src;
  ZI_ASSIGN_OR_RETURN(src.config, infer_transformer_config(tensor_shapes(cw.store), path));
  src.weights = std::move(cw.store);
  src.description = path + " (config inferred from the tensor shapes" +
                    (cw.fp8.describe().empty() ? std::string() : "; " + cw.fp8.describe()) + ")";
  return src;
}

Result<std::unique_ptr<ZImageDiT>> load_transformer(const TransformerConfig& cfg, WeightStore& ws,
                                                    Backend& be, const WeightPlacement& placement,
                                                    const PipelineLoadOptions& options) {
  if (!options.loras.empty()) {  // the targeted tensors become W + LoRA, made as they are read
    Status st = merge_loras(ws, options.loras, options.lora_lenient, options.lora_threads);
    if (!st.ok()) return st.with_context("loading transformer");
  }
  auto dit = ZImageDiT::load(cfg, ws, be, placement);
  if (!dit.ok()) return dit.status();  // the loader names itself
  if (const std::string k = (*dit)->kept_quantized().describe(); !k.empty())
    ZI_INFO("transformer: %s", k.c_str());
  return std::move(dit).value();
}

}  // namespace zimage
