#include "serve/preview.h"

#include <memory>
#include <utility>
#include <vector>

namespace zimage::serve {

void add_preview_hooks(Job& job, int steps_before, Metrics& metrics, GenerateHooks& hooks) {
  hooks.preview_enabled = job.previews_flag();
  hooks.on_preview = [&job, &metrics, steps_before](const Preview& p) {
    ++metrics.previews;
    Image image;
    image.width = p.width;
    image.height = p.height;
    image.rgb = p.rgb;
    Result<std::vector<uint8_t>> png = png_encode(image);
    if (!png.ok()) return;  // a preview is best effort: the job goes on without it
    job.set_preview(steps_before + p.step,
                    std::make_shared<const std::vector<uint8_t>>(std::move(png).value()));
  };
}

}  // namespace zimage::serve
