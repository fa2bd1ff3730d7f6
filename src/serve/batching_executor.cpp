// Continuous batching of jobs (see batching_executor.h). Everything here runs on the worker
// thread; no exception leaves run(): a job whose runs fail is failed alone, the batch goes on.
#include "serve/batching_executor.h"

#include <exception>
#include <new>
#include <utility>

#include "serve/image_encode.h"
#include "serve/preview.h"

namespace zimage::serve {

namespace {
double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
// The engine steps one LoRA set at a time (Engine::batch_step): a job of another set would wait
// in the batch instead of the queue.
bool same_loras(const std::vector<LoraSpec>& a, const std::vector<LoraSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].path != b[i].path || a[i].scale != b[i].scale) return false;
  return true;
}
}  // namespace

int BatchingExecutor::images_running() const {
  int n = 0;
  for (const auto& [k, a] : actives_) n += a->images_in_batch;
  return n;
}

void BatchingExecutor::run(JobSource& jobs) {
  for (;;) {
    try {
      if (tickets_.empty()) {
        actives_.clear();
        std::shared_ptr<Job> job = jobs.wait_pop();
        if (!job) return;  // shutting down and nothing left
        admit(job, jobs);
        continue;
      }
      // Room left: queued jobs of the size the engine steps now (its oldest request's) join.
      const Active* lead = nullptr;
      for (const auto& [k, a] : actives_)
        if (!a->over) {
          lead = a.get();
          break;
        }
      while (lead != nullptr && images_running() < max_images_) {
        const int room = max_images_ - images_running();
        std::shared_ptr<Job> next = jobs.try_pop_if([&](const Job& q) {
          const GenerateRequest& r = q.spec().runs.front();
          return r.width == lead->width && r.height == lead->height &&
                 same_loras(r.loras, lead->loras) && q.spec().images() <= room;
        });
        if (!next) break;
        admit(next, jobs);
      }
      const uint64_t in_step = static_cast<uint64_t>(runner_->batch_active());
      std::vector<BatchOutcome> outcomes = runner_->batch_step();
      ++metrics_->batch_steps;
      metrics_->batch_step_requests += in_step;
      uint64_t seen = metrics_->max_step_requests.load();
      while (in_step > seen && !metrics_->max_step_requests.compare_exchange_weak(seen, in_step)) {
      }
      for (BatchOutcome& o : outcomes) on_outcome(o, jobs);
      // Jobs that ended and have no run left in the engine leave the table.
      for (auto it = actives_.begin(); it != actives_.end();) {
        bool referenced = false;
        for (const auto& [t, ref] : tickets_) referenced = referenced || ref.first == it->second;
        it = (it->second->over && !referenced) ? actives_.erase(it) : std::next(it);
      }
    } catch (...) {
      // Only allocation failures get here (the engine calls do not throw): fail what runs, keep
      // serving.
      for (auto& [k, a] : actives_) {
        if (!a->over)
          fail(*a, ApiError{503, "server_error", "generation failed: out of memory", ""}, jobs);
        a->job->request_cancel("generation failed");
      }
    }
  }
}

bool BatchingExecutor::admit(const std::shared_ptr<Job>& job, JobSource& jobs) noexcept {
  try {
    auto a = std::make_shared<Active>();
    a->job = job;
    a->start = Clock::now();
    const JobSpec& spec = job->spec();
    a->run_steps.assign(spec.runs.size(), 0);
    a->images.resize(spec.runs.size());
    a->width = spec.runs.front().width;
    a->height = spec.runs.front().height;
    a->loras = spec.runs.front().loras;
    a->images_in_batch = spec.images();
    actives_.emplace(next_active_++, a);
    for (size_t i = 0; i < spec.runs.size(); ++i) {
      GenerateHooks hooks;
      hooks.cancel = job->cancel_flag();
      Active* raw = a.get();
      hooks.on_progress = [raw, i](const Progress& p) {
        if (p.phase != Phase::kDenoise || p.step <= 0) return;
        raw->run_steps[i] = p.step;
        int sum = 0;
        for (int s : raw->run_steps) sum += s;
        raw->job->set_step(sum);
      };
      int before = 0;  // preview steps count over the job's runs as progress does
      for (size_t k = 0; k < i; ++k) before += denoising_steps(spec.runs[k]);
      add_preview_hooks(*job, before, *metrics_, hooks);
      Result<uint64_t> ticket = runner_->batch_add(spec.runs[i], hooks);
      if (!ticket.ok()) {
        if (ticket.status().code() == ErrorCode::kCancelled || job->cancel_requested()) {
          a->over = true;
          ++metrics_->jobs_cancelled;
          const std::string reason = job->cancel_reason();
          job->finish_cancelled(reason.empty() ? "cancelled" : reason);
          jobs.done(job);
        } else {
          ApiError e = api_error(rename_fields(ticket.status(), spec.dialect));
          e.message = "generation failed: " + e.message;
          fail(*a, e, jobs);
        }
        job->request_cancel("generation failed");  // runs already added leave at the next step
        return false;
      }
      tickets_.emplace(*ticket, std::make_pair(a, i));
      ++a->runs_left;
    }
    return true;
  } catch (...) {
    try {
      job->finish_failed(ApiError{503, "server_error", "generation failed: out of memory", ""}, {});
    } catch (...) {
    }
    job->request_cancel("generation failed");
    jobs.done(job);
    return false;
  }
}

void BatchingExecutor::on_outcome(BatchOutcome& o, JobSource& jobs) noexcept {
  auto it = tickets_.find(o.id);
  if (it == tickets_.end()) return;
  std::shared_ptr<Active> a = it->second.first;
  const size_t run = it->second.second;
  tickets_.erase(it);
  if (a->over) return;  // the job already ended (a sibling run failed or it was cancelled)
  Job& job = *a->job;
  const JobSpec& spec = job.spec();
  try {
    if (!o.result.ok()) {
      if (o.result.status().code() == ErrorCode::kCancelled || job.cancel_requested()) {
        a->over = true;
        ++metrics_->jobs_cancelled;
        const std::string reason = job.cancel_reason();
        job.finish_cancelled(reason.empty() ? "cancelled" : reason);
        jobs.done(a->job);
        return;
      }
      ApiError e = api_error(rename_fields(o.result.status(), spec.dialect));
      e.message = "generation failed: " + e.message;
      fail(*a, e, jobs);
      job.request_cancel("generation failed");  // the job's other runs leave at the next step
      return;
    }
    const GenerateResult& r = o.result.value();
    const GenerateRequest& req = spec.runs[run];
    a->timings.tokenize_s += r.timings.tokenize_s;
    a->timings.text_encoder_s += r.timings.text_encoder_s;
    a->timings.denoise_s += r.timings.denoise_s();
    a->timings.vae_s += r.timings.vae_s;
    const auto encode_start = Clock::now();
    for (size_t k = 0; k < r.images.size(); ++k) {
      Result<std::vector<uint8_t>> bytes =
          encode_image(r.images[k], spec.output_format, spec.quality, png_metadata(req, k));
      if (!bytes.ok()) {
        fail(*a, api_error(bytes.status()), jobs);
        job.request_cancel("generation failed");
        return;
      }
      a->images[run].push_back(EncodedImage{std::move(bytes).value(), req.seed});
    }
    a->timings.encode_s += since(encode_start);
    if (--a->runs_left == 0) end(*a, jobs);
  } catch (...) {
    fail(*a, ApiError{503, "server_error", "generation failed: out of memory", ""}, jobs);
    job.request_cancel("generation failed");
  }
}

void BatchingExecutor::end(Active& a, JobSource& jobs) noexcept {
  try {
    std::vector<EncodedImage> all;
    for (auto& run_images : a.images)
      for (auto& img : run_images) all.push_back(std::move(img));
    a.timings.total_s = since(a.start);
    Job& job = *a.job;
    ++metrics_->jobs_succeeded;
    metrics_->images_generated += all.size();
    metrics_->observe_phase("queue_wait", job.snapshot().timings.queue_wait_s);
    metrics_->observe_phase("tokenize", a.timings.tokenize_s);
    metrics_->observe_phase("text_encoder", a.timings.text_encoder_s);
    metrics_->observe_phase("denoise", a.timings.denoise_s);
    metrics_->observe_phase("vae", a.timings.vae_s);
    metrics_->observe_phase("encode", a.timings.encode_s);
    metrics_->observe_phase("total", a.timings.total_s);
    a.over = true;
    job.finish_succeeded(std::move(all), a.timings);
    jobs.done(a.job);
  } catch (...) {
    fail(a, ApiError{503, "server_error", "generation failed: out of memory", ""}, jobs);
  }
}

void BatchingExecutor::fail(Active& a, const ApiError& e, JobSource& jobs) noexcept {
  if (a.over) return;
  a.over = true;
  a.timings.total_s = since(a.start);
  ++metrics_->jobs_failed;
  try {
    a.job->finish_failed(e, a.timings);
  } catch (...) {
    try {
      a.job->finish_failed(ApiError{e.status, "server_error", "generation failed", ""}, a.timings);
    } catch (...) {
    }
  }
  jobs.done(a.job);
}

}  // namespace zimage::serve
