// Server lifecycle (see server.h).
#include "serve/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>

#include "serve/http_util.h"
#include "serve/routes.h"

namespace zimage::serve {

namespace {

// cpp-httplib listens with a backlog of 5; a burst of clients then waits on SYN retries. The
// listening socket is protected in httplib::Server, so a subclass widens the backlog.
class HttpServer : public httplib::Server {
 public:
  void widen_backlog() {
    const socket_t fd = svr_sock_;
    if (fd != INVALID_SOCKET) ::listen(fd, SOMAXCONN);
  }
};

}  // namespace

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

Server::Server(ServeOptions options) : ctx_(std::move(options)) {}

Server::~Server() {
  shutdown();
}

Status Server::start() {
  const ServeOptions& o = ctx_.options;
  if (!is_loopback(o.host) && o.api_key.empty() && !o.insecure)
    return InvalidArgument("--host: " + o.host +
                           " is reachable from other machines; set --api-key (or --insecure to "
                           "serve without one)");
  if (o.max_queue < 1) return InvalidArgument("--max-queue: must be at least 1");
  if (o.http_threads < 4) return InvalidArgument("--http-threads: must be at least 4");
  auto http = std::make_unique<HttpServer>();
  const size_t threads = static_cast<size_t>(o.http_threads);
  http->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http->set_payload_max_length(std::max(o.max_body_bytes, o.max_image_body_bytes));
  http->set_read_timeout(o.io_timeout_s, 0);
  http->set_write_timeout(o.io_timeout_s, 0);
  http->set_keep_alive_timeout(std::min(5, o.io_timeout_s));
  http->set_default_headers({{"X-Content-Type-Options", "nosniff"},
                             {"Referrer-Policy", "no-referrer"},
                             {"X-Frame-Options", "DENY"}});
  install_hooks(*http, ctx_);
  add_ops_routes(*http, ctx_);
  add_openai_routes(*http, ctx_);
  add_job_routes(*http, ctx_);
  add_a1111_routes(*http, ctx_);
  if (o.port == 0) {
    port_ = http->bind_to_any_port(o.host);
  } else {
    port_ = http->bind_to_port(o.host, o.port) ? o.port : -1;
  }
  if (port_ <= 0)
    return IoError("cannot listen on " + o.host + ":" + std::to_string(o.port) +
                   " (address in use, or not an address of this machine)");
  http->widen_backlog();
  http_ = std::move(http);
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
  // httplib's stop() does nothing before the accept loop runs; wait for it so an early
  // shutdown() cannot leave the thread listening forever.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!http_->is_running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return Status::Ok();
}

Status Server::load(const EngineOptions& options) {
  return load(options, {options.device});
}

Status Server::load(const EngineOptions& options, const std::vector<std::string>& devices) {
  auto engines = load_engines(options, devices);
  if (!engines.ok()) return engines.status().with_context("loading the model");
  owned_engines_ = std::move(engines).value();
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
  // Sync requests and SSE streams see their job's final state within a wake-up; give them a
  // moment to write it before the sockets close.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (ctx_.waiting_responses.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (http_) http_->stop();
  if (http_thread_.joinable()) http_thread_.join();
}

}  // namespace zimage::serve
