// Automatic1111's API, the subset image front-ends use: POST /sdapi/v1/txt2img and
// /sdapi/v1/img2img (init_images, mask, denoising_strength: image-to-image and inpainting)
// (synchronous; base64 PNGs, the parameters and an "info" JSON string with the seeds) and GET
// /sdapi/v1/progress (the running job). Same queue, limits and errors as the OpenAI routes.
#include <chrono>

#include "serve/http_util.h"
#include "serve/image_encode.h"
#include "serve/routes.h"

namespace zimage::serve {

using nlohmann::json;

namespace {

// The response of txt2img and img2img: base64 images, the parameters, an "info" JSON string.
void send_a1111_images(ServeContext& ctx, const std::shared_ptr<Job>& job, http::Response& res) {
  const JobSnapshot s = job->snapshot();
  const JobSpec& spec = job->spec();
  const GenerateRequest& r = spec.runs.front();
  json images = json::array();
  json seeds = json::array();
  for (size_t k = 0; k < s.image_count; ++k) {
    images.push_back(base64_encode(job->image(k)));
    seeds.push_back(s.image_seeds[k]);
  }
  json parameters = {{"prompt", r.prompts.front()},
                     {"negative_prompt", r.negative_prompt.value_or("")},
                     {"width", r.width},
                     {"height", r.height},
                     {"steps", r.steps},
                     {"cfg_scale", r.guidance},
                     {"seed", r.seed},
                     {"batch_size", r.images_per_prompt},
                     {"n_iter", spec.runs.size()}};
  json info = {{"prompt", r.prompts.front()},
               {"negative_prompt", r.negative_prompt.value_or("")},
               {"seed", r.seed},
               {"all_seeds", seeds},
               {"width", r.width},
               {"height", r.height},
               {"steps", r.steps},
               {"cfg_scale", r.guidance},
               {"sampler_name", "FlowMatchEulerDiscrete"},
               {"sd_model_name", ctx.options.model_name},
               {"job_id", job->id()}};
  if (r.init_image) {
    if (!r.control_image) {  // ControlNet inpainting has no strength
      parameters["denoising_strength"] = r.strength.value_or(0.75);
      info["denoising_strength"] = r.strength.value_or(0.75);
    }
    parameters["inpaint"] = r.mask.has_value();
  }
  send_json(res, 200,
            {{"images", std::move(images)},
             {"parameters", std::move(parameters)},
             {"info", info.dump(-1, ' ', false, json::error_handler_t::replace)}});
}

}  // namespace

void add_a1111_routes(RouteTable& svr, ServeContext& ctx) {
  svr.post("/sdapi/v1/txt2img", guard([&ctx](const http::Request& req, http::Response& res) {
             std::shared_ptr<Job> job = generate_and_wait(ctx, parse_a1111, req, res);
             if (job != nullptr) send_a1111_images(ctx, job, res);
           }));
  svr.post("/sdapi/v1/img2img", guard([&ctx](const http::Request& req, http::Response& res) {
             std::shared_ptr<Job> job = generate_and_wait(ctx, parse_a1111_img2img, req, res);
             if (job != nullptr) send_a1111_images(ctx, job, res);
           }));

  svr.get("/sdapi/v1/progress", guard([&ctx](const http::Request& req, http::Response& res) {
            std::shared_ptr<Job> job = ctx.scheduler.running();
            // A1111's skip_current_image (default false): a client that wants the picture turns
            // the running job's live previews on from its next step (none is computed before).
            const bool want_image = !query_flag(req.query, "skip_current_image", false);
            json current_image = nullptr;
            json state = {
                {"skipped", false},   {"interrupted", false},
                {"job", ""},          {"job_count", static_cast<int64_t>(ctx.scheduler.depth())},
                {"sampling_step", 0}, {"sampling_steps", 0}};
            double progress = 0, eta = 0;
            if (job != nullptr) {
              const JobSnapshot s = job->snapshot();
              state["job"] = job->id();
              state["job_count"] = static_cast<int64_t>(ctx.scheduler.depth()) + 1;
              state["sampling_step"] = s.step;
              state["sampling_steps"] = s.total;
              state["interrupted"] = job->cancel_requested();
              progress = s.total > 0 ? static_cast<double>(s.step) / s.total : 0.0;
              const double now =
                  std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                      .count();
              const double elapsed = s.started > 0 ? now - s.started : 0.0;
              if (progress > 0) eta = elapsed / progress - elapsed;
              if (want_image) {
                job->want_previews();
                if (std::shared_ptr<const std::vector<uint8_t>> png = job->preview())
                  current_image = base64_encode(*png);
              }
            }
            send_json(res, 200,
                      {{"progress", progress},
                       {"eta_relative", eta},
                       {"state", std::move(state)},
                       {"current_image", std::move(current_image)},
                       {"textinfo", nullptr}});
          }));
}

}  // namespace zimage::serve
