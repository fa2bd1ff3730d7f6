// The HTTP endpoints, one file per API family: routes_openai.cpp (OpenAI Images), routes_jobs.cpp
// (async jobs + Server-Sent Events), routes_a1111.cpp (Automatic1111), routes_ops.cpp (health,
// readiness, metrics, models, the web page). Each add_* registers its routes on `svr`.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/context.h"
#include "serve/http/message.h"

namespace zimage::serve {

class RouteTable;  // http_util.h

void add_openai_routes(RouteTable& svr, ServeContext& ctx);
void add_job_routes(RouteTable& svr, ServeContext& ctx);
void add_a1111_routes(RouteTable& svr, ServeContext& ctx);
void add_ops_routes(RouteTable& svr, ServeContext& ctx);

// The job's public state (GET /v1/jobs/{id}); image URLs start with `base` ("" = relative).
nlohmann::json job_json(ServeContext& ctx, const Job& job, const std::string& base);
// The parameters a job runs with, in OpenAI names.
nlohmann::json job_parameters(const JobSpec& spec);
// URL path of image k of a job.
std::string image_path(const std::string& job_id, size_t k);

}  // namespace zimage::serve
