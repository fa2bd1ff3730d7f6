// Continuous batching in the server (BatchingExecutor, --batching on): concurrent clients' jobs
// of one size share denoising steps (the metrics show more than one request per step), every job
// gets its own image, equal within 1/255 to the same request served alone (and exactly equal with
// --batching off), a job cancelled mid-batch leaves while the others finish, a job the engine
// refuses after queueing fails alone, and jobs of another size wait their turn.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "serve/batching_executor.h"
#include "serve_test_util.h"

namespace zimage::serve::test {
namespace {

using nlohmann::json;

std::string body(uint64_t seed, int steps, int side = 64, const std::string& prompt = "a fox") {
  return json{{"prompt", prompt},
              {"seed", seed},
              {"num_inference_steps", steps},
              {"size", std::to_string(side) + "x" + std::to_string(side)}}
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

// The image `shared_engine()` makes for the request alone.
Image alone(uint64_t seed, int steps, int side, const std::string& prompt) {
  GenerateRequest req;
  req.prompts = {prompt};
  req.seed = seed;
  req.steps = steps;
  req.width = req.height = side;
  auto r = shared_engine()->generate(req);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->images[0] : Image{};
}

double metric(int port, const std::string& name) {
  const std::string text = get(port, "/metrics").body;
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atof(text.c_str() + at + name.size() + 2);
}

// Eight clients at once, different seeds and prompts: batched, each image its own.
TEST(ServeBatching, ConcurrentJobsShareStepsAndKeepTheirImages) {
  for (bool batching : {true, false}) {
    ServeOptions o = TestServer::defaults();
    o.batching = batching;
    o.max_batch_images = 8;
    TestServer server(o);
    constexpr int kClients = 8;
    std::vector<Reply> replies(kClients);
    std::vector<std::thread> threads;
    for (int c = 0; c < kClients; ++c) {
      threads.emplace_back([&, c] {
        replies[c] = post(server.port(), "/v1/images/generations",
                          body(100 + c, 6, 64, "prompt number " + std::to_string(c)));
      });
    }
    for (auto& t : threads) t.join();
    int worst = 0;
    for (int c = 0; c < kClients; ++c) {
      ASSERT_EQ(replies[c].status, 200) << replies[c].body;
      EXPECT_EQ(replies[c].json()["seed"], 100 + c);
      const int d =
          max_diff(decode(replies[c]), alone(100 + c, 6, 64, "prompt number " + std::to_string(c)));
      worst = std::max(worst, d);
    }
    std::printf(
        "  batching %s: max |diff| against the request alone %d/255, most requests in "
        "one step %.0f\n",
        batching ? "on" : "off", worst, metric(server.port(), "zimage_batch_max_requests"));
    if (batching) {
      EXPECT_LE(worst, 1);
      EXPECT_GT(metric(server.port(), "zimage_batch_max_requests"), 1)
          << "eight concurrent jobs never shared a step";
    } else {
      EXPECT_EQ(worst, 0) << "--batching off must give exactly the image generate() gives";
    }
  }
}

ServeOptions batching_on() {
  ServeOptions o = TestServer::defaults();
  o.batching = true;
  return o;
}

TEST(ServeBatching, CancelledJobLeavesTheBatchOthersFinish) {
  TestServer server(batching_on());
  Reply a = post(server.port(), "/v1/jobs", body(1, 40));
  Reply b = post(server.port(), "/v1/jobs", body(2, 6));
  ASSERT_EQ(a.status, 202) << a.body;
  ASSERT_EQ(b.status, 202) << b.body;
  const std::string ida = a.json()["id"], idb = b.json()["id"];
  // Wait until the long job runs, then cancel it.
  for (int i = 0; i < 200 && get(server.port(), "/v1/jobs/" + ida).json()["step"] < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(del(server.port(), "/v1/jobs/" + ida).status, 200);
  std::string sa, sb;
  for (int i = 0; i < 500; ++i) {
    sa = get(server.port(), "/v1/jobs/" + ida).json()["status"];
    sb = get(server.port(), "/v1/jobs/" + idb).json()["status"];
    if ((sa == "cancelled" || sa == "succeeded") && (sb == "succeeded" || sb == "failed")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(sa, "cancelled");
  EXPECT_EQ(sb, "succeeded");
  Reply img = get(server.port(), "/v1/jobs/" + idb + "/images/0");
  ASSERT_EQ(img.status, 200);
  auto got = png_decode({img.body.begin(), img.body.end()}, nullptr);
  ASSERT_TRUE(got.ok());
  EXPECT_LE(max_diff(*got, alone(2, 6, 64, "a fox")), 1);
}

TEST(ServeBatching, OtherSizesWaitTheirTurn) {
  TestServer server(batching_on());
  std::vector<Reply> r(3);
  std::thread t0([&] { r[0] = post(server.port(), "/v1/images/generations", body(5, 8, 64)); });
  std::thread t1([&] { r[1] = post(server.port(), "/v1/images/generations", body(6, 3, 32)); });
  std::thread t2([&] { r[2] = post(server.port(), "/v1/images/generations", body(7, 3, 64)); });
  t0.join();
  t1.join();
  t2.join();
  for (const Reply& x : r) ASSERT_EQ(x.status, 200) << x.body;
  EXPECT_EQ(decode(r[1]).width, 32);
  EXPECT_LE(max_diff(decode(r[1]), alone(6, 3, 32, "a fox")), 1);
}

// A runner whose batch_add refuses one prompt (as an engine error after queueing would).
class RefusingRunner : public BatchRunner {
 public:
  explicit RefusingRunner(Engine* e) : inner_(e) {}
  Result<uint64_t> batch_add(const GenerateRequest& req, const GenerateHooks& hooks) override {
    if (req.prompts[0] == "refuse me") return DeviceError("simulated: out of device memory");
    return inner_.batch_add(req, hooks);
  }
  std::vector<BatchOutcome> batch_step() override { return inner_.batch_step(); }
  int batch_active() const override { return inner_.batch_active(); }

 private:
  EngineBatchRunner inner_;
};

TEST(ServeBatching, AJobTheEngineRefusesFailsAlone) {
  Metrics metrics;
  RefusingRunner runner(shared_engine());
  Scheduler scheduler(16, &metrics);
  ParseLimits limits;
  limits.request.size_multiple = 16;
  auto spec_of = [&](const std::string& prompt) {
    auto s = parse_openai(body(9, 2, 32, prompt), limits, 1);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return *s;
  };
  auto bad = std::make_shared<Job>("bad", spec_of("refuse me"));
  auto good = std::make_shared<Job>("good", spec_of("fine"));
  ASSERT_EQ(scheduler.submit(bad), Admission::kAccepted);
  ASSERT_EQ(scheduler.submit(good), Admission::kAccepted);
  scheduler.start(std::make_unique<BatchingExecutor>(&runner, &metrics, 8));
  ASSERT_TRUE(bad->wait_final(std::chrono::seconds(60)));
  ASSERT_TRUE(good->wait_final(std::chrono::seconds(60)));
  EXPECT_EQ(bad->snapshot().state, JobState::kFailed);
  EXPECT_NE(bad->snapshot().error.message.find("out of device memory"), std::string::npos);
  EXPECT_EQ(good->snapshot().state, JobState::kSucceeded);
  scheduler.shutdown("test over");
}

}  // namespace
}  // namespace zimage::serve::test

namespace zimage::serve::test {
namespace {

// /metrics shows the engine's device memory when there is any (the CPU engine has none).
TEST(ServeMetrics, DeviceMemoryGauges) {
  const std::string text = device_memory_metrics({1024, 4096, 2048});
  EXPECT_NE(text.find("# TYPE zimage_gpu_memory_bytes gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("zimage_gpu_memory_bytes{kind=\"in_use\"} 1024\n"), std::string::npos);
  EXPECT_NE(text.find("zimage_gpu_memory_bytes{kind=\"reserved\"} 4096\n"), std::string::npos);
  EXPECT_NE(text.find("zimage_gpu_memory_bytes{kind=\"peak_in_use\"} 2048\n"), std::string::npos);
  TestServer server;
  EXPECT_EQ(shared_engine()->memory().reserved_bytes, 0u);
  EXPECT_EQ(get(server.port(), "/metrics").body.find("zimage_gpu_memory_bytes"), std::string::npos);
}

}  // namespace
}  // namespace zimage::serve::test
