// A one-line progress bar for `zimage generate` on stderr: phase, denoising steps, seconds per
// step and the time left. Why its own file: the CLI's other commands (and the benchmarks) report
// progress the same way, and the formatting is unit-testable without a terminal.
#pragma once

#include <cstdio>
#include <string>

#include "zimage/zimage.h"

namespace zimage::cli {

// "[########............] 3/8  1.25 s/it  ETA 6.3s" (width = bar cells).
std::string format_progress_line(int step, int total, double seconds_per_step, int width = 24);

class ProgressBar {
 public:
  // Draws only when `enabled`; `out` is normally stderr.
  ProgressBar(bool enabled, std::FILE* out) : enabled_(enabled), out_(out) {}
  ~ProgressBar() { finish(""); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Feeds one progress event from the engine (GenerateHooks::on_progress).
  void update(const Progress& p);
  // Ends the line (idempotent).
  // Ends the line with `final_text` ("done", "cancelled", "failed") if the bar was drawn.
  void finish(const std::string& final_text = "done");

 private:
  void draw(const std::string& line);

  bool enabled_;
  std::FILE* out_;
  bool open_ = false;  // a line is on screen without its newline
  double denoise_start_ = -1;
  size_t last_len_ = 0;
};

// True when `f` is a terminal (progress defaults to on there).
bool is_terminal(std::FILE* f);

}  // namespace zimage::cli
