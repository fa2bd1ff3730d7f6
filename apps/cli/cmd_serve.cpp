// `zimage serve`: the HTTP image server (src/serve/). Why this file is thin: everything but flag
// parsing, signals and exit codes lives in the zimage_serve library, which the tests drive
// in-process. Signals: SIGINT and SIGTERM wake the main thread (self-pipe), which stops the
// server; queued and running jobs end "cancelled" with the reason "server shutting down", and
// the process exits 0.
//
//   zimage serve --model DIR | --dit F --text-encoder F --vae F [--host 127.0.0.1] [--port 8188]
//   [--api-key KEY | --api-key-file FILE] [--max-queue N]
//                [--device auto | --devices cuda:0,cuda:1,... | --devices all]
//                [--precision auto] [--threads N]
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "builtin/builtin_model.h"
#include "commands.h"
#include "lora_args.h"
#include "model_flags.h"
#include "secret_file.h"
#include "serve/server.h"
#include "zimage/zimage.h"

namespace zimage::cli {

namespace {

struct ServeArgs {
  serve::ServeOptions serve;
  EngineFlags engine;
  std::string devices;  // --devices: one engine per entry (data parallel)
  std::string default_size = "1024x1024";
  bool quiet = false;
  bool verbose = false;
  std::string batching = "off";
  std::string lora_method = "auto";
  int lora_cache_mib = 2048;
  std::string controlnet;  // loaded with the model; requests send a control image
  std::string api_key_file;
};

[[noreturn]] void fail(int code, const std::string& message) {
  std::fprintf(stderr, "zimage serve: %s\n", message.c_str());
  throw CLI::RuntimeError(code);
}

// SIGINT/SIGTERM, through a self-pipe: the handler only writes the signal number (async-signal
// safe), whichever thread the kernel picked (the engine's BLAS threads exist before main, so
// blocking the signals in our threads is not enough).
int g_signal_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const ssize_t n = ::write(g_signal_pipe[1], &b, 1);
  (void)n;
}

class SignalWaiter {
 public:
  SignalWaiter() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) fail(1, "pipe2 failed");
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalWaiter() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
  }
  // Blocks until a signal arrives; returns it.
  int wait() {
    unsigned char b = 0;
    for (;;) {
      const ssize_t n = ::read(g_signal_pipe[0], &b, 1);
      if (n == 1) return b;
      if (n < 0 && errno != EINTR) return SIGTERM;
    }
  }
  // True when a signal is already waiting (does not consume it).
  bool pending() {
    pollfd p{g_signal_pipe[0], POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

void run_serve(ServeArgs& a) {
  apply_log_flags(a.verbose, a.quiet);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the server
  if (!a.api_key_file.empty()) {  // not in `ps`, unlike --api-key (excluded by CLI11)
    auto key = read_secret_file("--api-key-file", a.api_key_file);
    if (!key.ok()) fail(2, key.status().message());
    a.serve.api_key = std::move(key).value();
  }
  if (a.serve.api_key.empty()) {
    if (const char* k = std::getenv("ZIMAGE_API_KEY"); k != nullptr) a.serve.api_key = k;
  }
  const size_t x = a.default_size.find('x');
  try {
    if (x == std::string::npos) throw std::invalid_argument("size");
    a.serve.default_width = std::stoi(a.default_size.substr(0, x));
    a.serve.default_height = std::stoi(a.default_size.substr(x + 1));
  } catch (const std::exception&) {
    fail(2, "--default-size: expected WIDTHxHEIGHT, e.g. 1024x1024");
  }
  std::vector<LoraSpec> loras;  // checked before the server listens: a usage error exits 2
  std::string lora_error;
  if (!parse_lora_args(a.engine.lora, &loras, &lora_error)) fail(2, lora_error);
  a.serve.access_log = !a.quiet;
  a.serve.batching = a.batching == "on";
  if (!a.serve.lora_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(a.serve.lora_dir, ec))
      fail(2, "--lora-dir: '" + a.serve.lora_dir + "' is not a folder");
  }

  SignalWaiter signals;
  serve::Server server(a.serve);
  Status st = server.start();
  if (!st.ok()) fail(st.code() == ErrorCode::kInvalidArgument ? 2 : 1, st.message());
  std::printf("zimage serve: listening on http://%s:%d\n", a.serve.host.c_str(), server.port());
  std::fflush(stdout);

  EngineOptions eo = engine_options(a.engine);  // no --vae-tiling: "auto"
  // Without --model or files, the tiny built-in model: a server to try the API and the page.
  auto choice = apply_model_flags(a.engine.model, eo);
  if (!choice.ok()) {
    server.shutdown();  // a model that cannot be had fails the server (exit 1), as a load does
    fail(1, choice.status().to_string());
  }
  eo.loras = loras;
  eo.controlnet = a.controlnet;
  eo.lora_method = a.lora_method;
  eo.lora_cache_bytes = static_cast<uint64_t>(a.lora_cache_mib) << 20;
  std::vector<std::string> devices = {eo.device};
  if (!a.devices.empty()) {
    auto list = parse_device_list(a.devices);
    if (!list.ok()) {
      server.shutdown();
      fail(list.status().code() == ErrorCode::kInvalidArgument ? 2 : 1,
           "--devices: " + list.status().message());
    }
    devices = std::move(list).value();
    for (const std::string& note : serve::shared_device_notes(devices))
      std::printf("zimage serve: %s\n", note.c_str());
    std::printf("zimage serve: loading %zu engines\n", devices.size());
    std::fflush(stdout);
  }
  st = server.load(eo, devices);
  if (!st.ok()) {
    server.shutdown();
    fail(st.code() == ErrorCode::kInvalidArgument ? 2 : 1, st.to_string());
  }
  if (!signals.pending()) {
    const serve::EngineSlots& engines = server.context().engines;
    if (engines.size() > 1)
      for (const auto& e : engines)
        std::printf("zimage serve: engine %d on %s: %s\n", e->index(), e->device().c_str(),
                    e->info().device.c_str());
    std::printf("zimage serve: ready (%s%s)\n",
                engines.size() > 1 ? (std::to_string(engines.size()) + " engines, ").c_str() : "",
                server.context().info.device.c_str());
    std::fflush(stdout);
  }
  const int sig = signals.wait();
  std::fprintf(stderr, "zimage serve: %s received; cancelling jobs and stopping\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM");
  server.shutdown();
  std::printf("zimage serve: stopped\n");
  std::fflush(stdout);
}

}  // namespace

void register_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "HTTP image server: OpenAI Images API, async jobs with progress events, Automatic1111 "
      "txt2img, Prometheus metrics and a web page at /. See docs/SERVER.md.");
  add_model_flags(cmd, a->engine.model,
                  "Model folder in the diffusers layout (default: the tiny built-in model, whose "
                  "pictures are noise)");
  cmd->add_option("--host", a->serve.host,
                  "Address to listen on (default 127.0.0.1; others need --api-key or --insecure)");
  cmd->add_option("--port", a->serve.port, "TCP port (default 8188; 0 = any free port)")
      ->check(CLI::Range(0, 65535));
  CLI::Option* api_key =
      cmd->add_option("--api-key", a->serve.api_key,
                      "Require 'Authorization: Bearer KEY' on every route but /healthz (or set "
                      "ZIMAGE_API_KEY; KEY shows in `ps`: prefer --api-key-file)");
  cmd->add_option("--api-key-file", a->api_key_file,
                  "As --api-key, the key read from this file (one line; a trailing newline is "
                  "dropped)")
      ->excludes(api_key);
  cmd->add_flag("--insecure", a->serve.insecure, "Allow a non-loopback --host without an API key");
  cmd->add_option("--max-queue", a->serve.max_queue,
                  "Jobs waiting at most; more get 429 (default 16)")
      ->check(CLI::Range(1, 100000));
  add_engine_flags(cmd, a->engine, {EngineFlag::kDevice});
  cmd->add_option("--devices", a->devices,
                  "Data parallel: one engine per listed device behind the one queue, e.g. "
                  "cuda:0,cuda:1 or all (every visible GPU); a device may repeat (engines "
                  "sharing a GPU); see docs/SERVER.md")
      ->excludes(cmd->get_option("--device"));
  add_engine_flags(
      cmd, a->engine,
      {EngineFlag::kPrecision,
       {EngineFlag::kFp8Layers,
        "With --precision fp8: the DiT linears in FP8 (default all; see generate)"},
       {EngineFlag::kVramBudget,
        "GPU memory the process may use, in GiB, CUDA context included (0 = no limit)"},
       EngineFlag::kHostMemory,
       EngineFlag::kStreamedWeights,
       {EngineFlag::kWeights, "bf16, or fp8 (FP8 weight rows; see zimage generate)"},
       EngineFlag::kThreads});
  cmd->add_option("--default-size", a->default_size,
                  "Image size when a request gives none (default 1024x1024)");
  cmd->add_option("--default-steps", a->serve.default_steps, "Steps when a request gives none")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--max-body", a->serve.max_body_bytes,
                  "Largest request body in bytes; larger get 413 (default 1 MiB)")
      ->check(CLI::Range(1024, 1 << 30));
  cmd->add_option("--max-image-body", a->serve.max_image_body_bytes,
                  "Largest body of /v1/images/edits and /sdapi/v1/img2img (an image and a mask) "
                  "in bytes (default 32 MiB)")
      ->check(CLI::Range(1024, 1 << 30));
  cmd->add_option("--http-threads", a->serve.http_threads,
                  "Requests handled at once (default 64; an open event stream or waiting "
                  "generation holds one)")
      ->check(CLI::Range(4, 4096));
  cmd->add_option("--max-connections", a->serve.max_connections,
                  "Open connections (default 1024); past it the oldest one still sending its "
                  "request head is closed")
      ->check(CLI::Range(8, 1 << 20));
  cmd->add_option("--header-timeout", a->serve.header_timeout_s,
                  "Seconds for a whole request head to arrive (default 10)")
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--idle-timeout", a->serve.io_timeout_s,
                  "Longest silence in seconds while a body is read or a response written "
                  "(default 10)")
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--body-timeout", a->serve.body_timeout_s,
                  "Seconds for a whole request body, and for one response write (default 120)")
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--shutdown-grace", a->serve.shutdown_grace_s,
                  "Seconds waiting responses get to finish at SIGTERM before every connection "
                  "closes (default 5)")
      ->check(CLI::Range(0.0, 600.0));
  cmd->add_option("--model-name", a->serve.model_name,
                  "Model id in /v1/models (default z-image-turbo)");
  cmd->add_option("--batching", a->batching,
                  "on: jobs of one size share each denoising step (continuous batching; an image "
                  "may differ slightly from the same request served alone); off: one job at a "
                  "time, every image exactly as zimage generate makes it (default off: on an "
                  "H200 one 512² or 1024² image already fills the GPU)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--max-batch-images", a->serve.max_batch_images,
                  "Images per denoising step with --batching on (default 8)")
      ->check(CLI::Range(1, 64));
  add_lora_options(cmd, a->engine.lora);
  cmd->add_option("--lora-dir", a->serve.lora_dir,
                  "Folder of LoRA files requests may name (\"loras\": [{\"name\": "
                  "\"x.safetensors\", \"scale\": 0.8}], A1111's <lora:x:0.8>); applied per "
                  "request without reloading the model; GET /v1/loras lists them");
  cmd->add_option("--lora-method", a->lora_method,
                  "Per-request LoRAs: auto (merge into resident weights, side GEMMs for FP8 / "
                  "streamed ones), merge, or side (low-rank side GEMMs) (default auto)")
      ->check(CLI::IsMember({"auto", "merge", "side"}));
  cmd->add_option("--lora-cache", a->lora_cache_mib,
                  "MiB of parsed LoRA files kept in host memory between requests (default 2048)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--controlnet", a->controlnet,
                  "Z-Image ControlNet (folder or single file) loaded with the model; requests "
                  "send the control image (A1111 alwayson_scripts.controlnet, /v1/images/edits "
                  "control_image)");
  cmd->add_flag("--quiet,-q", a->quiet, "No access log; errors only");
  cmd->add_flag("--verbose,-v", a->verbose, "Engine load information and per-phase times");
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace zimage::cli
