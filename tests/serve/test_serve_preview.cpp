// Live previews through the server: a job that asks ("preview": true) gets `preview` events
// (decodable PNGs at latent resolution) before `done`; a job that does not ask costs no preview
// (zimage_previews_total stays put) and gets none; events?preview=1 turns them on for a running
// job; A1111's /sdapi/v1/progress returns a decodable current_image while a txt2img request runs.
// Also the edits form on /v1/jobs (the web page's image-to-image) and /v1/queue.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "serve/image_encode.h"
#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

using nlohmann::json;

uint64_t previews_metric(int port) {
  const std::string m = get(port, "/metrics").body;
  const std::string key = "\nzimage_previews_total ";
  const size_t at = m.find(key);
  return at == std::string::npos ? ~uint64_t{0} : std::stoull(m.substr(at + key.size()));
}

// A preview event's image: a PNG of the latent size (64x64 images, VAE factor 2: 32x32).
void expect_preview_png(const json& data) {
  EXPECT_EQ(data["content_type"], "image/png");
  auto img = png_decode(base64_decode(data["image"].get<std::string>()), nullptr);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  EXPECT_EQ(img->width, 32);
  EXPECT_EQ(img->height, 32);
}

class ServePreview : public ::testing::Test {
 protected:
  void SetUp() override { server_ = std::make_unique<TestServer>(); }
  int port() const { return server_->port(); }
  std::unique_ptr<TestServer> server_;
};

TEST_F(ServePreview, JobThatAsksGetsPreviewEventsBeforeDone) {
  const uint64_t before = previews_metric(port());
  const std::string id =
      submit(port(), R"({"prompt": "previews", "num_inference_steps": 4, "preview": true})");
  const std::vector<Event> ev = read_events(port(), id);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().name, "done");
  int previews = 0, last_step = 0;
  for (const Event& e : ev) {
    if (e.name != "preview") continue;
    ++previews;
    EXPECT_GT(e.data["step"].get<int>(), last_step);  // newer each time
    last_step = e.data["step"];
    EXPECT_EQ(e.data["total"], 4);
    expect_preview_png(e.data);
  }
  EXPECT_GE(previews, 1);
  EXPECT_EQ(previews_metric(port()), before + 4);  // one per step, whatever the stream skipped
  EXPECT_TRUE(get(port(), "/v1/jobs/" + id).json()["previews"].get<bool>());
}

TEST_F(ServePreview, NoPreviewWorkWithoutOptIn) {
  const uint64_t before = previews_metric(port());
  ASSERT_NE(before, ~uint64_t{0});
  const std::string id = submit(port(), R"({"prompt": "no previews", "num_inference_steps": 4})");
  for (const Event& e : read_events(port(), id)) EXPECT_NE(e.name, "preview");
  ASSERT_EQ(post(port(), "/sdapi/v1/txt2img", R"({"prompt": "a", "steps": 3})").status, 200);
  EXPECT_EQ(previews_metric(port()), before);
  EXPECT_FALSE(get(port(), "/v1/jobs/" + id).json()["previews"].get<bool>());
  Reply bad = post(port(), "/v1/jobs", R"({"prompt": "x", "preview": "yes"})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.json()["error"]["param"], "preview") << bad.body;
}

TEST_F(ServePreview, WatcherTurnsPreviewsOnForARunningJob) {
  const std::string id = submit(port(), R"({"prompt": "late", "num_inference_steps": 1000})");
  const std::vector<Event> ev =
      read_events(port(), id, "?preview=1", [](const Event& e) { return e.name == "preview"; });
  del(port(), "/v1/jobs/" + id);
  ASSERT_FALSE(ev.empty());
  ASSERT_EQ(ev.back().name, "preview");
  expect_preview_png(ev.back().data);
}

TEST_F(ServePreview, A1111ProgressHasCurrentImageWhileRunning) {
  EXPECT_TRUE(get(port(), "/sdapi/v1/progress").json()["current_image"].is_null());  // idle
  Reply result;
  std::thread request(
      [&] { result = post(port(), "/sdapi/v1/txt2img", R"({"prompt": "a1111", "steps": 1000})"); });
  json p;
  for (int i = 0; i < 2400; ++i) {
    p = get(port(), "/sdapi/v1/progress").json();
    if (!p["current_image"].is_null()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_TRUE(p["current_image"].is_string()) << p.dump();
  auto img = png_decode(base64_decode(p["current_image"].get<std::string>()), nullptr);
  EXPECT_TRUE(img.ok()) << img.status().to_string();
  if (img.ok()) {
    EXPECT_EQ(img->width, 32);
  }
  EXPECT_GT(p["state"]["sampling_step"].get<int>(), 0);
  // A client that skips the image gets none.
  EXPECT_TRUE(
      get(port(), "/sdapi/v1/progress?skip_current_image=true").json()["current_image"].is_null());
  // The queue view lists the running job by a short reference.
  const json q = get(port(), "/v1/queue").json();
  ASSERT_EQ(q["running"].size(), 1u) << q.dump();
  EXPECT_EQ(q["running"][0]["ref"], p["state"]["job"].get<std::string>().substr(0, 8));
  EXPECT_EQ(q["running"][0]["total"], 1000);
  del(port(), "/v1/jobs/" + p["state"]["job"].get<std::string>());
  request.join();
  EXPECT_NE(result.status, 200);  // cancelled
}

TEST_F(ServePreview, JobsTakeTheEditsFormWithPreviews) {
  const std::string image = png_bytes(pattern_image(64, 64, 3));
  httplib::MultipartFormDataItems form = {{"image", image, "image.png", "image/png"},
                                          {"prompt", "an edit as a job", "", ""},
                                          {"num_inference_steps", "4", "", ""},
                                          {"strength", "0.5", "", ""},
                                          {"preview", "true", "", ""},
                                          {"response_format", "url", "", ""}};
  Reply r = post_form(port(), "/v1/jobs", form);
  ASSERT_EQ(r.status, 202) << r.body;
  const std::string id = r.json()["id"];
  const std::vector<Event> ev = read_events(port(), id);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().name, "done") << ev.back().data.dump();
  const json j = get(port(), "/v1/jobs/" + id).json();
  EXPECT_EQ(j["parameters"]["mode"], "img2img");
  EXPECT_EQ(j["parameters"]["denoising_steps"], 2);
  // JSON bodies of /v1/jobs keep the JSON limit although the route takes image bodies.
  const std::string big = R"({"prompt": ")" + std::string(2 << 20, 'a') + R"("})";
  EXPECT_EQ(post(port(), "/v1/jobs", big).status, 413);
}

}  // namespace
}  // namespace zimage::serve::test
