// One generation job as the server tracks it: its spec, state machine (queued -> running ->
// succeeded | failed | cancelled), per-step progress, timings and encoded images. Why a type of
// its own: three parties touch a job at once (the HTTP handler that made it, the worker that runs
// it, any number of SSE watchers), so every mutable field sits behind one mutex and every change
// bumps `version` and wakes the watchers; a watcher never misses a state or a step.
//
// Memory: a job is kept after it ends (job_table.h), so when it turns final it lets go of its
// request's decoded input pixels (init image, mask, control image: up to 192 MiB each at the
// 2^26-pixel input limit, once per A1111 n_iter run) and kept_bytes() reports what it still
// holds (encoded images, prompts), which the job table's byte budget counts.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "serve/api_error.h"
#include "serve/request_parse.h"

namespace zimage::serve {

enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };
const char* state_name(JobState s);  // "queued", "running", "succeeded", "failed", "cancelled"
inline bool is_final(JobState s) {
  return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled;
}

struct EncodedImage {
  std::vector<uint8_t> bytes;
  uint64_t seed = 0;
};

// Summed over the job's engine calls.
struct JobTimings {
  double queue_wait_s = 0;
  double tokenize_s = 0;
  double text_encoder_s = 0;
  double denoise_s = 0;
  double vae_s = 0;
  double encode_s = 0;
  double total_s = 0;  // from start to finish
};

// A consistent copy of a job's mutable state.
struct JobSnapshot {
  JobState state = JobState::kQueued;
  uint64_t version = 0;
  int step = 0;                                   // denoising steps done over all runs
  int total = 0;                                  // denoising steps over all runs
  double created = 0, started = 0, finished = 0;  // unix seconds; 0 = not yet
  JobTimings timings;
  size_t image_count = 0;
  std::vector<uint64_t> image_seeds;
  ApiError error;        // when failed or cancelled
  int preview_step = 0;  // the step of the latest live preview (0 = none yet)
};

class Job {
 public:
  using Clock = std::chrono::steady_clock;

  Job(std::string id, JobSpec spec);

  const std::string& id() const { return id_; }
  // The request. Once the job is final its input images keep their sizes but no pixels (see
  // kept_bytes); every field the routes read (prompts, sizes, which inputs were given) stays.
  const JobSpec& spec() const { return spec_; }
  // The cancel flag handed to GenerateHooks::cancel.
  const std::atomic<bool>* cancel_flag() const { return &cancel_; }
  // Asks the job to stop; the first reason given is the one reported.
  void request_cancel(const std::string& reason = "cancelled by request");
  bool cancel_requested() const { return cancel_.load(); }
  std::string cancel_reason() const;

  // Live previews. The engine computes one after a step only while previews_flag() reads true
  // (GenerateHooks::preview_enabled): set at admission by a request's "preview": true, or later
  // by a watcher asking for them (events ?preview=1, A1111's /sdapi/v1/progress).
  const std::atomic<bool>* previews_flag() const { return &previews_; }
  void want_previews() { previews_.store(true); }
  // The latest preview, an encoded PNG, of denoising step `step` (over all runs); wakes watchers.
  void set_preview(int step, std::shared_ptr<const std::vector<uint8_t>> png);
  std::shared_ptr<const std::vector<uint8_t>> preview() const;

  // Transitions (the worker and the scheduler call these); each wakes the watchers.
  void mark_started();
  void set_step(int step);
  void finish_succeeded(std::vector<EncodedImage> images, const JobTimings& timings);
  void finish_failed(const ApiError& error, const JobTimings& timings);
  void finish_cancelled(const std::string& reason);

  JobSnapshot snapshot() const;
  // Waits until the version differs from `seen` or `timeout` passes; returns the snapshot.
  JobSnapshot wait_change(uint64_t seen, std::chrono::milliseconds timeout) const;
  // Waits until the job is final (or `timeout` passes; false then).
  bool wait_final(std::chrono::milliseconds timeout) const;

  // Image k's bytes (empty when the job has no image k).
  std::vector<uint8_t> image(size_t k) const;
  size_t image_bytes() const;  // memory held by the encoded images
  // Memory the job holds: the encoded images plus what its spec still holds (prompt texts, LoRA
  // names, input pixels: none once final). What the job table's byte budget counts.
  size_t kept_bytes() const;
  Clock::time_point finished_at() const;

 private:
  void bump_locked();
  // Frees the spec's input pixels (called once the job is final: the worker no longer reads
  // them; the engine copied what a run still in flight needs).
  void release_inputs_locked();

  const std::string id_;
  JobSpec spec_;  // written only by release_inputs_locked (pixel buffers, under mu_)
  std::atomic<bool> cancel_{false};
  std::atomic<bool> previews_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  JobSnapshot s_;
  Clock::time_point queued_tp_, started_tp_, finished_tp_;
  std::vector<EncodedImage> images_;
  std::shared_ptr<const std::vector<uint8_t>> preview_;
  size_t image_bytes_ = 0;
  std::string cancel_reason_;
};

}  // namespace zimage::serve
