// Helpers for the server tests (see serve_test_util.h).
#include "serve/serve_test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/npy.h"
#include "serve/image_encode.h"

namespace zimage::serve::test {

namespace {
// A client that hangs up mid-response must not kill the test process (the server writes to it).
const bool kIgnoreSigpipe = [] {
  std::signal(SIGPIPE, SIG_IGN);
  return true;
}();
}  // namespace

std::string tiny_model_dir() {
  return zimage::test::golden_dir("v_turbo") + "/model";
}

Engine* shared_engine() {
  static std::once_flag once;
  static Engine* engine = nullptr;
  std::call_once(once, [] {
    (void)kIgnoreSigpipe;
    EngineOptions o;
    o.model_dir = tiny_model_dir();
    o.device = "cpu";
    o.threads = 2;
    auto e = Engine::load(o);
    if (!e.ok()) {
      std::fprintf(stderr, "cannot load the tiny model: %s\n", e.status().to_string().c_str());
      std::abort();
    }
    engine = std::move(e).value().release();  // lives until exit
  });
  return engine;
}

ServeOptions TestServer::defaults() {
  ServeOptions o;
  o.port = 0;
  o.access_log = false;
  o.default_width = 64;
  o.default_height = 64;
  o.default_steps = 2;
  return o;
}

namespace {
// With ZIMAGE_SERVE_FAKE_ENGINE=1 the worker runs this instead of the model (validation still
// uses the real engine): every step reports progress and honours cancel, pixels follow the seed.
// It keeps the server's own concurrency testable under ThreadSanitizer, where the real CPU
// backend is too slow and OpenBLAS (uninstrumented) drowns the report in false positives.
class FakeEngine : public EngineRunner {
 public:
  Result<GenerateResult> generate(const GenerateRequest& req, const GenerateHooks& hooks) override {
    GenerateResult r;
    for (int step = 1; step <= req.steps; ++step) {
      if (hooks.cancel != nullptr && hooks.cancel->load()) return Cancelled("cancelled");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (hooks.on_progress) hooks.on_progress(Progress{Phase::kDenoise, step, req.steps, 0.0});
    }
    const size_t n = req.prompts.size() * static_cast<size_t>(req.images_per_prompt);
    for (size_t i = 0; i < n; ++i) {
      Image im;
      im.width = req.width;
      im.height = req.height;
      im.rgb.resize(static_cast<size_t>(req.width) * req.height * 3);
      for (size_t k = 0; k < im.rgb.size(); ++k)
        im.rgb[k] = static_cast<uint8_t>((req.seed * 31 + i * 7 + k) & 0xFF);
      r.images.push_back(std::move(im));
    }
    r.timings.dit_s.assign(static_cast<size_t>(req.steps), 0.002);
    r.seed = req.seed;
    r.device = "fake";
    return r;
  }
};

EngineRunner* default_runner() {
  static FakeEngine fake;
  const char* env = std::getenv("ZIMAGE_SERVE_FAKE_ENGINE");
  return env != nullptr && std::string(env) == "1" ? &fake : nullptr;
}
}  // namespace

TestServer::TestServer(ServeOptions options, EngineRunner* runner)
    : server_(std::make_unique<Server>(std::move(options))) {
  if (runner == nullptr) runner = default_runner();
  const Status st = server_->start();
  EXPECT_TRUE(st.ok()) << st.to_string();
  const Status at = server_->attach(shared_engine(), runner, /*warm_up=*/false);
  EXPECT_TRUE(at.ok()) << at.to_string();
}

TestServer::~TestServer() {
  server_->shutdown();
}

httplib::Client TestServer::client(int timeout_s) const {
  httplib::Client c("127.0.0.1", port());
  c.set_read_timeout(timeout_s, 0);
  c.set_connection_timeout(5, 0);
  return c;
}

nlohmann::json Reply::json() const {
  return nlohmann::json::parse(body, nullptr, false);
}

namespace {
Reply to_reply(const httplib::Result& r) {
  Reply out;
  if (!r) return out;
  out.status = r->status;
  out.body = r->body;
  out.headers = r->headers;
  return out;
}
httplib::Client make_client(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  c.set_connection_timeout(5, 0);
  return c;
}
}  // namespace

Reply post(int port, const std::string& path, const std::string& body,
           const httplib::Headers& headers) {
  httplib::Client c = make_client(port);
  return to_reply(c.Post(path, headers, body, "application/json"));
}

Reply get(int port, const std::string& path, const httplib::Headers& headers) {
  httplib::Client c = make_client(port);
  return to_reply(c.Get(path, headers));
}

Reply del(int port, const std::string& path, const httplib::Headers& headers) {
  httplib::Client c = make_client(port);
  return to_reply(c.Delete(path, headers));
}

std::vector<uint8_t> base64_decode(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = val(c);
    if (v < 0) continue;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

Reply post_form(int port, const std::string& path, const httplib::MultipartFormDataItems& items) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  Reply r;
  auto res = c.Post(path.c_str(), items);
  if (!res) return r;
  r.status = res->status;
  r.body = res->body;
  r.headers = res->headers;
  return r;
}

Image pattern_image(int w, int h, int salt) {
  Image im;
  im.width = w;
  im.height = h;
  im.rgb.resize(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < im.rgb.size(); ++i)
    im.rgb[i] = static_cast<uint8_t>((i / 3 % w + i / 3 / w * 2 + i % 3 * 40 + salt) & 0xFF);
  return im;
}

std::string png_bytes(const Image& im) {
  auto png = png_encode(im);
  EXPECT_TRUE(png.ok());
  return png.ok() ? std::string(png->begin(), png->end()) : std::string();
}

Result<Image> png_decode(const std::vector<uint8_t>& bytes, PngTextChunks* text) {
  char path[] = "/tmp/zimage_serve_png_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return IoError("mkstemp");
  close(fd);
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }
  Result<Image> img = png_load(path, text);
  std::remove(path);
  return img;
}

std::vector<Event> read_events(int port, const std::string& id, const std::string& query,
                               const std::function<bool(const Event&)>& stop) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  std::vector<Event> events;
  std::string buf;
  bool over = false;
  c.Get("/v1/jobs/" + id + "/events" + query, [&](const char* data, size_t n) {
    buf.append(data, n);
    size_t end;
    while (!over && (end = buf.find("\n\n")) != std::string::npos) {
      const std::string block = buf.substr(0, end);
      buf.erase(0, end + 2);
      Event e;
      for (size_t pos = 0; pos < block.size();) {
        size_t nl = block.find('\n', pos);
        if (nl == std::string::npos) nl = block.size();
        const std::string line = block.substr(pos, nl - pos);
        if (line.rfind("event: ", 0) == 0) e.name = line.substr(7);
        if (line.rfind("data: ", 0) == 0)
          e.data = nlohmann::json::parse(line.substr(6), nullptr, false);
        pos = nl + 1;
      }
      if (e.name.empty()) continue;
      events.push_back(e);
      over = stop && stop(e);
    }
    return !over;
  });
  return events;
}

std::string submit(int port, const std::string& body) {
  Reply r = post(port, "/v1/jobs", body);
  EXPECT_EQ(r.status, 202) << r.body;
  return r.json().value("id", "");
}

}  // namespace zimage::serve::test
