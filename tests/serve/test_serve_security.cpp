// Exposure rules: with --api-key every route but /healthz (and the static page) needs
// "Authorization: Bearer KEY"; the key and the prompt never reach the access log; CORS is off (no
// Access-Control-Allow-Origin, cross-origin requests refused); a foreign Host header is refused
// (DNS rebinding); served images and JSON carry X-Content-Type-Options: nosniff.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "serve/http_util.h"
#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

const char* kKey = "k3y-for-tests-0123456789";

TEST(ServeSecurity, ApiKeyGuardsEveryRouteButHealthz) {
  ServeOptions o = TestServer::defaults();
  o.api_key = kKey;
  TestServer server(o);
  const int port = server.port();
  const std::string hex(32, 'b');
  struct Route {
    const char* method;
    std::string path;
  };
  const std::vector<Route> routes = {{"GET", "/readyz"},
                                     {"GET", "/metrics"},
                                     {"GET", "/v1/models"},
                                     {"POST", "/v1/images/generations"},
                                     {"POST", "/v1/jobs"},
                                     {"GET", "/v1/jobs/" + hex},
                                     {"DELETE", "/v1/jobs/" + hex},
                                     {"GET", "/v1/jobs/" + hex + "/events"},
                                     {"GET", "/v1/jobs/" + hex + "/images/0"},
                                     {"POST", "/sdapi/v1/txt2img"},
                                     {"GET", "/sdapi/v1/progress"},
                                     {"GET", "/nonexistent"}};
  const std::vector<httplib::Headers> wrong = {
      {},
      {{"Authorization", "Bearer wrong"}},
      {{"Authorization", kKey}},
      {{"Authorization", std::string("Bearer ") + kKey + "x"}},
      {{"Authorization", std::string("Bearer ") + std::string(kKey).substr(1)}},
      {{"Authorization", std::string("Basic ") + kKey}}};
  const httplib::Headers right = {{"Authorization", std::string("Bearer ") + kKey}};
  for (const Route& r : routes) {
    SCOPED_TRACE(std::string(r.method) + " " + r.path);
    auto call = [&](const httplib::Headers& h) {
      const std::string m = r.method;
      return m == "GET"    ? get(port, r.path, h)
             : m == "POST" ? post(port, r.path, R"({"prompt": 1})", h)
                           : del(port, r.path, h);
    };
    for (const auto& h : wrong) {
      Reply rep = call(h);
      EXPECT_EQ(rep.status, 401);
      EXPECT_EQ(rep.json()["error"]["type"], "authentication_error");
      EXPECT_EQ(rep.headers.find("WWW-Authenticate")->second, "Bearer");
    }
    EXPECT_NE(call(right).status, 401);
  }
  EXPECT_EQ(get(port, "/healthz").status, 200);
  EXPECT_EQ(get(port, "/").status, 200);  // the static page; its API calls need the key
  Reply gen = post(port, "/v1/images/generations", R"({"prompt": "authorised"})", right);
  EXPECT_EQ(gen.status, 200);
}

TEST(ServeSecurity, AccessLogHasRequestsButNeverTheKeyOrPrompt) {
  ServeOptions o = TestServer::defaults();
  o.api_key = kKey;
  o.access_log = true;
  TestServer server(o);
  const httplib::Headers right = {{"Authorization", std::string("Bearer ") + kKey}};
  testing::internal::CaptureStderr();
  post(server.port(), "/v1/images/generations", R"({"prompt": "TOP-SECRET-PROMPT"})", right);
  post(server.port(), "/v1/jobs", R"({"prompt": "TOP-SECRET-PROMPT"})",
       {{"Authorization", "Bearer wrong-key-attempt"}});
  get(server.port(), "/metrics?token=QUERY-SECRET", right);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the log line follows the reply
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(
      log.find(
          R"("remote":"127.0.0.1","method":"POST","path":"/v1/images/generations","status":200,"ms":)"),
      std::string::npos)
      << log;
  EXPECT_NE(log.find(R"("status":401)"), std::string::npos) << log;
  EXPECT_NE(log.find(R"("ms":)"), std::string::npos) << log;
  for (const char* secret : {kKey, "TOP-SECRET-PROMPT", "wrong-key-attempt", "QUERY-SECRET"})
    EXPECT_EQ(log.find(secret), std::string::npos) << secret << " leaked:\n" << log;
}

TEST(ServeSecurity, CorsOffCrossOriginRefusedNosniff) {
  TestServer server;
  const int port = server.port();
  Reply r = post(port, "/v1/images/generations", R"({"prompt": "cors", "response_format": "url"})");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.count("Access-Control-Allow-Origin"), 0u);
  EXPECT_EQ(r.headers.find("X-Content-Type-Options")->second, "nosniff");
  const std::string url = r.json()["data"][0]["url"];
  Reply img = get(port, url.substr(url.find("/v1/")));
  EXPECT_EQ(img.status, 200);
  EXPECT_EQ(img.headers.find("X-Content-Type-Options")->second, "nosniff");
  EXPECT_EQ(img.headers.count("Access-Control-Allow-Origin"), 0u);
  // A cross-site form POST or fetch: refused, whatever its content type.
  Reply cross =
      post(port, "/v1/jobs", R"({"prompt": "csrf"})", {{"Origin", "http://evil.example"}});
  EXPECT_EQ(cross.status, 403);
  EXPECT_EQ(cross.json()["error"]["param"], "Origin");
  EXPECT_EQ(cross.headers.count("Access-Control-Allow-Origin"), 0u);
  // A same-origin page (the web page itself) is fine.
  Reply same = post(port, "/v1/jobs", R"({"prompt": "same"})",
                    {{"Origin", "http://127.0.0.1:" + std::to_string(port)}});
  EXPECT_EQ(same.status, 202);
  // Preflight: no CORS headers.
  httplib::Client c("127.0.0.1", port);
  auto pre = c.Options(
      "/v1/jobs", {{"Origin", "http://evil.example"}, {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->headers.count("Access-Control-Allow-Origin"), 0u);
  // DNS rebinding: a foreign Host name is refused on a loopback server.
  Reply rebinding = get(port, "/v1/models", {{"Host", "evil.example:80"}});
  EXPECT_EQ(rebinding.status, 403);
  EXPECT_EQ(rebinding.json()["error"]["param"], "Host");
}

TEST(ServeSecurity, ConstantTimeCompare) {
  EXPECT_TRUE(constant_time_equal("Bearer abc", "Bearer abc"));
  EXPECT_FALSE(constant_time_equal("Bearer abc", "Bearer abd"));
  EXPECT_FALSE(constant_time_equal("Bearer ab", "Bearer abc"));
  EXPECT_FALSE(constant_time_equal("", "Bearer abc"));
}

}  // namespace
}  // namespace zimage::serve::test
