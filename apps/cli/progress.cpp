// Progress bar rendering (see progress.h). Redraws the line in place with '\r' and pads with
// spaces so a shorter line fully covers a longer one.
#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace zimage::cli {

std::string format_progress_line(int step, int total, double seconds_per_step, int width) {
  total = std::max(total, 1);
  step = std::clamp(step, 0, total);
  width = std::max(width, 1);
  const int filled = static_cast<int>(static_cast<int64_t>(step) * width / total);
  // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict on "literal" + string.
  std::string line;
  line.reserve(static_cast<size_t>(width) + 64);
  line.push_back('[');
  line.append(static_cast<size_t>(filled), '#');
  line.append(static_cast<size_t>(width - filled), '.');
  line.append("] ");
  line.append(std::to_string(step));
  line.push_back('/');
  line.append(std::to_string(total));
  char buf[96];
  if (step > 0 && std::isfinite(seconds_per_step) && seconds_per_step >= 0) {
    const double eta = seconds_per_step * (total - step);
    if (seconds_per_step >= 1.0 || seconds_per_step == 0.0)
      std::snprintf(buf, sizeof(buf), "  %.2f s/it  ETA %.1fs", seconds_per_step, eta);
    else
      std::snprintf(buf, sizeof(buf), "  %.2f it/s  ETA %.1fs", 1.0 / seconds_per_step, eta);
    line += buf;
  }
  return line;
}

void ProgressBar::draw(const std::string& line) {
  std::string padded = line;
  if (padded.size() < last_len_) padded.append(last_len_ - padded.size(), ' ');
  last_len_ = line.size();
  std::fprintf(out_, "\r%s", padded.c_str());
  std::fflush(out_);
  open_ = true;
}

void ProgressBar::update(const Progress& p) {
  if (!enabled_) return;
  switch (p.phase) {
    case Phase::kTokenize:
      draw("tokenizing");
      break;
    case Phase::kTextEncoder:
      draw("encoding the prompt");
      break;
    case Phase::kDenoise: {
      if (p.step == 0) denoise_start_ = p.elapsed_s;
      const double spent = p.elapsed_s - std::max(denoise_start_, 0.0);
      const double per_step = p.step > 0 ? spent / p.step : 0.0;
      draw("denoising " + format_progress_line(p.step, p.total, per_step));
      break;
    }
    case Phase::kVae:
      draw("decoding the image");
      break;
    case Phase::kVaeEncode:
      draw("encoding the init image");
      break;
  }
}

void ProgressBar::finish(const std::string& final_text) {
  if (!enabled_ || !open_) return;
  draw(final_text);
  std::fputc('\n', out_);
  std::fflush(out_);
  open_ = false;
}

bool is_terminal(std::FILE* f) {
  return f != nullptr && ::isatty(::fileno(f)) == 1;
}

}  // namespace zimage::cli
