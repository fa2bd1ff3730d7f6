// OpenAI Images API: POST /v1/images/generations (synchronous: the response carries the images
// as base64 or URLs into the job's images) with SGLang / vLLM-Omni's extensions
// (negative_prompt, num_inference_steps, guidance_scale, seed). The work goes through the same
// queue as /v1/jobs, so the queue bound and 429 apply.
#include <chrono>
#include <ctime>

#include "serve/http_util.h"
#include "serve/image_encode.h"
#include "serve/routes.h"

namespace zimage::serve {

void add_openai_routes(httplib::Server& svr, ServeContext& ctx) {
  svr.Post("/v1/images/generations",
           guard([&ctx](const httplib::Request& req, httplib::Response& res) {
             std::shared_ptr<Job> job = generate_and_wait(ctx, parse_openai, req, res);
             if (job == nullptr) return;
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
           }));
}

}  // namespace zimage::serve
