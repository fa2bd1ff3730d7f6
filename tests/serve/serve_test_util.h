// Shared pieces of the server tests: one tiny engine per test binary (the golden v_turbo model),
// an in-process zimage serve on a free loopback port, and small HTTP helpers. Every connection
// goes to 127.0.0.1 only.
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/server.h"
#include "zimage/zimage.h"

namespace zimage::serve::test {

// The tiny model folder (random weights, diffusers layout, real tokenizer).
std::string tiny_model_dir();
// The engine shared by all in-process servers of this binary (loaded on first use, CPU).
Engine* shared_engine();

// A server on 127.0.0.1:<free port> using shared_engine(); `runner` may wrap the engine.
class TestServer {
 public:
  explicit TestServer(ServeOptions options = defaults(), EngineRunner* runner = nullptr);
  ~TestServer();
  static ServeOptions defaults();  // port 0, no access log, 64x64 default size, 2 steps

  int port() const { return server_->port(); }
  Server& server() { return *server_; }
  httplib::Client client(int timeout_s = 30) const;

 private:
  std::unique_ptr<Server> server_;
};

// POSTs JSON text; returns the response (status -1 when the connection failed).
struct Reply {
  int status = -1;
  std::string body;
  httplib::Headers headers;
  nlohmann::json json() const;  // null when the body is not JSON
};
Reply post(int port, const std::string& path, const std::string& body,
           const httplib::Headers& headers = {});
Reply get(int port, const std::string& path, const httplib::Headers& headers = {});
Reply del(int port, const std::string& path, const httplib::Headers& headers = {});

// POSTs a multipart/form-data body (the edits route); status -1 when the connection failed.
Reply post_form(int port, const std::string& path, const httplib::MultipartFormDataItems& items);
// A w x h image with a deterministic pattern (`salt` shifts it), and it as PNG bytes.
Image pattern_image(int w, int h, int salt);
std::string png_bytes(const Image& im);

// One Server-Sent Event of a job's stream.
struct Event {
  std::string name;
  nlohmann::json data;
};
// Reads GET /v1/jobs/{id}/events`query` until the stream ends or `stop` (when set) says so after
// an event, parsing "event:"/"data:" blocks.
std::vector<Event> read_events(int port, const std::string& id, const std::string& query = "",
                               const std::function<bool(const Event&)>& stop = nullptr);
// POSTs a job (JSON body) to /v1/jobs, expects 202 and returns its id ("" otherwise).
std::string submit(int port, const std::string& body);

// Decodes base64 (for b64_json responses).
std::vector<uint8_t> base64_decode(const std::string& s);
// Reads a PNG from memory (pixels and text chunks) by writing it to a temporary file.
Result<Image> png_decode(const std::vector<uint8_t>& bytes, PngTextChunks* text);

}  // namespace zimage::serve::test
