// The endpoints on a live in-process server with the tiny model: OpenAI images (b64, url, JPEG,
// WebP), async jobs with their Server-Sent Events (one progress event per step, late clients,
// cancel), image download with PNG metadata, Automatic1111, seeds, models, health and metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

using nlohmann::json;

json wait_job(int port, const std::string& id) {
  for (int i = 0; i < 600; ++i) {
    json j = get(port, "/v1/jobs/" + id).json();
    const std::string s = j.value("status", "");
    if (s == "succeeded" || s == "failed" || s == "cancelled") return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return {};
}

class ServeApi : public ::testing::Test {
 protected:
  void SetUp() override { server_ = std::make_unique<TestServer>(); }
  int port() const { return server_->port(); }
  std::unique_ptr<TestServer> server_;
};

TEST_F(ServeApi, OpenAiB64PngCarriesTheCliMetadata) {
  Reply r = post(port(), "/v1/images/generations",
                 R"({"prompt": "a red fox", "negative_prompt": "blur", "size": "64x48",
                     "num_inference_steps": 2, "guidance_scale": 1.5, "seed": 7})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["seed"], 7);
  PngTextChunks text;
  auto img = png_decode(base64_decode(j["data"][0]["b64_json"]), &text);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  EXPECT_EQ(img->width, 64);
  EXPECT_EQ(img->height, 48);
  const PngTextChunks want = {
      {"prompt", "a red fox"}, {"negative_prompt", "blur"},
      {"seed", "7"},           {"batch_index", "0"},
      {"steps", "2"},          {"guidance", "1.5"},
      {"size", "64x48"},       {"software", std::string("zimage ") + kVersion}};
  EXPECT_EQ(text, want);
}

TEST_F(ServeApi, OpenAiUrlJpegWebpAndN) {
  Reply r = post(port(), "/v1/images/generations",
                 R"({"prompt": "x", "n": 2, "response_format": "url", "seed": 3})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  ASSERT_EQ(j["data"].size(), 2u);
  const std::string url = j["data"][1]["url"];
  const std::string prefix = "http://127.0.0.1:" + std::to_string(port());
  ASSERT_EQ(url.rfind(prefix, 0), 0u) << url;
  Reply im = get(port(), url.substr(prefix.size()));
  EXPECT_EQ(im.status, 200);
  EXPECT_EQ(im.headers.find("Content-Type")->second, "image/png");
  EXPECT_EQ(im.headers.find("X-Content-Type-Options")->second, "nosniff");
  PngTextChunks text;
  ASSERT_TRUE(png_decode({im.body.begin(), im.body.end()}, &text).ok());
  EXPECT_NE(
      std::find(text.begin(), text.end(), std::pair<std::string, std::string>("batch_index", "1")),
      text.end());

  for (const char* f : {"jpeg", "webp"}) {
    Reply rf = post(port(), "/v1/images/generations",
                    std::string(R"({"prompt": "x", "output_format": ")") + f + "\"}");
    ASSERT_EQ(rf.status, 200) << rf.body;
    const std::vector<uint8_t> b = base64_decode(rf.json()["data"][0]["b64_json"]);
    ASSERT_GT(b.size(), 12u);
    if (std::string(f) == "jpeg") {
      EXPECT_EQ(b[0], 0xFF);
      EXPECT_EQ(b[1], 0xD8);
    } else {
      EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "RIFF");
      EXPECT_EQ(std::string(b.begin() + 8, b.begin() + 12), "WEBP");
    }
  }
}

TEST_F(ServeApi, RandomSeedIsReturnedAndStoredInThePng) {
  std::set<uint64_t> seeds;
  for (const char* body : {R"({"prompt": "r"})", R"({"prompt": "r", "seed": -1})",
                           R"({"prompt": "r", "seed": null})"}) {
    Reply r = post(port(), "/v1/images/generations", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = r.json();
    const uint64_t seed = j["seed"];
    EXPECT_EQ(j["data"][0]["seed"], seed);
    EXPECT_TRUE(j["parameters"]["random_seed"].get<bool>());
    PngTextChunks text;
    ASSERT_TRUE(png_decode(base64_decode(j["data"][0]["b64_json"]), &text).ok());
    EXPECT_EQ(text[1].second, std::to_string(seed));  // no negative prompt: seed is 2nd
    seeds.insert(seed);
  }
  EXPECT_EQ(seeds.size(), 3u);
  // The largest seed is accepted.
  Reply big = post(port(), "/v1/jobs", R"({"prompt": "r", "seed": 18446744073709551615})");
  ASSERT_EQ(big.status, 202) << big.body;
  EXPECT_EQ(big.json()["seed"].get<uint64_t>(), 18446744073709551615ull);
}

TEST_F(ServeApi, SameSeedSamePixels) {
  const std::string body = R"({"prompt": "determinism", "seed": 11})";
  Reply a = post(port(), "/v1/images/generations", body);
  Reply b = post(port(), "/v1/images/generations", body);
  ASSERT_EQ(a.status, 200);
  ASSERT_EQ(b.status, 200);
  auto ia = png_decode(base64_decode(a.json()["data"][0]["b64_json"]), nullptr);
  auto ib = png_decode(base64_decode(b.json()["data"][0]["b64_json"]), nullptr);
  ASSERT_TRUE(ia.ok() && ib.ok());
  EXPECT_EQ(ia->rgb, ib->rgb);
  Reply c = post(port(), "/v1/images/generations", R"({"prompt": "determinism", "seed": 12})");
  auto ic = png_decode(base64_decode(c.json()["data"][0]["b64_json"]), nullptr);
  ASSERT_TRUE(ic.ok());
  EXPECT_NE(ia->rgb, ic->rgb);
}

TEST_F(ServeApi, JobEventsOneProgressPerStepThenDone) {
  const std::string id = submit(port(), R"({"prompt": "steps", "num_inference_steps": 6})");
  const std::vector<Event> ev = read_events(port(), id);
  ASSERT_GE(ev.size(), 3u);
  std::vector<int> steps;
  for (const Event& e : ev)
    if (e.name == "progress") {
      steps.push_back(e.data["step"]);
      EXPECT_EQ(e.data["total"], 6);
    }
  // Watching from submission: queued (or started), every step 1..6 once, in order, then done.
  EXPECT_TRUE(ev.front().name == "queued" || ev.front().name == "started") << ev.front().name;
  EXPECT_EQ(steps, (std::vector<int>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ev.back().name, "done");
  ASSERT_EQ(ev.back().data["images"].size(), 1u);
  int started = 0;
  for (const Event& e : ev) started += e.name == "started";
  EXPECT_EQ(started, 1);

  // A late client gets the final state straight away.
  const std::vector<Event> late = read_events(port(), id);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].name, "done");

  const json j = get(port(), "/v1/jobs/" + id).json();
  EXPECT_EQ(j["status"], "succeeded");
  EXPECT_EQ(j["step"], 6);
  EXPECT_GT(j["timings"]["total_s"].get<double>(), 0.0);
  EXPECT_GE(j["timings"]["queue_wait_s"].get<double>(), 0.0);
  EXPECT_EQ(j["images"].size(), 1u);
  Reply img = get(port(), "/v1/jobs/" + id + "/images/0");
  EXPECT_EQ(img.status, 200);
  Reply missing = get(port(), "/v1/jobs/" + id + "/images/1");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.json()["error"]["param"], "index");
}

TEST_F(ServeApi, CancelQueuedAndRunningJobsIdempotently) {
  // A long job runs; a second waits behind it.
  const std::string running =
      submit(port(), R"({"prompt": "long", "num_inference_steps": 1000, "size": "128x128"})");
  // Wait until the long one has made a step.
  for (int i = 0; i < 1200; ++i) {
    if (get(port(), "/v1/jobs/" + running).json().value("step", 0) > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  const std::string queued = submit(port(), R"({"prompt": "behind"})");
  json q = get(port(), "/v1/jobs/" + queued).json();
  EXPECT_EQ(q["status"], "queued");
  EXPECT_EQ(q["queue_position"], 0);
  // A late SSE client of the running job gets "started" and the current step first.
  std::vector<Event> late =
      read_events(port(), running, "", [n = 0](const Event&) mutable { return ++n >= 2; });
  ASSERT_EQ(late.size(), 2u);
  EXPECT_EQ(late[0].name, "started");
  EXPECT_EQ(late[1].name, "progress");
  EXPECT_GT(late[1].data["step"].get<int>(), 0);

  EXPECT_EQ(del(port(), "/v1/jobs/" + queued).status, 200);
  EXPECT_EQ(get(port(), "/v1/jobs/" + queued).json()["status"], "cancelled");
  EXPECT_EQ(del(port(), "/v1/jobs/" + running).status, 200);
  const json r = wait_job(port(), running);
  EXPECT_EQ(r["status"], "cancelled");
  EXPECT_LT(r["step"].get<int>(), 1000);
  // Idempotent: cancelling again changes nothing.
  Reply again = del(port(), "/v1/jobs/" + running);
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(again.json()["status"], "cancelled");
  const std::vector<Event> ev = read_events(port(), running);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].name, "cancelled");
  EXPECT_EQ(get(port(), "/v1/jobs/" + running + "/images/0").status, 409);
  // The worker is free again.
  EXPECT_EQ(post(port(), "/v1/images/generations", R"({"prompt": "next"})").status, 200);
}

TEST_F(ServeApi, Automatic1111Txt2ImgAndProgress) {
  Reply r = post(port(), "/sdapi/v1/txt2img",
                 R"({"prompt": "a1111", "width": 64, "height": 32, "steps": 2, "cfg_scale": 0,
                     "seed": 5, "batch_size": 2, "n_iter": 2, "sampler_name": "Euler"})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  ASSERT_EQ(j["images"].size(), 4u);
  const json info = json::parse(j["info"].get<std::string>());
  EXPECT_EQ(info["seed"], 5);
  EXPECT_EQ(info["all_seeds"], json({5, 5, 7, 7}));  // iteration i: seed + i * batch_size
  EXPECT_EQ(j["parameters"]["n_iter"], 2);
  auto img = png_decode(base64_decode(j["images"][3]), nullptr);
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->width, 64);
  EXPECT_EQ(img->height, 32);
  Reply rnd = post(port(), "/sdapi/v1/txt2img", R"({"prompt": "a", "seed": -1})");
  ASSERT_EQ(rnd.status, 200);
  EXPECT_GE(json::parse(rnd.json()["info"].get<std::string>())["seed"].get<uint64_t>(), 0u);

  const json idle = get(port(), "/sdapi/v1/progress").json();
  EXPECT_EQ(idle["progress"], 0.0);
  const std::string id = submit(port(), R"({"prompt": "p", "num_inference_steps": 1000})");
  json p;
  for (int i = 0; i < 1200; ++i) {
    p = get(port(), "/sdapi/v1/progress").json();
    if (p["state"]["sampling_step"].get<int>() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_EQ(p["state"]["job"], id);
  EXPECT_EQ(p["state"]["sampling_steps"], 1000);
  EXPECT_GT(p["progress"].get<double>(), 0.0);
  del(port(), "/v1/jobs/" + id);
}

TEST_F(ServeApi, HealthReadyModelsMetrics) {
  EXPECT_EQ(get(port(), "/healthz").status, 200);
  EXPECT_EQ(get(port(), "/readyz").status, 200);
  const json models = get(port(), "/v1/models").json();
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "z-image-turbo");
  ASSERT_EQ(post(port(), "/v1/images/generations", R"({"prompt": "m"})").status, 200);
  ASSERT_EQ(post(port(), "/v1/images/generations", R"({"prompt": 1})").status, 400);
  // HTTP responses are counted by the access logger, just after the response went out.
  Reply m;
  for (int i = 0; i < 100; ++i) {
    m = get(port(), "/metrics");
    if (m.body.find("zimage_http_requests_total{code=\"400\"} 1") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.headers.find("Content-Type")->second.find("text/plain"), std::string::npos);
  for (const char* line :
       {"zimage_ready 1", "zimage_queue_depth 0", "zimage_jobs_total{outcome=\"succeeded\"} 1",
        "zimage_jobs_rejected_total{reason=\"invalid\"} 1", "zimage_images_generated_total 1",
        "zimage_phase_seconds_count{phase=\"denoise\"} 1",
        "zimage_phase_seconds_bucket{phase=\"total\",le=\"+Inf\"} 1",
        "zimage_http_requests_total{code=\"400\"} 1"})
    EXPECT_NE(m.body.find(line), std::string::npos) << line << "\n" << m.body;
  // No GPU memory line: the CPU engine reports none.
  EXPECT_EQ(m.body.find("gpu_memory"), std::string::npos);
  // The web page.
  Reply page = get(port(), "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("<title>zimage</title>"), std::string::npos);
  EXPECT_EQ(page.body.find("http://"), std::string::npos);  // no external URLs
  EXPECT_EQ(page.body.find("https://"), std::string::npos);
}

TEST(ServeLifecycle, ReadyzIs503UntilTheEngineIsAttached) {
  ServeOptions o = TestServer::defaults();
  Server server(o);
  ASSERT_TRUE(server.start().ok());
  EXPECT_EQ(get(server.port(), "/healthz").status, 200);
  Reply r = get(server.port(), "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_TRUE(r.json()["error"]["message"].is_string());
  Reply gen = post(server.port(), "/v1/jobs", R"({"prompt": "early"})");
  EXPECT_EQ(gen.status, 503);
  EXPECT_TRUE(gen.headers.count("Retry-After"));
  ASSERT_TRUE(server.attach(shared_engine(), nullptr, /*warm_up=*/true).ok());
  EXPECT_EQ(get(server.port(), "/readyz").status, 200);
  server.shutdown();
}

TEST(ServeLifecycle, ImmediateShutdownDoesNotHang) {
  for (int i = 0; i < 20; ++i) {
    Server s(TestServer::defaults());
    ASSERT_TRUE(s.start().ok());
    s.shutdown();
  }
}

TEST(ServeLifecycle, NonLoopbackHostNeedsAnApiKey) {
  ServeOptions o = TestServer::defaults();
  o.host = "0.0.0.0";
  Server s(o);
  const Status st = s.start();
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--api-key"), std::string::npos);
}

}  // namespace
}  // namespace zimage::serve::test
