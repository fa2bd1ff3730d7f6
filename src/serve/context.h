// What the HTTP routes share: the options, the loaded engines (once ready), the job table, the
// scheduler and the metrics. Why one struct: routes are free functions in routes_*.cpp; they get
// everything through this, so adding an endpoint touches one file.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "serve/device_pool.h"
#include "serve/job_table.h"
#include "serve/metrics.h"
#include "serve/request_parse.h"
#include "serve/scheduler.h"
#include "zimage/zimage.h"

namespace zimage::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8188;        // 0 = any free port
  std::string api_key;    // non-empty: every route but /healthz (and the static page) needs it
  bool insecure = false;  // allow a non-loopback host without --api-key
  size_t max_queue = 16;  // queued jobs (the running one not counted)
  size_t max_body_bytes = size_t{1} << 20;
  // Bodies of the image routes (/v1/images/edits, /sdapi/v1/img2img): an image, and a mask.
  size_t max_image_body_bytes = size_t{32} << 20;
  int http_threads = 64;  // connections served at once (SSE streams hold one each)
  // The transport's bounds (http/server.h, docs/SERVER.md "Limits").
  int io_timeout_s = 10;          // --idle-timeout: longest silence while a body is read or written
  int header_timeout_s = 10;      // --header-timeout: the whole request head
  int body_timeout_s = 120;       // --body-timeout: the whole body, and one response write
  size_t max_connections = 1024;  // --max-connections: open connections
  size_t max_headers = 100;       // header fields of one request (431 past it)
  size_t max_header_bytes = size_t{32} << 10;  // request line and headers (431 past it)
  double shutdown_grace_s = 5;  // --shutdown-grace: waiting responses' time to finish at shutdown
  std::string model_name = "z-image-turbo";
  int default_width = 1024;
  int default_height = 1024;
  int default_steps = 8;
  RetentionLimits retention;
  bool access_log = true;  // one JSON line per request on stderr
  // Continuous batching: jobs of one size share each DiT step (BatchingExecutor), at most this
  // many images per step. Off (the default): one job at a time (SerialExecutor), each image
  // exactly as `zimage generate` makes it whatever runs beside it. Measured on an H200 at 512²
  // and 1024², one image already fills the GPU and batching bought no throughput (SERVER.md).
  bool batching = false;
  int max_batch_images = 8;
  // Per-request LoRAs: requests name files inside this folder ("loras" field, A1111's <lora:..>
  // tags; serve/lora_request.h). Empty: requests naming LoRAs are refused.
  std::string lora_dir;
};

struct ServeContext {
  explicit ServeContext(ServeOptions o)
      : options(std::move(o)), jobs(options.retention), scheduler(options.max_queue, &metrics) {}

  ServeOptions options;
  Metrics metrics;
  JobTable jobs;
  Scheduler scheduler;
  std::atomic<bool> ready{false};     // the engine is loaded and warmed up
  std::atomic<bool> stopping{false};  // shutting down: no new jobs
  Engine* engine = nullptr;           // set before `ready` turns true (the first engine)
  EngineInfo info;                    // ditto
  ParseLimits limits;                 // ditto
  EngineSlots engines;                // ditto: every engine and what it did (device_pool.h)
  bool controlnet = false;            // the engines were loaded with a ControlNet
  // Responses still waiting on a job (sync generations, SSE streams): shutdown lets them send
  // their final word before the HTTP server stops.
  std::atomic<int> waiting_responses{0};
};

// Counts one waiting response for its lifetime.
class WaitingResponse {
 public:
  explicit WaitingResponse(ServeContext& ctx) : ctx_(ctx) { ++ctx_.waiting_responses; }
  ~WaitingResponse() { --ctx_.waiting_responses; }
  WaitingResponse(const WaitingResponse&) = delete;
  WaitingResponse& operator=(const WaitingResponse&) = delete;

 private:
  ServeContext& ctx_;
};

}  // namespace zimage::serve
