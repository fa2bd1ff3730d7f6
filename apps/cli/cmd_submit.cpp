// `zimage submit`: adds one job to the workers' Redis stream and prints its id; with --wait,
// follows the worker's progress and writes the image(s). The wire format is docs/BROKER.md's;
// any Redis client in any language can do the same.
//
//   zimage submit --broker redis://127.0.0.1:6379 --prompt TEXT [--seed S] [--width W]
//                 [--height H] [--steps N] [--guidance G] [--wait [--output F.png]]
// Exit codes: 0 submitted (or, with --wait, done and written), 1 failure (the job's error, the
// broker, the timeout), 2 usage.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "broker/job_codec.h"
#include "broker/redis_client.h"
#include "broker_flags.h"
#include "commands.h"
#include "number_flags.h"
#include "output_paths.h"
#include "progress.h"
#include "zimage/request_check.h"
#include "zimage/zimage.h"

namespace zimage::cli {

namespace {

struct SubmitArgs {
  BrokerFlags broker;
  std::string stream = "zimage:jobs";
  std::string group = "zimage";
  std::string prefix = "zimage";
  std::string prompt;
  std::string negative_prompt;
  int width = 1024;
  int height = 1024;
  int steps = 8;
  float guidance = 0.0f;
  int64_t seed = -1;
  int images_per_prompt = 1;
  bool wait = false;
  double timeout_s = 0;
  std::string output = "zimage.png";
  bool quiet = false;
  bool progress = false;
};

[[noreturn]] void fail(int code, const std::string& message) {
  std::fprintf(stderr, "zimage submit: %s\n", message.c_str());
  throw CLI::RuntimeError(code);
}

template <typename T>
T must(Result<T> r, const std::string& what) {
  if (!r.ok()) fail(1, what + ": " + r.status().message());
  return std::move(r).value();
}

// How long `--wait` without --timeout keeps reconnecting through one unbroken outage.
constexpr double kMaxOutageS = 120;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A Redis command for --wait that outlives a broker restart: a lost connection (kIo) is retried,
// reconnecting with backoff, while --timeout allows (without one, for kMaxOutageS of unbroken
// outage); the job is the worker's meanwhile. Other failures come back at once.
Result<broker::Reply> call_retrying(broker::RedisClient& db, const SubmitArgs& a,
                                    std::chrono::steady_clock::time_point start,
                                    const std::vector<std::string>& cmd) {
  double backoff = 0.1;
  std::optional<std::chrono::steady_clock::time_point> outage;
  for (;;) {
    auto r = db.command(cmd);
    if (r.ok() || r.status().code() != ErrorCode::kIo) {
      if (outage && !a.quiet) std::fprintf(stderr, "zimage submit: reconnected to the broker\n");
      return r;
    }
    if (!outage) {
      outage = std::chrono::steady_clock::now();
      if (!a.quiet)
        std::fprintf(stderr, "zimage submit: %s; reconnecting (the job stays queued)\n",
                     r.status().message().c_str());
    }
    const bool past_timeout = a.timeout_s > 0 && seconds_since(start) > a.timeout_s;
    if (past_timeout || (a.timeout_s == 0 && seconds_since(*outage) > kMaxOutageS))
      return r.status().with_context("the broker stayed unreachable for " +
                                     std::to_string(static_cast<int>(seconds_since(*outage))) +
                                     " s" + (past_timeout ? " (--timeout)" : ""));
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, 2.0);
  }
}

bool wrong_type(const Status& st) {
  return st.message().find("WRONGTYPE") != std::string::npos;
}

// The newest entry id of the notification stream ("0-0" when empty), read before the job is
// added, so no notification can be missed. Empty when the key holds something else than a
// stream: --wait then polls the result key.
std::string last_notification(broker::RedisClient& db, const std::string& stream, bool quiet) {
  auto got = db.command({"XREVRANGE", stream, "+", "-", "COUNT", "1"});
  if (!got.ok() && wrong_type(got.status())) {
    if (!quiet)
      std::fprintf(stderr,
                   "zimage submit: %s is not a stream (%s); waiting by polling the result\n",
                   stream.c_str(), got.status().message().c_str());
    return "";
  }
  auto r = must(std::move(got), "XREVRANGE");
  auto entries = must(broker::as_array(r, 0, "XREVRANGE"), "XREVRANGE");
  if (entries->empty()) return "0-0";
  auto entry = must(broker::as_array((*entries)[0], 1, "XREVRANGE entry"), "XREVRANGE");
  return must(broker::as_string((*entry)[0], "XREVRANGE id"), "XREVRANGE");
}

// Blocks until the job's notification arrives or its result exists; shows progress meanwhile.
// `last` empty: no notification stream to read; the result key is polled.
void wait_for(broker::RedisClient& db, const SubmitArgs& a, const std::string& id,
              std::string last) {
  ProgressBar bar(!a.quiet && (a.progress || is_terminal(stderr)), stderr);
  const auto start = std::chrono::steady_clock::now();
  const std::string rkey = broker::result_key(a.prefix, id);
  const std::string pkey = broker::progress_key(a.prefix, id);
  const std::string notify = broker::results_stream(a.prefix);
  auto call = [&](const std::vector<std::string>& cmd) { return call_retrying(db, a, start, cmd); };
  std::string seen_progress;
  for (int round = 0;; ++round) {
    bool done = false;
    if (!last.empty()) {
      auto got = call({"XREAD", "COUNT", "100", "BLOCK", "250", "STREAMS", notify, last});
      if (!got.ok() && wrong_type(got.status())) {  // replaced by another type meanwhile
        if (!a.quiet)
          std::fprintf(stderr,
                       "zimage submit: %s is not a stream (%s); waiting by polling the result\n",
                       notify.c_str(), got.status().message().c_str());
        last.clear();
      } else {
        auto r = must(std::move(got), "XREAD " + notify);
        if (!r.is_nil()) {
          auto streams = must(broker::as_array(r, 1, "XREAD"), "XREAD");
          auto s = must(broker::as_array((*streams)[0], 2, "XREAD stream"), "XREAD");
          auto entries = must(broker::as_array((*s)[1], 0, "XREAD entries"), "XREAD");
          for (const broker::Reply& e : *entries) {
            auto parts = must(broker::as_array(e, 2, "notification"), "XREAD");
            last = must(broker::as_string((*parts)[0], "notification id"), "XREAD");
            for (const auto& [k, v] : must(broker::as_pairs((*parts)[1], "notification"), "XREAD"))
              if (k == "id" && v == id) done = true;
          }
        }
      }
    }
    const bool polling = last.empty();
    if (polling) std::this_thread::sleep_for(std::chrono::milliseconds(250));
    if (!done && (polling || round % 8 == 7)) {  // a trimmed notification stream must not hang us
      auto ex = must(call({"EXISTS", rkey}), "EXISTS");
      done = must(broker::as_integer(ex, "EXISTS"), "EXISTS") > 0;
    }
    if (done) break;
    auto p = must(call({"GET", pkey}), "GET " + pkey);
    if (!p.is_nil()) {
      const std::string text = must(broker::as_string(p, "progress"), "GET");
      if (text != seen_progress) {
        seen_progress = text;
        auto prog = broker::decode_progress(text);
        if (prog.ok()) bar.update(*prog);
      }
    }
    const double waited = seconds_since(start);
    if (a.timeout_s > 0 && waited > a.timeout_s) {
      bar.finish("timed out");
      fail(1, "job " + id + ": no result after " + std::to_string(a.timeout_s) +
                  " s (--timeout); it stays queued");
    }
  }
  auto h = must(call({"HGETALL", rkey}), "HGETALL " + rkey);
  auto fields = must(broker::as_pairs(h, "result " + rkey), "HGETALL");
  auto res = must(broker::decode_result(fields), "result of job " + id);
  bar.finish(res.ok ? "done" : "failed");
  if (!res.ok) fail(1, "job " + id + " failed (" + res.error_code + "): " + res.error);
  const auto paths = output_paths(a.output, res.images.size());
  std::vector<std::vector<uint8_t>> contents;
  for (const std::string& img : res.images) contents.emplace_back(img.begin(), img.end());
  const Status written = write_files_atomically(paths, contents);
  if (!written.ok()) fail(1, written.to_string());
  if (!a.quiet)
    for (const std::string& p : paths)
      std::fprintf(stderr, "wrote %s (seed %llu, worker %s)\n", p.c_str(),
                   static_cast<unsigned long long>(res.seed), res.worker.c_str());
}

void run_submit(const SubmitArgs& a, const CLI::App& cmd) {
  auto url = broker_url(a.broker);
  if (!url.ok())
    fail(url.status().code() == ErrorCode::kInvalidArgument ? 2 : 1, url.status().message());
  if (a.seed < -1) fail(2, "--seed: must be 0 or more, or -1 for a random seed");
  // The library's rule (zimage/request_check.h), on the flag's value: JSON has no NaN or infinity,
  // so a value the worker would refuse must not be queued as something else.
  if (const Status g = check_number("--guidance", a.guidance, kMinGuidance, kMaxGuidance); !g.ok())
    fail(2, g.message());
  GenerateRequest req;
  req.prompts = {a.prompt};
  if (cmd.count("--negative-prompt") > 0) req.negative_prompt = a.negative_prompt;
  req.width = a.width;
  req.height = a.height;
  req.steps = a.steps;
  req.guidance = a.guidance;
  req.images_per_prompt = a.images_per_prompt;
  if (a.seed >= 0) {
    req.seed = static_cast<uint64_t>(a.seed);
  } else {  // drawn here, so the job is reproducible and the seed is known before it runs
    std::random_device rd;
    req.seed = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) & ((uint64_t{1} << 53) - 1);
  }
  // The worker's parser checks everything; the model-free checks run here too, so a bad flag
  // is a usage error before anything is queued.
  serve::ParseLimits limits;
  limits.request.size_multiple = 1;  // the model's multiple is the worker's check
  auto body = broker::request_json(req);
  if (!body.ok()) fail(2, body.status().message());
  auto spec = serve::parse_openai(*body, limits, 0);
  if (!spec.ok()) {  // the request field's name -> the flag's
    std::string m = spec.status().message();
    const std::pair<const char*, const char*> names[] = {{"num_inference_steps:", "--steps:"},
                                                         {"guidance_scale:", "--guidance:"},
                                                         {"n:", "--images-per-prompt:"},
                                                         {"negative_prompt:", "--negative-prompt:"},
                                                         {"prompt:", "--prompt:"},
                                                         {"size:", "--width/--height:"},
                                                         {"width:", "--width:"},
                                                         {"height:", "--height:"}};
    for (const auto& [field, flag] : names)
      if (m.rfind(field, 0) == 0) {
        m = flag + m.substr(std::string(field).size());
        break;
      }
    fail(2, m);
  }
  if (a.wait) {
    const Status st = check_writable_path(a.output, "--output");
    if (!st.ok()) fail(st.code() == ErrorCode::kInvalidArgument ? 2 : 1, st.message());
  }
  broker::ClientOptions co;
  co.reconnect_attempts = 3;
  auto db = must(broker::RedisClient::connect(*url, co), "cannot reach the broker");
  auto g = db->command({"XGROUP", "CREATE", a.stream, a.group, "0", "MKSTREAM"});
  if (!g.ok() && g.status().message().find("BUSYGROUP") == std::string::npos)
    fail(1, g.status().message());
  std::string last;
  if (a.wait) last = last_notification(*db, broker::results_stream(a.prefix), a.quiet);
  auto added =
      must(db->command({"XADD", a.stream, "*", broker::kRequestField, *body}), "XADD " + a.stream);
  const std::string id = must(broker::as_string(added, "XADD id"), "XADD");
  std::printf("%s\n", id.c_str());
  std::fflush(stdout);
  if (a.wait) wait_for(*db, a, id, last);
}

}  // namespace

void register_submit_command(CLI::App& app) {
  auto args = std::make_shared<SubmitArgs>();
  CLI::App* cmd = app.add_subcommand(
      "submit",
      "Add a job for `zimage worker` to a Redis stream and print its id; --wait writes the "
      "image. See docs/BROKER.md.");
  add_broker_flags(cmd, args->broker);
  cmd->add_option("--stream", args->stream, "Jobs stream key (default zimage:jobs)");
  cmd->add_option("--group", args->group, "The workers' consumer group (default zimage)");
  cmd->add_option("--prefix", args->prefix, "Key prefix of results (default zimage)");
  cmd->add_option("--prompt,-p", args->prompt, "Prompt (UTF-8)")->required();
  cmd->add_option("--negative-prompt,-n", args->negative_prompt, "Negative prompt");
  cmd->add_option("--width,-W", args->width, "Image width (default 1024)");
  cmd->add_option("--height,-H", args->height, "Image height (default 1024)");
  cmd->add_option("--steps,-s", args->steps, "Denoising steps (default 8)");
  cmd->add_option("--guidance,-g", args->guidance, "CFG scale (default 0 = off)")
      ->check(finite_number(true));
  cmd->add_option("--seed", args->seed,
                  "Seed 0..2^63-1, or -1 for a random one drawn here (default -1)");
  cmd->add_option("--images-per-prompt", args->images_per_prompt, "Images (default 1)");
  cmd->add_flag("--wait", args->wait, "Wait for the result, show progress, write the image(s)");
  cmd->add_option("--timeout", args->timeout_s, "With --wait: give up after this many seconds")
      ->check(CLI::Range(0.0, 1e9))
      ->check(finite_number(false));
  cmd->add_option("--output,-o", args->output,
                  "With --wait: output file; several images: FILE_0.png, ... (default zimage.png)");
  cmd->add_flag("--quiet,-q", args->quiet, "Print only the job id and errors");
  cmd->add_flag("--progress", args->progress, "Show progress even when stderr is not a terminal");
  cmd->callback([args, cmd] { run_submit(*args, *cmd); });
}

}  // namespace zimage::cli
