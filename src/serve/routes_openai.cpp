// OpenAI Images API: POST /v1/images/generations (synchronous: the response carries the images
// as base64 or URLs into the job's images) with SGLang / vLLM-Omni's extensions
// (negative_prompt, num_inference_steps, guidance_scale, seed), and POST /v1/images/edits
// (multipart/form-data with the image and an optional mask: image-to-image and inpainting, plus
// "strength"). The work goes through the same queue as /v1/jobs, so the queue bound and 429
// apply.
#include <chrono>
#include <ctime>

#include "serve/http_util.h"
#include "serve/image_encode.h"
#include "serve/routes.h"

namespace zimage::serve {

namespace {

// The images response both endpoints send.
void send_images(const std::shared_ptr<Job>& job, const http::Request& req, http::Response& res) {
  const JobSnapshot s = job->snapshot();
  const JobSpec& spec = job->spec();
  const std::string base = base_url(req);
  nlohmann::json data = nlohmann::json::array();
  for (size_t k = 0; k < s.image_count; ++k) {
    nlohmann::json item;
    if (spec.response_format == ResponseFormat::kUrl)
      item["url"] = base + image_path(job->id(), k);
    else
      item["b64_json"] = base64_encode(job->image(k));
    item["seed"] = s.image_seeds[k];
    data.push_back(std::move(item));
  }
  nlohmann::json body = {{"created", static_cast<int64_t>(std::time(nullptr))},
                         {"id", job->id()},
                         {"data", std::move(data)},
                         {"seed", spec.runs.front().seed},
                         {"output_format", format_name(spec.output_format)},
                         {"parameters", job_parameters(spec)}};
  send_json(res, 200, body);
}

}  // namespace

void add_openai_routes(RouteTable& svr, ServeContext& ctx) {
  svr.post("/v1/images/generations", guard([&ctx](const http::Request& req, http::Response& res) {
             std::shared_ptr<Job> job = generate_and_wait(ctx, parse_openai, req, res);
             if (job != nullptr) send_images(job, req, res);
           }));

  svr.post("/v1/images/edits", guard([&ctx](const http::Request& req, http::Response& res) {
             if (!req.is_multipart_form_data()) {
               ++ctx.metrics.rejected_invalid;
               send_error(res, ApiError{400, "invalid_request_error",
                                        "body: /v1/images/edits takes multipart/form-data "
                                        "(image, mask, prompt, ...)",
                                        "body"});
               return;
             }
             std::vector<FormPart> form;
             for (const auto& [name, part] : req.files)
               form.push_back({name, part.filename, part.content});
             std::shared_ptr<Job> job = generate_and_wait(
                 ctx,
                 [&form](const ParseLimits& limits, uint64_t seed) {
                   return parse_openai_edit(form, limits, seed);
                 },
                 res);
             if (job != nullptr) send_images(job, req, res);
           }));
}

}  // namespace zimage::serve
