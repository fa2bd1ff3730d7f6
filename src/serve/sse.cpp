// SSE event sequencing (see sse.h).
#include "serve/sse.h"

#include <nlohmann/json.hpp>

#include "serve/image_encode.h"
#include "serve/routes.h"

namespace zimage::serve {

namespace {
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
}  // namespace

std::string SseStream::event(const std::string& name, const std::string& data_json) {
  return "event: " + name + "\ndata: " + data_json + "\n\n";
}

std::string SseStream::next(const JobSnapshot& s, int position) {
  std::string out;
  seen_ = s.version;
  const std::string& id = job_->id();
  if (s.state == JobState::kQueued) {
    if (position != last_position_)
      out +=
          event("queued", dump({{"id", id}, {"status", "queued"}, {"queue_position", position}}));
    last_position_ = position;
    first_ = false;
    return out;
  }
  const bool ran = s.started > 0;
  if (!started_ && ran && !(first_ && is_final(s.state))) {
    out += event("started", dump({{"id", id}, {"status", "running"}, {"total", s.total}}));
    started_ = true;
  }
  if (started_) {
    // A late client gets the current step only; one that watched from the start gets each step.
    if (first_ && s.step > 0) last_step_ = s.step - 1;
    for (int k = last_step_ + 1; k <= s.step; ++k)
      out += event("progress", dump({{"step", k}, {"total", s.total}}));
    if (s.step > last_step_) last_step_ = s.step;
    if (s.preview_step > last_preview_ && !is_final(s.state)) {
      std::shared_ptr<const std::vector<uint8_t>> png = job_->preview();
      if (png != nullptr) {
        out += event("preview", dump({{"step", s.preview_step},
                                      {"total", s.total},
                                      {"content_type", "image/png"},
                                      {"image", base64_encode(*png)}}));
      }
      last_preview_ = s.preview_step;
    }
  }
  first_ = false;
  if (!is_final(s.state)) return out;
  nlohmann::json fin = {{"id", id}, {"status", state_name(s.state)}};
  if (s.state == JobState::kSucceeded) {
    nlohmann::json images = nlohmann::json::array();
    for (size_t k = 0; k < s.image_count; ++k)
      images.push_back({{"url", base_ + image_path(id, k)}, {"seed", s.image_seeds[k]}});
    fin["images"] = std::move(images);
    fin["timings"] = {{"queue_wait_s", s.timings.queue_wait_s}, {"total_s", s.timings.total_s}};
    out += event("done", dump(fin));
  } else {
    fin["error"] = {{"message", s.error.message}, {"type", s.error.type}};
    out += event(s.state == JobState::kFailed ? "failed" : "cancelled", dump(fin));
  }
  finished_ = true;
  return out;
}

}  // namespace zimage::serve
