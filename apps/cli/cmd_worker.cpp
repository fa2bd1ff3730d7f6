// `zimage worker`: a stateless GPU worker fed by a Redis stream (src/broker/worker.h,
// docs/BROKER.md). One Engine is loaded once; jobs come from the consumer group, results go back
// to Redis. Any number of workers on any number of hosts may share one stream.
//
//   zimage worker --broker redis://127.0.0.1:6379 --model DIR [--device cuda:0]
//                 [--stream zimage:jobs] [--group zimage] [--consumer NAME]
//                 [--claim-idle-ms 30000] [--max-deliveries 3]
// Signals: the first SIGTERM / SIGINT finishes, stores and acknowledges the current job, then
// exits 0; a second one exits at once (143 / 130): the job stays pending and another worker
// claims it after --claim-idle-ms. Exit codes: 0 stopped, 1 failure, 2 usage.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "broker/redis_client.h"
#include "broker/worker.h"
#include "commands.h"
#include "lora_args.h"
#include "model_flags.h"
#include "number_flags.h"
#include "secret_file.h"
#include "zimage/zimage.h"

namespace zimage::cli {

namespace {

constexpr int kTinyDefaultSide = 64;  // the built-in model's default size, as `generate`

struct WorkerArgs {
  std::string broker = "redis://127.0.0.1:6379";
  std::string broker_password_file;
  ModelFlags model;
  std::string device = "auto";
  std::string precision = "auto";
  std::string fp8_layers = "all";
  std::string weights = "bf16";
  std::string vae_tiling = "auto";
  double vram_budget = 0;
  int threads = 0;
  LoraArgs lora;
  broker::WorkerOptions worker;
  bool verbose = false;
  bool quiet = false;
};

std::atomic<bool> g_stop{false};
extern "C" void on_worker_signal(int sig) {
  if (g_stop.exchange(true)) ::_exit(128 + sig);  // a second signal: leave now
}

[[noreturn]] void fail(int code, const std::string& message) {
  std::fprintf(stderr, "zimage worker: %s\n", message.c_str());
  throw CLI::RuntimeError(code);
}

void run_worker_command(WorkerArgs& a) {
  set_log_verbosity(a.verbose ? 2 : a.quiet ? 0 : 1);
  if (!broker::have_hiredis())
    fail(1,
         "zimage was built without hiredis: the broker commands need it (install "
         "libhiredis-dev, e.g. with scripts/setup.sh, and configure again)");
  auto url = broker::parse_redis_url(a.broker);
  if (!url.ok()) fail(2, "--broker: " + url.status().message());
  if (const Status pw = apply_broker_password_file(a.broker_password_file, &*url); !pw.ok())
    fail(2, pw.message());
  broker::WorkerOptions& wo = a.worker;
  wo.url = *url;
  const Status opt = broker::finish_options(&wo);
  if (!opt.ok()) fail(2, opt.message());

  {  // reach the broker before the (long) model load: a wrong URL or password fails at once
    broker::ClientOptions co;
    co.reconnect_attempts = 3;
    auto probe = broker::RedisClient::connect(wo.url, co);
    if (!probe.ok()) fail(1, "cannot reach the broker: " + probe.status().message());
  }
  EngineOptions eo;
  auto choice = apply_model_flags(a.model, eo);
  if (!choice.ok())
    fail(choice.status().code() == ErrorCode::kInvalidArgument ? 2 : 1, choice.status().message());
  eo.device = a.device;
  eo.precision = a.precision;
  eo.fp8_layers = a.fp8_layers;
  eo.weights = a.weights;
  eo.vae_tiling = a.vae_tiling;
  eo.vram_budget_gib = a.vram_budget;
  eo.threads = a.threads;
  std::string lora_error;
  if (!parse_lora_args(a.lora, &eo.loras, &lora_error)) fail(2, lora_error);
  eo.lora_lenient = a.lora.lenient;
  auto engine = Engine::load(eo);
  if (!engine.ok()) {
    const bool usage = engine.status().code() == ErrorCode::kInvalidArgument;
    fail(usage ? 2 : 1, usage ? engine.status().message()
                              : "cannot load the model: " + engine.status().to_string());
  }
  const EngineInfo info = (*engine)->info();
  serve::ParseLimits& l = wo.limits;  // as `zimage serve` sets them
  l.request.size_multiple = info.size_multiple;
  l.request.max_side = info.max_side;
  l.request.max_batch = info.max_batch;
  if (choice->builtin) l.default_width = l.default_height = kTinyDefaultSide;

  g_stop.store(false);
  auto prev_term = std::signal(SIGTERM, on_worker_signal);
  auto prev_int = std::signal(SIGINT, on_worker_signal);
  broker::WorkerStats stats;
  const Status st = broker::run_worker(**engine, wo, g_stop, &stats);
  std::signal(SIGTERM, prev_term == SIG_ERR ? SIG_DFL : prev_term);
  std::signal(SIGINT, prev_int == SIG_ERR ? SIG_DFL : prev_int);
  if (!st.ok()) fail(1, st.to_string());
  if (!a.quiet)
    std::fprintf(stderr, "zimage worker: %lld job(s), %lld failed, %lld duplicate(s)\n",
                 static_cast<long long>(stats.jobs), static_cast<long long>(stats.failed),
                 static_cast<long long>(stats.duplicates));
}

}  // namespace

void register_worker_command(CLI::App& app) {
  auto args = std::make_shared<WorkerArgs>();
  CLI::App* cmd = app.add_subcommand(
      "worker",
      "Run jobs from a Redis stream (consumer group), store results back in Redis; see "
      "docs/BROKER.md. Start one per GPU, on as many hosts as you like.");
  cmd->add_option("--broker", args->broker,
                  "Redis URL redis://[[user]:password@]host[:port][/db] (default "
                  "redis://127.0.0.1:6379; a password in it shows in `ps`: prefer "
                  "--broker-password-file)");
  cmd->add_option("--broker-password-file", args->broker_password_file,
                  "The Redis password, read from this file (one line; a trailing newline is "
                  "dropped) instead of the --broker URL");
  cmd->add_option("--model,-m", args->model.model,
                  "Model folder in the diffusers layout (default: the tiny built-in model)");
  add_single_file_flags(cmd, args->model);
  cmd->add_option("--device,-d", args->device, "cpu, cuda, cuda:N or auto (default auto)");
  cmd->add_option("--precision", args->precision, "auto, bf16, f32 or fp8 (default auto)");
  cmd->add_option("--fp8-layers", args->fp8_layers,
                  "With --precision fp8: the DiT linears in FP8 (default all)");
  cmd->add_option("--weights", args->weights, "bf16 or fp8 weight storage (default bf16)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_option("--vae-tiling", args->vae_tiling, "auto, on or off (default auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--vram-budget", args->vram_budget, "GPU memory budget in GiB (0 = no limit)")
      ->check(CLI::Range(0.0, 1e6))
      ->check(finite_number(false));
  cmd->add_option("--threads,-t", args->threads, "CPU threads (default 0 = all)");
  add_lora_options(cmd, args->lora);
  broker::WorkerOptions& w = args->worker;
  cmd->add_option("--stream", w.stream, "Jobs stream key (default zimage:jobs)");
  cmd->add_option("--group", w.group, "Consumer group (default zimage)");
  cmd->add_option("--consumer", w.consumer,
                  "This worker's consumer name, unique per worker (default host:pid)");
  cmd->add_option("--prefix", w.prefix,
                  "Key prefix of results, progress and notifications (default zimage)");
  cmd->add_option("--claim-idle-ms", w.claim_idle_ms,
                  "Claim jobs pending this long with another (dead) worker (default 30000)");
  cmd->add_option("--max-deliveries", w.max_deliveries,
                  "A job delivered more often than this gets an error result instead of a "
                  "run (default 3)");
  cmd->add_option("--heartbeat-ms", w.heartbeat_ms,
                  "Re-claim the running job this often (default claim-idle-ms / 3)");
  cmd->add_option("--block-ms", w.block_ms, "XREADGROUP BLOCK time (default 1000)");
  cmd->add_option("--result-ttl", w.result_ttl_s, "Seconds results are kept (default 86400)");
  cmd->add_option("--max-jobs", w.max_jobs, "Exit after this many jobs (default 0 = never)");
  cmd->add_flag("--verbose,-v", args->verbose, "Print load information");
  cmd->add_flag("--quiet,-q", args->quiet, "Print nothing but errors and job lines");
  cmd->callback([args] { run_worker_command(*args); });
}

}  // namespace zimage::cli
