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
#include "broker_flags.h"
#include "commands.h"
#include "lora_args.h"
#include "model_flags.h"
#include "zimage/zimage.h"

namespace zimage::cli {

namespace {

constexpr int kTinyDefaultSide = 64;  // the built-in model's default size, as `generate`

struct WorkerArgs {
  BrokerFlags broker;
  EngineFlags engine;
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
  apply_log_flags(a.verbose, a.quiet);
  auto url = broker_url(a.broker);
  if (!url.ok())
    fail(url.status().code() == ErrorCode::kInvalidArgument ? 2 : 1, url.status().message());
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
  EngineOptions eo = engine_options(a.engine);
  auto choice = apply_model_flags(a.engine.model, eo);
  if (!choice.ok())
    fail(choice.status().code() == ErrorCode::kInvalidArgument ? 2 : 1, choice.status().message());
  std::string lora_error;
  if (!parse_lora_args(a.engine.lora, &eo.loras, &lora_error)) fail(2, lora_error);
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
  add_broker_flags(cmd, args->broker);
  add_model_flags(cmd, args->engine.model,
                  "Model folder in the diffusers layout (default: the tiny built-in model)");
  add_engine_flags(cmd, args->engine,
                   {EngineFlag::kDevice, EngineFlag::kPrecision, EngineFlag::kFp8Layers,
                    EngineFlag::kWeights, EngineFlag::kVaeTiling, EngineFlag::kVramBudget,
                    EngineFlag::kHostMemory, EngineFlag::kStreamedWeights, EngineFlag::kThreads});
  add_lora_options(cmd, args->engine.lora);
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
