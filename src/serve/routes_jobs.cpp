// Asynchronous jobs: POST /v1/jobs (202 + id), GET /v1/jobs/{id} (state, queue position, step,
// timings, image URLs), GET /v1/jobs/{id}/events (Server-Sent Events), DELETE /v1/jobs/{id}
// (cancel, idempotent), GET /v1/jobs/{id}/images/{k} (the image, PNG with its metadata).
// Ids are checked for shape before lookup, so a path-like id ("..", "%2e%2e") is a 400.
#include <chrono>

#include "serve/http_util.h"
#include "serve/routes.h"
#include "serve/sse.h"

namespace zimage::serve {

namespace {

using nlohmann::json;

// The job named by the first path capture; on failure an error is sent and nullptr returned.
std::shared_ptr<Job> find_job(ServeContext& ctx, const http::Request& req, http::Response& res) {
  const std::string id = req.matches.size() > 1 ? req.matches[1].str() : "";
  if (!well_formed_job_id(id)) {
    send_error(res, bad_request("id", "id: not a job id (32 lowercase hex digits)"));
    return nullptr;
  }
  std::shared_ptr<Job> job = ctx.jobs.find(id);
  if (job == nullptr)
    send_error(res, not_found("id", "id: no job " + id + " (unknown, or finished and expired)"));
  return job;
}

}  // namespace

std::string image_path(const std::string& job_id, size_t k) {
  return "/v1/jobs/" + job_id + "/images/" + std::to_string(k);
}

json job_parameters(const JobSpec& spec) {
  const GenerateRequest& r = spec.runs.front();
  json p = {{"prompt", r.prompts.front()},
            {"size", std::to_string(r.width) + "x" + std::to_string(r.height)},
            {"width", r.width},
            {"height", r.height},
            {"num_inference_steps", r.steps},
            {"guidance_scale", r.guidance},
            {"seed", r.seed},
            {"random_seed", spec.random_seed},
            {"n", r.images_per_prompt},
            {"output_format", format_name(spec.output_format)}};
  if (r.negative_prompt) p["negative_prompt"] = *r.negative_prompt;
  if (r.control_image) {  // ControlNet (inpainting with a mask); no strength
    p["mode"] = r.mask ? "controlnet_inpaint" : "controlnet";
    p["control_scale"] = r.control_scale;
  } else if (r.init_image) {  // image-to-image / inpainting (the images are not echoed)
    p["mode"] = r.mask ? "inpaint" : "img2img";
    p["strength"] = effective_strength(r);
    p["denoising_steps"] = denoising_steps(r);
  }
  if (spec.runs.size() > 1) p["n_iter"] = spec.runs.size();
  return p;
}

json job_json(ServeContext& ctx, const Job& job, const std::string& base) {
  const JobSnapshot s = job.snapshot();
  json j = {{"id", job.id()},
            {"object", "job"},
            {"status", state_name(s.state)},
            {"step", s.step},
            {"total_steps", s.total},
            {"progress", s.total > 0 ? static_cast<double>(s.step) / s.total : 0.0},
            {"created", s.created},
            {"cancel_requested", job.cancel_requested()},
            {"parameters", job_parameters(job.spec())},
            {"previews", job.previews_flag()->load()}};
  if (s.state == JobState::kQueued) j["queue_position"] = ctx.scheduler.position(job);
  if (s.started > 0) j["started"] = s.started;
  if (s.finished > 0) j["finished"] = s.finished;
  if (s.started > 0)
    j["timings"] = {{"queue_wait_s", s.timings.queue_wait_s},
                    {"tokenize_s", s.timings.tokenize_s},
                    {"text_encoder_s", s.timings.text_encoder_s},
                    {"denoise_s", s.timings.denoise_s},
                    {"vae_s", s.timings.vae_s},
                    {"encode_s", s.timings.encode_s},
                    {"total_s", s.timings.total_s}};
  if (s.state == JobState::kSucceeded) {
    json images = json::array();
    for (size_t k = 0; k < s.image_count; ++k)
      images.push_back({{"url", base + image_path(job.id(), k)},
                        {"seed", s.image_seeds[k]},
                        {"content_type", mime_type(job.spec().output_format)}});
    j["images"] = std::move(images);
  }
  if (s.state == JobState::kFailed || s.state == JobState::kCancelled)
    j["error"] = {{"message", s.error.message}, {"type", s.error.type}};
  return j;
}

void add_job_routes(RouteTable& svr, ServeContext& ctx) {
  svr.post("/v1/jobs", guard([&ctx](const http::Request& req, http::Response& res) {
             // A JSON body (generations' fields) or the edits form (an image: img2img,
             // inpainting, ControlNet inpainting), as /v1/images/edits but answered at once.
             std::shared_ptr<Job> job;
             if (req.is_multipart_form_data()) {
               std::vector<FormPart> form;
               for (const auto& [name, part] : req.files)
                 form.push_back({name, part.filename, part.content});
               job = make_and_admit(
                   ctx,
                   [&form](const ParseLimits& limits, uint64_t seed) {
                     return parse_openai_edit(form, limits, seed);
                   },
                   res);
             } else {
               job = parse_and_admit(ctx, parse_openai, req, res);
             }
             if (job == nullptr) return;
             res.set_header("Location", "/v1/jobs/" + job->id());
             json body = {{"id", job->id()},
                          {"object", "job"},
                          {"status", state_name(job->snapshot().state)},
                          {"url", "/v1/jobs/" + job->id()},
                          {"events_url", "/v1/jobs/" + job->id() + "/events"},
                          {"seed", job->spec().runs.front().seed}};
             const int position = ctx.scheduler.position(*job);
             if (position >= 0) body["queue_position"] = position;  // absent once it runs
             send_json(res, 202, body);
           }));

  // Every client's jobs, for the web page's queue view: a short reference (the id's first 8 hex
  // digits: a full id would let any watcher cancel the job), progress, size; never a prompt.
  svr.get("/v1/queue", guard([&ctx](const http::Request&, http::Response& res) {
            const Scheduler::Listing l = ctx.scheduler.list();
            auto item = [](const Job& job) {
              const JobSnapshot s = job.snapshot();
              const GenerateRequest& r = job.spec().runs.front();
              return json{{"ref", job.id().substr(0, 8)},
                          {"step", s.step},
                          {"total", s.total},
                          {"size", std::to_string(r.width) + "x" + std::to_string(r.height)},
                          {"images", job.spec().images()}};
            };
            json running = json::array(), queued = json::array();
            for (const auto& j : l.running) running.push_back(item(*j));
            for (size_t i = 0; i < l.queued.size(); ++i) {
              json q = item(*l.queued[i]);
              q["position"] = i;
              queued.push_back(std::move(q));
            }
            send_json(res, 200, {{"running", std::move(running)}, {"queued", std::move(queued)}});
          }));

  svr.get(R"(/v1/jobs/([^/]+))", guard([&ctx](const http::Request& req, http::Response& res) {
            std::shared_ptr<Job> job = find_job(ctx, req, res);
            if (job != nullptr) send_json(res, 200, job_json(ctx, *job, base_url(req)));
          }));

  svr.del(R"(/v1/jobs/([^/]+))", guard([&ctx](const http::Request& req, http::Response& res) {
            std::shared_ptr<Job> job = find_job(ctx, req, res);
            if (job == nullptr) return;
            ctx.scheduler.cancel(job, "cancelled by request");
            send_json(res, 200, job_json(ctx, *job, base_url(req)));
          }));

  svr.get(
      R"(/v1/jobs/([^/]+)/images/([^/]+))",
      guard([&ctx](const http::Request& req, http::Response& res) {
        std::shared_ptr<Job> job = find_job(ctx, req, res);
        if (job == nullptr) return;
        const std::string k = req.matches[2].str();
        const JobSnapshot s = job->snapshot();
        if (s.state != JobState::kSucceeded) {
          send_error(res, ApiError{409, "invalid_request_error",
                                   std::string("id: the job has no images (it is ") +
                                       state_name(s.state) + ")",
                                   "id"});
          return;
        }
        size_t index = 0;
        bool ok = !k.empty() && k.size() <= 4;
        for (char c : k) ok = ok && c >= '0' && c <= '9';
        if (ok) index = std::stoul(k);
        if (!ok || index >= s.image_count) {
          send_error(res, not_found("index", "index: the job has " + std::to_string(s.image_count) +
                                                 " image(s), numbered from 0"));
          return;
        }
        const std::vector<uint8_t> bytes = job->image(index);
        const OutputFormat f = job->spec().output_format;
        res.set_header("Content-Disposition", "inline; filename=\"zimage-" + job->id() + "-" + k +
                                                  "." + format_name(f) + "\"");
        res.set_header("Cache-Control", "private, max-age=3600");
        res.set_content(reinterpret_cast<const char*>(bytes.data()), bytes.size(), mime_type(f));
      }));

  svr.get(R"(/v1/jobs/([^/]+)/events)",
          guard([&ctx](const http::Request& req, http::Response& res) {
            std::shared_ptr<Job> job = find_job(ctx, req, res);
            if (job == nullptr || !reserve_waiting_slot(ctx, res)) return;
            if (query_flag(req.query, "preview", false)) job->want_previews();
            auto stream = std::make_shared<SseStream>(job, base_url(req));
            auto waiting = std::make_shared<WaitingResponse>(ctx);
            res.set_header("Cache-Control", "no-store");
            res.set_header("X-Accel-Buffering", "no");
            res.set_chunked_content_provider(
                "text/event-stream", [&ctx, job, stream, waiting](size_t, http::DataSink& sink) {
                  try {
                    const bool first = stream->first();
                    const JobSnapshot s =
                        first ? job->snapshot()
                              : job->wait_change(stream->seen_version(), std::chrono::seconds(1));
                    std::string out = stream->next(s, ctx.scheduler.position(*job));
                    if (out.empty()) out = ": keep-alive\n\n";
                    if (!sink.write(out.data(), out.size())) return false;
                    if (stream->finished()) sink.done();
                    return true;
                  } catch (...) {
                    return false;  // ends this stream only
                  }
                });
          }));
}

}  // namespace zimage::serve
