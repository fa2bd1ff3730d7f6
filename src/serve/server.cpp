// Server lifecycle (see server.h).
#include "serve/server.h"

#include <algorithm>
#include <chrono>

#include "serve/http/server.h"
#include "serve/http_util.h"
#include "serve/routes.h"

namespace zimage::serve {

bool is_loopback(const std::string& host) {
  return is_loopback_name(host);
}

Server::Server(ServeOptions options) : ctx_(std::move(options)) {}

Server::~Server() {
  shutdown();
}

Status Server::start() {
  const ServeOptions& o = ctx_.options;
  if (!is_loopback_name(o.host) && o.api_key.empty() && !o.insecure)
    return InvalidArgument("--host: " + o.host +
                           " is reachable from other machines; set --api-key (or --insecure to "
                           "serve without one)");
  if (o.max_queue < 1) return InvalidArgument("--max-queue: must be at least 1");
  if (o.http_threads < 4) return InvalidArgument("--http-threads: must be at least 4");
  http::ServerLimits limits;
  limits.handler_threads = o.http_threads;
  limits.header_timeout_s = o.header_timeout_s;
  limits.idle_timeout_s = o.io_timeout_s;
  limits.body_timeout_s = o.body_timeout_s;
  limits.max_connections = o.max_connections;
  limits.framing.max_headers = o.max_headers;
  limits.framing.max_header_bytes = o.max_header_bytes;
  auto http = std::make_unique<http::Server>(limits);
  http::Headers defaults;
  defaults.add("X-Content-Type-Options", "nosniff");
  defaults.add("Referrer-Policy", "no-referrer");
  defaults.add("X-Frame-Options", "DENY");
  http->set_default_headers(std::move(defaults));
  install_hooks(*http, ctx_);
  RouteTable routes(*http, o);
  add_ops_routes(routes, ctx_);
  add_openai_routes(routes, ctx_);
  add_job_routes(routes, ctx_);
  add_a1111_routes(routes, ctx_);
  Result<int> port = http->start(o.host, o.port);
  if (!port.ok()) return port.status();
  port_ = *port;
  http_ = std::move(http);
  return Status::Ok();
}

Status Server::load(const EngineOptions& options) {
  return load(options, {options.device});
}

Status Server::load(const EngineOptions& options, const std::vector<std::string>& devices) {
  auto engines = load_engines(options, devices);
  if (!engines.ok()) return engines.status().with_context("loading the model");
  owned_engines_ = std::move(engines).value();
  ctx_.controlnet = !options.controlnet.empty();
  std::vector<Engine*> raw;
  for (const auto& e : owned_engines_) raw.push_back(e.get());
  return attach(raw, devices);
}

Status Server::attach(Engine* engine, EngineRunner* runner, bool warm_up) {
  if (runner == nullptr) return attach(std::vector<Engine*>{engine}, {""}, warm_up);
  // A test's runner in front of the engine: one serial worker.
  if (warm_up) ZI_TRY(serve::warm_up(*engine));
  ctx_.engines.push_back(std::make_unique<EngineSlot>(ctx_.scheduler, 0, "", engine));
  set_limits(engine);
  ctx_.scheduler.start(std::make_unique<SerialExecutor>(runner, &ctx_.metrics),
                       ctx_.engines.back().get());
  ctx_.metrics.ready = 1;
  ctx_.ready.store(true);
  return Status::Ok();
}

Status Server::attach(const std::vector<Engine*>& engines, const std::vector<std::string>& devices,
                      bool warm_up) {
  if (engines.empty() || engines.size() != devices.size())
    return InvalidArgument("serve: one device name per engine is needed");
  if (warm_up) {  // every engine at once; the first failure in list order is reported
    std::vector<Status> st(engines.size(), Status::Ok());
    run_each(engines.size(), [&](size_t i) { st[i] = serve::warm_up(*engines[i]); });
    for (size_t i = 0; i < engines.size(); ++i)
      if (!st[i].ok())
        return st[i].with_context("engine " + std::to_string(i) + " on " + devices[i]);
  }
  for (size_t i = 0; i < engines.size(); ++i) {
    auto slot =
        std::make_unique<EngineSlot>(ctx_.scheduler, static_cast<int>(i), devices[i], engines[i]);
    EngineSlot* source = slot.get();
    ctx_.engines.push_back(std::move(slot));
    if (ctx_.options.batching) {
      batch_runners_.push_back(std::make_unique<EngineBatchRunner>(engines[i]));
      ctx_.scheduler.start(
          std::make_unique<BatchingExecutor>(batch_runners_.back().get(), &ctx_.metrics,
                                             ctx_.options.max_batch_images),
          source);
    } else {
      adapters_.push_back(std::make_unique<EngineAdapter>(engines[i]));
      ctx_.scheduler.start(std::make_unique<SerialExecutor>(adapters_.back().get(), &ctx_.metrics),
                           source);
    }
  }
  set_limits(engines[0]);
  ctx_.metrics.ready = 1;
  ctx_.ready.store(true);
  return Status::Ok();
}

void Server::set_limits(Engine* engine) {
  // Every engine loads the same model with the same options: the first one speaks for all.
  const EngineInfo info = engine->info();
  ctx_.engine = engine;
  ctx_.info = info;
  ParseLimits& l = ctx_.limits;
  l.request.size_multiple = info.size_multiple;
  l.request.max_side = info.max_side;
  l.request.max_batch = info.max_batch;
  l.default_width = ctx_.options.default_width;
  l.default_height = ctx_.options.default_height;
  l.default_steps = ctx_.options.default_steps;
}

void Server::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  ctx_.stopping.store(true);
  ctx_.metrics.ready = 0;
  ctx_.scheduler.shutdown("server shutting down");
  // Sync requests and SSE streams see their job's final state within a wake-up; they get the
  // grace time to write it, then every connection closes (a client dripping bytes included).
  const auto grace =
      std::chrono::milliseconds(static_cast<int64_t>(ctx_.options.shutdown_grace_s * 1000));
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (ctx_.waiting_responses.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (http_) http_->stop(std::max(std::chrono::milliseconds(0), left));
}

}  // namespace zimage::serve
