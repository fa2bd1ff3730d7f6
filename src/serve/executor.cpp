// One-at-a-time execution (see executor.h). Every exception stops at run_job: the job fails with
// a clear error, the worker goes on with the next one.
#include "serve/executor.h"

#include <chrono>
#include <exception>
#include <new>

#include "serve/image_encode.h"
#include "serve/preview.h"

namespace zimage::serve {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

void SerialExecutor::run(JobSource& jobs) {
  while (std::shared_ptr<Job> job = jobs.wait_pop()) {
    run_job(*job);
    jobs.done(job);
  }
}

void SerialExecutor::run_job(Job& job) noexcept {
  const auto start = Clock::now();
  JobTimings t;
  // Metrics are counted before the job turns final, so a client that saw the result also sees
  // it counted.
  auto fail = [&](const ApiError& e) {
    t.total_s = since(start);
    ++metrics_->jobs_failed;
    job.finish_failed(e, t);
  };
  try {
    const JobSpec& spec = job.spec();
    std::vector<EncodedImage> images;
    int steps_before = 0;
    for (const GenerateRequest& req : spec.runs) {
      GenerateHooks hooks;
      hooks.cancel = job.cancel_flag();
      hooks.on_progress = [&job, steps_before](const Progress& p) {
        if (p.phase == Phase::kDenoise && p.step > 0) job.set_step(steps_before + p.step);
      };
      add_preview_hooks(job, steps_before, *metrics_, hooks);
      Result<GenerateResult> r = runner_->generate(req, hooks);
      if (!r.ok()) {
        if (r.status().code() == ErrorCode::kCancelled || job.cancel_requested()) {
          std::string reason = job.cancel_reason();
          ++metrics_->jobs_cancelled;
          job.finish_cancelled(reason.empty() ? "cancelled" : reason);
          return;
        }
        ApiError e = api_error(rename_fields(r.status(), spec.dialect));
        e.message = "generation failed: " + e.message;
        fail(e);
        return;
      }
      const PhaseTimings& pt = r->timings;
      t.tokenize_s += pt.tokenize_s;
      t.text_encoder_s += pt.text_encoder_s;
      t.denoise_s += pt.denoise_s();
      t.vae_s += pt.vae_s;
      const auto encode_start = Clock::now();
      for (size_t i = 0; i < r->images.size(); ++i) {
        Result<std::vector<uint8_t>> bytes =
            encode_image(r->images[i], spec.output_format, spec.quality, png_metadata(req, i));
        if (!bytes.ok()) {
          fail(api_error(bytes.status()));
          return;
        }
        images.push_back(EncodedImage{std::move(bytes).value(), req.seed});
      }
      t.encode_s += since(encode_start);
      steps_before += denoising_steps(req);
    }
    t.total_s = since(start);
    ++metrics_->jobs_succeeded;
    metrics_->images_generated += images.size();
    metrics_->observe_phase("queue_wait", job.snapshot().timings.queue_wait_s);
    metrics_->observe_phase("tokenize", t.tokenize_s);
    metrics_->observe_phase("text_encoder", t.text_encoder_s);
    metrics_->observe_phase("denoise", t.denoise_s);
    metrics_->observe_phase("vae", t.vae_s);
    metrics_->observe_phase("encode", t.encode_s);
    metrics_->observe_phase("total", t.total_s);
    job.finish_succeeded(std::move(images), t);
  } catch (const std::bad_alloc&) {
    fail_safely(job, t, 503, "generation failed: out of memory");
  } catch (const std::exception& ex) {
    fail_safely(job, t, 500, ex.what());
  } catch (...) {
    fail_safely(job, t, 500, "generation failed: unknown error");
  }
}

void SerialExecutor::fail_safely(Job& job, const JobTimings& t, int status,
                                 const char* what) noexcept {
  ++metrics_->jobs_failed;
  try {
    std::string message = what;
    if (message.rfind("generation failed", 0) != 0) message = "generation failed: " + message;
    job.finish_failed(ApiError{status, "server_error", std::move(message), ""}, t);
  } catch (...) {
    // Even the error could not be built (no memory at all): a fixed message needs no allocation
    // beyond what ApiError's empty strings hold, so try once more with nothing but the status.
    try {
      job.finish_failed(ApiError{status, "server_error", "generation failed", ""}, t);
    } catch (...) {
      job.request_cancel("generation failed");  // the job stays visible as cancel_requested
    }
  }
}

}  // namespace zimage::serve
