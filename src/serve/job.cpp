// Job state machine and change notification (see job.h).
#include "serve/job.h"

#include <algorithm>
#include <optional>
#include <vector>

namespace zimage::serve {

namespace {
double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void release_pixels(std::optional<Image>& image) {
  if (image) std::vector<uint8_t>().swap(image->rgb);  // the width and height stay
}

size_t pixel_bytes(const std::optional<Image>& image) {
  return image ? image->rgb.capacity() : 0;
}

// What a spec holds on the heap: prompt texts, LoRA names and input pixels.
size_t spec_bytes(const JobSpec& spec) {
  size_t n = spec.runs.capacity() * sizeof(GenerateRequest);
  for (const GenerateRequest& r : spec.runs) {
    for (const std::string& p : r.prompts) n += sizeof(std::string) + p.capacity();
    if (r.negative_prompt) n += r.negative_prompt->capacity();
    for (const LoraSpec& l : r.loras) n += sizeof(LoraSpec) + l.path.capacity();
    n += pixel_bytes(r.init_image) + pixel_bytes(r.mask) + pixel_bytes(r.control_image);
  }
  return n;
}
}  // namespace

const char* state_name(JobState s) {
  switch (s) {
    case JobState::kQueued:
      return "queued";
    case JobState::kRunning:
      return "running";
    case JobState::kSucceeded:
      return "succeeded";
    case JobState::kFailed:
      return "failed";
    case JobState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

Job::Job(std::string id, JobSpec spec) : id_(std::move(id)), spec_(std::move(spec)) {
  previews_.store(spec_.preview);
  s_.total = spec_.total_steps();
  s_.created = unix_now();
  queued_tp_ = Clock::now();
}

void Job::request_cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancel_reason_.empty()) cancel_reason_ = reason;
  cancel_.store(true);
}

std::string Job::cancel_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancel_reason_;
}

void Job::bump_locked() {
  ++s_.version;
  cv_.notify_all();
}

void Job::release_inputs_locked() {
  preview_.reset();  // the final image replaces it
  for (GenerateRequest& r : spec_.runs) {
    release_pixels(r.init_image);
    release_pixels(r.mask);
    release_pixels(r.control_image);
  }
}

void Job::mark_started() {
  std::lock_guard<std::mutex> lock(mu_);
  if (is_final(s_.state)) return;
  s_.state = JobState::kRunning;
  s_.started = unix_now();
  started_tp_ = Clock::now();
  s_.timings.queue_wait_s = std::chrono::duration<double>(started_tp_ - queued_tp_).count();
  bump_locked();
}

void Job::set_step(int step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (is_final(s_.state) || step <= s_.step) return;
  s_.step = std::min(step, s_.total);
  bump_locked();
}

void Job::set_preview(int step, std::shared_ptr<const std::vector<uint8_t>> png) {
  std::lock_guard<std::mutex> lock(mu_);
  if (is_final(s_.state) || png == nullptr) return;
  preview_ = std::move(png);
  s_.preview_step = step;
  bump_locked();
}

std::shared_ptr<const std::vector<uint8_t>> Job::preview() const {
  std::lock_guard<std::mutex> lock(mu_);
  return preview_;
}

void Job::finish_succeeded(std::vector<EncodedImage> images, const JobTimings& timings) {
  std::lock_guard<std::mutex> lock(mu_);
  if (is_final(s_.state)) return;
  const double wait = s_.timings.queue_wait_s;
  s_.timings = timings;
  s_.timings.queue_wait_s = wait;
  s_.state = JobState::kSucceeded;
  s_.step = s_.total;
  s_.finished = unix_now();
  finished_tp_ = Clock::now();
  s_.image_count = images.size();
  image_bytes_ = 0;
  for (const EncodedImage& im : images) {
    s_.image_seeds.push_back(im.seed);
    image_bytes_ += im.bytes.size();
  }
  images_ = std::move(images);
  release_inputs_locked();
  bump_locked();
}

void Job::finish_failed(const ApiError& error, const JobTimings& timings) {
  std::lock_guard<std::mutex> lock(mu_);
  if (is_final(s_.state)) return;
  const double wait = s_.timings.queue_wait_s;
  s_.timings = timings;
  s_.timings.queue_wait_s = wait;
  s_.state = JobState::kFailed;
  s_.error = error;
  s_.finished = unix_now();
  finished_tp_ = Clock::now();
  release_inputs_locked();
  bump_locked();
}

void Job::finish_cancelled(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (is_final(s_.state)) return;
  s_.state = JobState::kCancelled;
  s_.error = ApiError{409, "cancelled", reason, ""};
  s_.finished = unix_now();
  finished_tp_ = Clock::now();
  release_inputs_locked();
  bump_locked();
}

JobSnapshot Job::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

JobSnapshot Job::wait_change(uint64_t seen, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return s_.version != seen; });
  return s_;
}

bool Job::wait_final(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return is_final(s_.state); });
}

std::vector<uint8_t> Job::image(size_t k) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (k >= images_.size()) return {};
  return images_[k].bytes;
}

size_t Job::image_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return image_bytes_;
}

size_t Job::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return image_bytes_ + spec_bytes(spec_);
}

Job::Clock::time_point Job::finished_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_tp_;
}

}  // namespace zimage::serve
