// TextToImage::enable_sequence_parallel: the transformer once more per extra rank, the ranks'
// communicator (pipeline/seqpar.h).
#include <chrono>

#include "core/log.h"
#include "io/model/model_source.h"
#include "model/adapters/lora_merge.h"
#include "model/common/linear.h"
#include "pipeline/text_to_image.h"

namespace zimage {

Status TextToImage::enable_sequence_parallel(const std::vector<Backend*>& rank_backends,
                                             const std::string& comm,
                                             const PipelineLoadOptions& options) {
  if (rank_backends.empty()) {  // one rank: the ordinary path
    seqpar_.reset();
    return Status::Ok();
  }
  if (paths_.model_dir.empty() && paths_.transformer_file.empty())
    return InvalidArgument("sequence parallel: the pipeline was not loaded from files");
  if (controlnet_)
    ZI_INFO("sequence parallel: steps with ControlNet residuals run on rank 0 alone");
  // Ulysses attention runs the bf16 kernels on the scattered heads: FP8 attention has no path
  // there, and running bf16 instead of what was asked would be silent.
  if (options.dit_fp8_compute & kFp8Sdpa)
    return InvalidArgument(
        "sequence parallel: --fp8-layers sdpa (FP8 attention) runs on one GPU only; drop sdpa "
        "or the sequence parallelism");
  const auto start = std::chrono::steady_clock::now();
  ZI_ASSIGN_OR_RETURN(ModelSource src, ModelSource::open(paths_));
  WeightPlacement place;  // resident on every rank (no streaming plan for the extra ranks)
  place.fp8_weights = options.fp8_weights;
  place.fp8_compute = options.dit_fp8_compute;
  place.keep_quantized = options.keep_quantized;
  std::vector<Backend*> backends{&be_};
  std::vector<std::unique_ptr<ZImageDiT>> dits;
  for (size_t i = 0; i < rank_backends.size(); ++i) {
    Backend& be = *rank_backends[i];
    const std::string what =
        "loading transformer for rank " + std::to_string(i + 1) + " on " + be.name();
    ZI_TRY(be.bind_thread());
    auto ws = src.open_weights("transformer");
    if (!ws.ok()) return ws.status().with_context(what);
    if (!options.loras.empty()) {
      Status st = merge_loras(*ws, options.loras, options.lora_lenient, options.lora_threads);
      if (!st.ok()) return st.with_context(what);
    }
    auto dit = ZImageDiT::load(src.configs().transformer, *ws, be, place);
    if (!dit.ok()) return dit.status().with_context(what);
    if (Status st = be.finish_uploads(); !st.ok()) return st.with_context(what);
    backends.push_back(&be);
    dits.push_back(std::move(dit).value());
  }
  ZI_TRY(be_.bind_thread());
  ZI_ASSIGN_OR_RETURN(seqpar_, SequenceParallelDiT::create(backends, std::move(dits), comm));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ZI_INFO("sequence parallel: %d ranks over %s (extra transformers loaded in %.2f s)",
          seqpar_->size(), seqpar_->describe().c_str(), s);
  return Status::Ok();
}

}  // namespace zimage
