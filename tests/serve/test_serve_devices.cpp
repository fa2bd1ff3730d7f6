// Data parallel serving (zimage serve --devices, serve/device_pool.h) on two CPU engines: many
// concurrent requests all complete, each image bit-equal to the single engine's for its seed,
// both engines take work (per-engine counters in /metrics and /readyz), per-request LoRAs work
// on every engine, shutdown drains every worker; the real binary with --devices cpu,cpu, bad
// device lists refused naming the item, a device that cannot load stops the server; and
// `zimage generate --devices cpu,cpu` writes the same files as one device (text chunks equal,
// pixels within the 1/255 rounding of GEMMs over fewer rows).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_run.h"
#include "common/npy.h"
#include "common/tiny_engine.h"
#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using zimage::test::ProgramRun;
using zimage::test::ProgramSpec;

// A second CPU engine on the tiny model (the first is shared_engine()); lives until exit.
Engine* second_engine() {
  static Engine* engine = zimage::test::load_tiny_engine().release();
  return engine;
}

// A server with two engines, both "cpu".
class TwoEngineServer {
 public:
  explicit TwoEngineServer(ServeOptions o = TestServer::defaults())
      : server_(std::make_unique<Server>(std::move(o))) {
    EXPECT_TRUE(server_->start().ok());
    const Status st = server_->attach({shared_engine(), second_engine()}, {"cpu", "cpu"}, false);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  ~TwoEngineServer() { server_->shutdown(); }
  int port() const { return server_->port(); }
  Server& server() { return *server_; }

 private:
  std::unique_ptr<Server> server_;
};

std::string body(uint64_t seed, int steps, const std::string& prompt,
                 const std::string& size = "64x64") {
  return json{{"prompt", prompt}, {"seed", seed}, {"num_inference_steps", steps}, {"size", size}}
      .dump();
}

Image decode(const Reply& r) {
  auto img = png_decode(base64_decode(r.json()["data"][0]["b64_json"]), nullptr);
  EXPECT_TRUE(img.ok()) << img.status().to_string();
  return img.ok() ? *img : Image{};
}

int max_diff(const Image& a, const Image& b) {
  if (a.rgb.size() != b.rgb.size() || a.rgb.empty()) return 255;
  int m = 0;
  for (size_t i = 0; i < a.rgb.size(); ++i) m = std::max(m, std::abs(a.rgb[i] - b.rgb[i]));
  return m;
}

Image alone(uint64_t seed, int steps, const std::string& prompt) {
  GenerateRequest req;
  req.prompts = {prompt};
  req.seed = seed;
  req.steps = steps;
  req.width = req.height = 64;
  auto r = shared_engine()->generate(req);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->images[0] : Image{};
}

// The value of `name{engine="i",device="cpu"}` in /metrics (-1 when absent).
double engine_metric(int port, const std::string& name, int engine) {
  const std::string text = get(port, "/metrics").body;
  const std::string key =
      "\n" + name + "{engine=\"" + std::to_string(engine) + "\",device=\"cpu\"} ";
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::atof(text.c_str() + at + key.size());
}

// Eight clients at once on two engines, serial and batching executors.
TEST(ServeDevices, ConcurrentRequestsSplitOverTwoEngines) {
  for (bool batching : {false, true}) {
    ServeOptions o = TestServer::defaults();
    o.batching = batching;
    TwoEngineServer server(o);
    constexpr int kClients = 8;
    std::vector<Reply> replies(kClients);
    std::vector<std::thread> threads;
    for (int c = 0; c < kClients; ++c)
      threads.emplace_back([&, c] {
        replies[c] = post(server.port(), "/v1/images/generations",
                          body(500 + c, 3, "prompt " + std::to_string(c)));
      });
    for (auto& t : threads) t.join();
    int worst = 0;
    for (int c = 0; c < kClients; ++c) {
      ASSERT_EQ(replies[c].status, 200) << replies[c].body;
      worst = std::max(
          worst, max_diff(decode(replies[c]), alone(500 + c, 3, "prompt " + std::to_string(c))));
    }
    const double j0 = engine_metric(server.port(), "zimage_engine_jobs_total", 0);
    const double j1 = engine_metric(server.port(), "zimage_engine_jobs_total", 1);
    const double i0 = engine_metric(server.port(), "zimage_engine_images_total", 0);
    const double i1 = engine_metric(server.port(), "zimage_engine_images_total", 1);
    const double b0 = engine_metric(server.port(), "zimage_engine_busy_seconds_total", 0);
    const double b1 = engine_metric(server.port(), "zimage_engine_busy_seconds_total", 1);
    std::printf(
        "  batching %s: max |diff| to one engine %d/255; jobs %.0f + %.0f, images %.0f + %.0f, "
        "busy %.2f s + %.2f s\n",
        batching ? "on" : "off", worst, j0, j1, i0, i1, b0, b1);
    if (batching) {
      EXPECT_LE(worst, 1);  // the batch's GEMMs see more rows (test_serve_batching.cpp)
    } else {
      EXPECT_EQ(worst, 0) << "a job on either engine must give exactly the one-engine image";
    }
    // Serial executors: each engine takes one job at a time, so a burst of 8 reaches both. A
    // batching executor may admit the whole burst into one batch before the other engine asks
    // (seen: 8 + 0 in a clean-clone run), so there only the totals are fixed.
    if (!batching) {
      EXPECT_GT(j0, 0) << "engine 0 did no work";
      EXPECT_GT(j1, 0) << "engine 1 did no work";
      EXPECT_GT(b0, 0);
      EXPECT_GT(b1, 0);
    }
    EXPECT_EQ(j0 + j1, kClients);
    EXPECT_EQ(i0 + i1, kClients);
    EXPECT_GT(b0 + b1, 0);
    const std::string text = get(server.port(), "/metrics").body;
    EXPECT_NE(text.find("\nzimage_engines 2\n"), std::string::npos);
    const json ready = get(server.port(), "/readyz").json();
    ASSERT_EQ(ready["devices"].size(), 2u) << ready.dump();
    for (int e = 0; e < 2; ++e) {
      EXPECT_EQ(ready["devices"][e]["engine"], e);
      EXPECT_EQ(ready["devices"][e]["device"], "cpu");
      EXPECT_EQ(ready["devices"][e]["backend"].get<std::string>().rfind("cpu", 0), 0u);
      if (!batching) {
        EXPECT_GT(ready["devices"][e]["jobs"].get<int>(), 0);
      }
    }
    const json models = get(server.port(), "/v1/models").json();
    EXPECT_EQ(models["data"][0]["zimage"]["engines"], 2);
  }
}

// A per-request LoRA on whichever engine takes it: every LoRA image is diffusers' (the LoRA
// parity case), every plain one too, and both engines ran LoRA jobs.
TEST(ServeDevices, PerRequestLorasOnEveryEngine) {
  const fs::path dir = fs::temp_directory_path() / ("zimage_dp_lora_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(std::string(ZIMAGE_LORA_DIR) + "/peft.safetensors", dir / "peft.safetensors");
  ServeOptions o = TestServer::defaults();
  o.lora_dir = dir.string();
  TwoEngineServer server(o);
  auto golden = [](const std::string& name) {
    auto g = zimage::test::load_npy(std::string(ZIMAGE_LORA_DIR) + "/" + name + ".image.npy");
    EXPECT_TRUE(g.ok()) << name;
    return g.ok() ? std::vector<float>(g->data_as<float>(), g->data_as<float>() + g->numel())
                  : std::vector<float>{};
  };
  const std::vector<float> with = golden("peft"), without = golden("base");
  constexpr int kClients = 8;
  std::vector<Reply> replies(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c)
    threads.emplace_back([&, c] {
      json b = {{"prompt", "a cat sitting on a red sofa, photo"},
                {"size", "32x32"},
                {"num_inference_steps", 2},
                {"guidance_scale", 0.0},
                {"seed", 0}};
      if (c % 2 == 0) b["loras"] = json::array({{{"name", "peft.safetensors"}, {"scale", 1.0}}});
      replies[c] = post(server.port(), "/v1/images/generations", b.dump());
    });
  for (auto& t : threads) t.join();
  double worst = 0;
  for (int c = 0; c < kClients; ++c) {
    ASSERT_EQ(replies[c].status, 200) << replies[c].body;
    const Image img = decode(replies[c]);
    const std::vector<float>& ref = c % 2 == 0 ? with : without;
    ASSERT_EQ(img.rgb.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i)
      worst = std::max(worst, std::abs(img.rgb[i] / 255.0 - ref[i]));
  }
  std::printf("  LoRA and plain requests on two engines: max |diff| to diffusers %.4f\n", worst);
  EXPECT_LE(worst, 1.5 / 255.0);
  EXPECT_GT(engine_metric(server.port(), "zimage_engine_jobs_total", 0), 0);
  EXPECT_GT(engine_metric(server.port(), "zimage_engine_jobs_total", 1), 0);
  server.server().shutdown();
  fs::remove_all(dir);
}

// Shutdown with a long job running on each engine and more queued: all end cancelled, quickly.
TEST(ServeDevices, ShutdownDrainsEveryEngine) {
  TwoEngineServer server;
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    Reply r = post(server.port(), "/v1/jobs", body(i, 1000, "long", "128x128"));
    ASSERT_EQ(r.status, 202) << r.body;
    ids.push_back(r.json()["id"]);
  }
  auto running = [&] {
    int n = 0;
    for (const auto& id : ids) n += get(server.port(), "/v1/jobs/" + id).json()["step"] > 0;
    return n;
  };
  for (int i = 0; i < 1000 && running() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(running(), 2) << "two engines should run two jobs at once";
  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& id : ids) jobs.push_back(server.server().context().jobs.find(id));
  const auto t0 = std::chrono::steady_clock::now();
  server.server().shutdown();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  shutdown with 2 running and 2 queued jobs took %.2f s\n", took);
  EXPECT_LT(took, 10);
  for (const auto& job : jobs) {
    ASSERT_NE(job, nullptr);
    const JobSnapshot s = job->snapshot();
    EXPECT_EQ(s.state, JobState::kCancelled);
    EXPECT_EQ(s.error.message, "server shutting down");
  }
}

// ---- the real binary ------------------------------------------------------------------------

std::vector<std::string> serve_args(const std::string& devices) {
  return {
      "serve", "--model", ZIMAGE_SERVE_MODEL_DIR, "--port", "0", "--devices", devices, "--threads",
      "2",     "--quiet", "--default-size",       "64x64"};
}

TEST(ServeDevicesCli, ServesOnCpuCpuAndStopsOnSigterm) {
  ProgramSpec spec{ZIMAGE_CLI_PATH, serve_args("cpu,cpu"), {}, ""};
  zimage::test::RunningProgram child = zimage::test::start_program(spec);
  ASSERT_GT(child.pid, 0);
  const std::string out_path = child.scratch + "/stdout";
  std::string out;
  int port = -1;
  for (int i = 0; i < 1200; ++i) {
    out = zimage::test::read_file_bytes(out_path);
    std::smatch m;
    if (port < 0 && std::regex_search(out, m, std::regex(R"(127\.0\.0\.1:(\d+))")))
      port = std::stoi(m[1].str());
    if (out.find("ready") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(port, 0) << out;
  EXPECT_NE(out.find("engine 0 on cpu: cpu"), std::string::npos) << out;
  EXPECT_NE(out.find("engine 1 on cpu: cpu"), std::string::npos) << out;
  EXPECT_NE(out.find("engines 0 and 1 share cpu"), std::string::npos) << out;
  EXPECT_NE(out.find("ready (2 engines, cpu"), std::string::npos) << out;
  const json ready = get(port, "/readyz").json();
  EXPECT_EQ(ready["devices"].size(), 2u) << ready.dump();
  Reply r = post(port, "/v1/images/generations", body(3, 2, "a fox"));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(max_diff(decode(r), alone(3, 2, "a fox")), 0);
  ASSERT_EQ(kill(child.pid, SIGTERM), 0);
  const ProgramRun done = zimage::test::wait_program(child);
  EXPECT_EQ(done.exit_code, 0) << done.err;
}

TEST(ServeDevicesCli, BadDeviceListsAreRefusedNamingTheItem) {
  struct Case {
    std::string devices;
    int code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"cuda:x", 2,
       "--devices: item 1 of 'cuda:x': 'cuda:x' is not one of cpu, cuda, cuda:N, cuda:A-B"},
      {"cpu,,cpu", 2, "--devices: item 2 of 'cpu,,cpu' is empty"},
      {"cpu,cuda:0", 2, "mixes cpu and cuda engines"},
      {"all,cpu", 2, "'all' must stand alone"},
  };
  for (const Case& c : cases) {
    const ProgramRun r =
        zimage::test::run_program({ZIMAGE_CLI_PATH, serve_args(c.devices), {}, ""});
    EXPECT_EQ(r.exit_code, c.code) << c.devices << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.devices << ": " << r.err;
    EXPECT_EQ(r.out.find("ready"), std::string::npos) << r.out;
  }
  // --device and --devices together: a usage error.
  std::vector<std::string> both = serve_args("cpu,cpu");
  both.insert(both.end(), {"--device", "cpu"});
  const ProgramRun r = zimage::test::run_program({ZIMAGE_CLI_PATH, both, {}, ""});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("excludes"), std::string::npos) << r.err;
}

// A device whose engine cannot load: the server does not start, the error names the device.
TEST(ServeDevicesCli, ADeviceThatCannotLoadStopsTheServer) {
  const ProgramRun r = zimage::test::run_program({ZIMAGE_CLI_PATH, serve_args("cuda:63"), {}, ""});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cuda:63"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("ready"), std::string::npos) << r.out;
}

// `zimage generate --devices cpu,cpu`: the same files as one device: the same PNG text (prompt,
// seed, batch index, ...) and pixels within 1/255.
TEST(GenerateDevicesCli, SplitBatchWritesTheSameFiles) {
  const fs::path dir = fs::temp_directory_path() / ("zimage_dp_gen_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Case {
    std::vector<std::string> prompts;
    int per;
    std::string devices;
  };
  const std::vector<Case> cases = {
      {{"a red fox"}, 4, "cpu,cpu"},
      {{"a red fox", "a blue car"}, 3, "cpu,cpu,cpu,cpu"},  // parts cross prompts
      {{"a red fox"}, 2, "cpu,cpu,cpu"},                    // more engines than images
  };
  int k = 0;
  for (const Case& c : cases) {
    auto args = [&](const std::string& out, const std::string& dev_flag, const std::string& dev) {
      std::vector<std::string> a = {"generate",
                                    "--model",
                                    ZIMAGE_SERVE_MODEL_DIR,
                                    "--width",
                                    "64",
                                    "--height",
                                    "64",
                                    "--steps",
                                    "2",
                                    "--seed",
                                    "11",
                                    "--threads",
                                    "2",
                                    "--images-per-prompt",
                                    std::to_string(c.per),
                                    dev_flag,
                                    dev,
                                    "--output",
                                    out,
                                    "--quiet"};
      for (const auto& p : c.prompts) a.insert(a.end(), {"--prompt", p});
      return a;
    };
    const std::string one = (dir / ("one" + std::to_string(k) + ".png")).string();
    const std::string many = (dir / ("many" + std::to_string(k) + ".png")).string();
    ++k;
    const ProgramRun r1 =
        zimage::test::run_program({ZIMAGE_CLI_PATH, args(one, "--device", "cpu"), {}, ""});
    ASSERT_EQ(r1.exit_code, 0) << r1.err;
    const ProgramRun r2 =
        zimage::test::run_program({ZIMAGE_CLI_PATH, args(many, "--devices", c.devices), {}, ""});
    ASSERT_EQ(r2.exit_code, 0) << r2.err;
    const size_t n = c.prompts.size() * static_cast<size_t>(c.per);
    int worst = 0;
    size_t differing = 0, values = 0, identical_files = 0;
    for (size_t i = 0; i < n; ++i) {
      auto name = [&](const std::string& base) {
        const fs::path p(base);
        return (p.parent_path() / (p.stem().string() + "_" + std::to_string(i) + ".png")).string();
      };
      PngTextChunks ta, tb;
      auto a = png_load(name(one), &ta);
      auto b = png_load(name(many), &tb);
      ASSERT_TRUE(a.ok()) << a.status().to_string();
      ASSERT_TRUE(b.ok()) << b.status().to_string();
      EXPECT_EQ(ta, tb) << c.devices << ": image " << i << ": other PNG text (prompt, seed, index)";
      worst = std::max(worst, max_diff(*a, *b));
      for (size_t v = 0; v < a->rgb.size() && v < b->rgb.size(); ++v)
        differing += a->rgb[v] != b->rgb[v];
      values += a->rgb.size();
      identical_files +=
          zimage::test::read_file_bytes(name(one)) == zimage::test::read_file_bytes(name(many));
    }
    std::printf(
        "  %zu prompt(s) x %d on %s: max |diff| to one device %d/255 (%zu of %zu values), %zu of "
        "%zu files byte-identical\n",
        c.prompts.size(), c.per, c.devices.c_str(), worst, differing, values, identical_files, n);
    // Rounding of GEMMs over fewer rows only (see test_data_parallel.cpp); a wrong noise or
    // prompt would be tens of levels away.
    EXPECT_LE(worst, 1);
    EXPECT_LE(differing, values / 100);
  }
  // --dump would write every part's tensors to one folder: refused.
  const ProgramRun d =
      zimage::test::run_program({ZIMAGE_CLI_PATH,
                                 {"generate", "--model", ZIMAGE_SERVE_MODEL_DIR, "--prompt", "x",
                                  "--images-per-prompt", "2", "--devices", "cpu,cpu", "--dump",
                                  (dir / "dump").string(), "--output", (dir / "d.png").string()},
                                 {},
                                 ""});
  EXPECT_EQ(d.exit_code, 2) << d.err;
  EXPECT_NE(d.err.find("--dump: not with --devices"), std::string::npos) << d.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zimage::serve::test
