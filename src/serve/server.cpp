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
  auto engine = Engine::load(options);
  if (!engine.ok()) return engine.status().with_context("loading the model");
  owned_engine_ = std::move(engine).value();
  return attach(owned_engine_.get());
}

Status Server::attach(Engine* engine, EngineRunner* runner, bool warm_up) {
  const EngineInfo info = engine->info();
  if (warm_up) {
    GenerateRequest req;
    req.prompts = {"warm-up"};
    const int m = std::max(1, info.size_multiple);
    req.width = req.height = std::min(info.max_side, (64 + m - 1) / m * m);
    req.steps = 1;
    auto r = engine->generate(req);
    if (!r.ok()) return r.status().with_context("warm-up generation");
  }
  ctx_.engine = engine;
  ctx_.info = info;
  ParseLimits& l = ctx_.limits;
  l.request.size_multiple = info.size_multiple;
  l.request.max_side = info.max_side;
  l.request.max_batch = info.max_batch;
  l.default_width = ctx_.options.default_width;
  l.default_height = ctx_.options.default_height;
  l.default_steps = ctx_.options.default_steps;
  if (runner == nullptr && ctx_.options.batching) {
    batch_runner_ = std::make_unique<EngineBatchRunner>(engine);
    ctx_.scheduler.start(std::make_unique<BatchingExecutor>(batch_runner_.get(), &ctx_.metrics,
                                                            ctx_.options.max_batch_images));
  } else {
    if (runner == nullptr) {
      adapter_ = std::make_unique<EngineAdapter>(engine);
      runner = adapter_.get();
    }
    ctx_.scheduler.start(std::make_unique<SerialExecutor>(runner, &ctx_.metrics));
  }
  ctx_.metrics.ready = 1;
  ctx_.ready.store(true);
  return Status::Ok();
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
