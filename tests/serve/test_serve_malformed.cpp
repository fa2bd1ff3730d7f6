// Malformed and hostile requests against a live in-process server (table-driven): broken JSON,
// wrong types, missing fields, out-of-range numbers, NaN/Infinity stand-ins, invalid UTF-8, huge
// bodies and prompts, unknown and path-like job ids. Each must get the expected 4xx with a JSON
// error naming the field, and the server must keep serving (checked after every case and by a
// real generation at the end).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

struct Case {
  const char* method;
  std::string path;
  std::string body;
  int status;
  const char* param;  // expected error.param; "" = null
};

std::string nested(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

std::vector<Case> cases() {
  const std::string g = "/v1/images/generations";
  const std::string j = "/v1/jobs";
  const std::string a = "/sdapi/v1/txt2img";
  const std::string hex(32, 'a');
  std::vector<Case> c = {
      // JSON syntax and shape
      {"POST", g, R"({"prompt": "a")", 400, "body"},
      {"POST", g, "not json", 400, "body"},
      {"POST", g, "", 400, "body"},
      {"POST", g, "[]", 400, "body"},
      {"POST", g, R"("a fox")", 400, "body"},
      {"POST", g, "null", 400, "body"},
      {"POST", g, R"({"prompt": "a"} {"prompt": "b"})", 400, "body"},
      {"POST", g, R"({"prompt": "a", "prompt": "b"})", 400, "body"},
      {"POST", g, nested(10000), 400, "body"},
      {"POST", g, R"({"prompt": NaN})", 400, "prompt"},
      {"POST", g, R"({"prompt": "a", "guidance_scale": Infinity})", 400, "guidance_scale"},
      // prompt
      {"POST", g, "{}", 400, "prompt"},
      {"POST", g, R"({"prompt": 5})", 400, "prompt"},
      {"POST", g, R"({"prompt": ""})", 400, "prompt"},
      {"POST", g, R"({"prompt": null})", 400, "prompt"},
      {"POST", g, R"({"prompt": ["a", "b"]})", 400, "prompt"},
      {"POST", g, R"({"prompt": "a\u0000b"})", 400, "prompt"},
      {"POST", g, "{\"prompt\": \"a: \xff\xfe\"}", 400, "prompt"},  // invalid UTF-8
      {"POST", j, "{\"prompt\": \"a\", \"negative_prompt\": \"\xed\xa0\x80\"}", 400,
       "negative_prompt"},                                       // encoded surrogate
      {"POST", g, "{\"pr\xffompt\": \"a\"}", 400, "body"},       // invalid UTF-8 in a key
      {"POST", g, "{\"prompt\": \"\xc0\xaf\"}", 400, "prompt"},  // overlong encoding
      {"POST", g, R"({"prompt": "\ud800"})", 400, "prompt"},     // lone surrogate
      {"POST", g, "{\"prompt\": \"" + std::string(100000, 'x') + "\"}", 400, "prompt"},
      {"POST", j, R"({"prompt": "a", "negative_prompt": 7})", 400, "negative_prompt"},
      // n
      {"POST", g, R"({"prompt": "a", "n": 0})", 400, "n"},
      {"POST", g, R"({"prompt": "a", "n": 1000})", 400, "n"},
      {"POST", g, R"({"prompt": "a", "n": -1})", 400, "n"},
      {"POST", g, R"({"prompt": "a", "n": "2"})", 400, "n"},
      {"POST", g, R"({"prompt": "a", "n": 1.5})", 400, "n"},
      // size
      {"POST", g, R"({"prompt": "a", "size": "63x64"})", 400, "size"},
      {"POST", g, R"({"prompt": "a", "size": "64x1001"})", 400, "size"},
      {"POST", g, R"({"prompt": "a", "size": "100000x64"})", 400, "size"},
      {"POST", g, R"({"prompt": "a", "size": "8192x8192"})", 400, "size"},
      {"POST", g, R"({"prompt": "a", "size": "0x64"})", 400, "size"},
      {"POST", g, R"({"prompt": "a", "size": "-64x64"})", 400, "size"},
      {"POST", g, R"({"prompt": "a", "size": "big"})", 400, "size"},
      {"POST", g, R"({"prompt": "a", "size": 64})", 400, "size"},
      // steps
      {"POST", j, R"({"prompt": "a", "num_inference_steps": -1})", 400, "num_inference_steps"},
      {"POST", j, R"({"prompt": "a", "num_inference_steps": 0})", 400, "num_inference_steps"},
      {"POST", j, R"({"prompt": "a", "num_inference_steps": 1001})", 400, "num_inference_steps"},
      {"POST", j, R"({"prompt": "a", "num_inference_steps": "eight"})", 400, "num_inference_steps"},
      {"POST", j, R"({"prompt": "a", "num_inference_steps": 1e400})", 400, "num_inference_steps"},
      {"POST", j, R"({"prompt": "a", "num_inference_steps": 2.5})", 400, "num_inference_steps"},
      // guidance
      {"POST", j, R"({"prompt": "a", "guidance_scale": "NaN"})", 400, "guidance_scale"},
      {"POST", j, R"({"prompt": "a", "guidance_scale": "Infinity"})", 400, "guidance_scale"},
      {"POST", j, R"({"prompt": "a", "guidance_scale": 1e400})", 400, "guidance_scale"},
      {"POST", j, R"({"prompt": "a", "guidance_scale": -1e400})", 400, "guidance_scale"},
      {"POST", j, R"({"prompt": "a", "guidance_scale": -1})", 400, "guidance_scale"},
      {"POST", j, R"({"prompt": "a", "guidance_scale": true})", 400, "guidance_scale"},
      // seed
      {"POST", j, R"({"prompt": "a", "seed": -2})", 400, "seed"},
      {"POST", j, R"({"prompt": "a", "seed": 18446744073709551616})", 400, "seed"},
      {"POST", j, R"({"prompt": "a", "seed": 1e30})", 400, "seed"},
      {"POST", j, R"({"prompt": "a", "seed": 1.5})", 400, "seed"},
      {"POST", j, R"({"prompt": "a", "seed": "42"})", 400, "seed"},
      // formats and unknown fields
      {"POST", g, R"({"prompt": "a", "response_format": "xml"})", 400, "response_format"},
      {"POST", g, R"({"prompt": "a", "output_format": "gif"})", 400, "output_format"},
      {"POST", g, R"({"prompt": "a", "output_compression": 101})", 400, "output_compression"},
      {"POST", g, R"({"prompt": "a", "steps": 4})", 400, "steps"},
      {"POST", g, R"({"prompt": "a", "model": 3})", 400, "model"},
      // Automatic1111
      {"POST", a, R"({"width": 64})", 400, "prompt"},
      {"POST", a, R"({"prompt": "a", "width": 63})", 400, "width"},
      {"POST", a, R"({"prompt": "a", "height": 0})", 400, "height"},
      {"POST", a, R"({"prompt": "a", "steps": -5})", 400, "steps"},
      {"POST", a, R"({"prompt": "a", "cfg_scale": "x"})", 400, "cfg_scale"},
      {"POST", a, R"({"prompt": "a", "seed": -7})", 400, "seed"},
      {"POST", a, R"({"prompt": "a", "batch_size": 100})", 400, "batch_size"},
      {"POST", a, R"({"prompt": "a", "n_iter": 0})", 400, "n_iter"},
      {"POST", a, R"({"prompt": "a", "batch_size": 8, "n_iter": 8})", 400, "n_iter"},
      // job ids
      {"GET", "/v1/jobs/unknown", "", 400, "id"},
      {"GET", "/v1/jobs/" + hex, "", 404, "id"},
      {"DELETE", "/v1/jobs/" + hex, "", 404, "id"},
      {"GET", "/v1/jobs/" + hex + "/events", "", 404, "id"},
      {"GET", "/v1/jobs/" + hex + "/images/0", "", 404, "id"},
      {"GET", "/v1/jobs/%2e%2e", "", 400, "id"},
      {"GET", "/v1/jobs/..", "", 400, "id"},
      {"GET", "/v1/jobs/%2e%2e%2f%2e%2e%2fetc%2fpasswd", "", 404, ""},
      {"GET", "/v1/jobs/../../etc/passwd", "", 404, ""},
      {"GET", "/v1/jobs/..%5c..%5cwindows", "", 400, "id"},
      {"DELETE", "/v1/jobs/%00", "", 400, "id"},
      // routes
      {"GET", "/nope", "", 404, ""},
      {"POST", "/v1/models", "{}", 404, ""},
  };
  return c;
}

TEST(ServeMalformed, EveryBadRequestGetsAClear4xxAndTheServerKeepsServing) {
  TestServer server;
  const int port = server.port();
  const std::vector<Case> all = cases();
  ASSERT_GE(all.size(), 40u);
  for (const Case& c : all) {
    SCOPED_TRACE(std::string(c.method) + " " + c.path + " " + c.body.substr(0, 80));
    Reply r = std::string(c.method) == "POST"  ? post(port, c.path, c.body)
              : std::string(c.method) == "GET" ? get(port, c.path)
                                               : del(port, c.path);
    EXPECT_EQ(r.status, c.status) << r.body.substr(0, 300);
    const nlohmann::json j = r.json();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body.substr(0, 300);
    const nlohmann::json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
    EXPECT_TRUE(e["type"].is_string());
    if (c.param[0] == '\0') {
      EXPECT_TRUE(e["param"].is_null()) << e.dump();
    } else {
      EXPECT_EQ(e["param"], c.param) << e.dump();
      // The message names the field too.
      EXPECT_NE(e["message"].get<std::string>().find(c.param), std::string::npos) << e.dump();
    }
    EXPECT_EQ(get(port, "/healthz").status, 200);
  }
  std::printf("[ServeMalformed] %zu malformed requests tried\n", all.size());
  // Nothing was queued by the bad requests, and a good one still works.
  Reply ok = post(port, "/v1/images/generations", R"({"prompt": "still alive", "seed": 1})");
  EXPECT_EQ(ok.status, 200) << ok.body.substr(0, 300);
  EXPECT_EQ(server.server().context().metrics.jobs_succeeded.load(), 1u);
}

TEST(ServeMalformed, TenMegabyteBodyIs413) {
  TestServer server;
  const std::string body = "{\"prompt\": \"" + std::string(10 << 20, 'x') + "\"}";
  Reply r = post(server.port(), "/v1/images/generations", body);
  EXPECT_EQ(r.status, 413);
  const nlohmann::json j = r.json();
  ASSERT_TRUE(j.is_object()) << r.body.substr(0, 200);
  EXPECT_EQ(j["error"]["param"], "body");
  EXPECT_EQ(get(server.port(), "/healthz").status, 200);
}

}  // namespace
}  // namespace zimage::serve::test
