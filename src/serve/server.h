// `zimage serve` as a library: binds the HTTP server, loads (or adopts) an engine, warms it up,
// runs the worker, and shuts everything down in order. Why a class apart from the CLI: the tests
// run the same server in-process on a loopback port with a shared engine, and the CLI file stays
// flag parsing and signal handling only.
//
// Order: start() binds and answers at once (/healthz 200, /readyz 503), load()/attach() makes it
// ready (one engine, or one per device with --devices: device_pool.h), shutdown() stops taking
// jobs, cancels queued and running ones ("server shutting down"), lets waiting responses finish,
// then stops HTTP.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "serve/batching_executor.h"
#include "serve/context.h"
#include "serve/executor.h"
#include "zimage/zimage.h"

namespace zimage::serve::http {
class Server;
}

namespace zimage::serve {

class Server {
 public:
  explicit Server(ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Checks the options (a non-loopback host needs an API key or `insecure`), binds host:port
  // (port 0: any free port) and serves on a background thread.
  Status start();
  int port() const { return port_; }

  // Loads the model, warms it up (one tiny generate) and starts the worker.
  Status load(const EngineOptions& options);
  // Data parallel: one engine per entry of `devices` (parse_device_list), loaded and warmed up
  // at once, each with its own worker on the one queue. A device whose engine fails to load
  // fails the whole server (the error names the device).
  Status load(const EngineOptions& options, const std::vector<std::string>& devices);
  // The same with an engine the caller owns (tests); `runner` (optional) stands between the
  // worker and the engine.
  Status attach(Engine* engine, EngineRunner* runner = nullptr, bool warm_up = true);
  // The same with several engines the caller owns (`devices[i]` names engine i's device).
  Status attach(const std::vector<Engine*>& engines, const std::vector<std::string>& devices,
                bool warm_up = true);

  // Idempotent; see the file comment.
  void shutdown();
  ServeContext& context() { return ctx_; }

 private:
  void set_limits(Engine* engine);

  ServeContext ctx_;
  std::unique_ptr<http::Server> http_;
  int port_ = -1;
  std::vector<std::unique_ptr<Engine>> owned_engines_;
  std::vector<std::unique_ptr<EngineRunner>> adapters_;
  std::vector<std::unique_ptr<BatchRunner>> batch_runners_;
  bool shut_down_ = false;
};

}  // namespace zimage::serve
