// A hostile client against a live in-process server, at the transport: compressed-body bombs,
// chunked bodies past the limits, multi-range amplification, floods of header fields, slow drips
// (slowloris) against health probes, shutdown while a client drips, DNS rebinding through a Host
// that only begins like a loopback address, and the framing a proxy may read differently (a space
// before a colon, two Content-Lengths, two Hosts). Each case is one the cpp-httplib transport
// failed; every loop here is bounded in bytes and seconds.
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "serve/http_util.h"
#include "serve/raw_http.h"
#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// gzip of `n` zero bytes (deflate shrinks zeros about 1000-fold).
std::string gzip_zeros(size_t n) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY), Z_OK);
  std::string zeros(1 << 20, '\0'), out;
  std::vector<unsigned char> buf(1 << 16);
  size_t left = n;
  int flush = Z_NO_FLUSH;
  while (flush != Z_FINISH) {
    const size_t take = std::min(left, zeros.size());
    left -= take;
    flush = left == 0 ? Z_FINISH : Z_NO_FLUSH;
    z.next_in = reinterpret_cast<Bytef*>(zeros.data());
    z.avail_in = static_cast<uInt>(take);
    do {
      z.next_out = buf.data();
      z.avail_out = static_cast<uInt>(buf.size());
      deflate(&z, flush);
      out.append(reinterpret_cast<char*>(buf.data()), buf.size() - z.avail_out);
    } while (z.avail_out == 0);
  }
  deflateEnd(&z);
  return out;
}

std::string chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}

// Sends a chunked body of up to `max_bytes` in 64 KiB chunks, stopping as soon as the server
// answers; returns the response and how much was sent before it.
std::string chunked_until_answer(RawConn& c, size_t max_bytes, size_t* sent) {
  const std::string piece = chunk(std::string(64 * 1024, 'x'));
  *sent = 0;
  while (*sent < max_bytes) {
    if (c.readable(0)) break;
    if (!c.send(piece, 2000)) break;
    *sent += 64 * 1024;
  }
  return c.read_response(5);
}

TEST(ServeHostile, GzipBodyIsRefusedBeforeInflating) {
  TestServer server;
  // 300 KiB of gzip that inflates to 300 MiB, to the unauthenticated page and to a JSON route.
  const std::string bomb = gzip_zeros(size_t{300} << 20);
  ASSERT_LT(bomb.size(), size_t{400} << 10);
  for (const std::string path : {"/", "/v1/jobs", "/v1/images/edits"}) {
    RawConn c(server.port());
    ASSERT_TRUE(c.ok());
    const std::string head = "POST " + path +
                             " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             "Content-Encoding: gzip\r\nContent-Length: " +
                             std::to_string(bomb.size()) + "\r\n\r\n";
    c.send(head);
    c.send(bomb, 2000);
    const std::string r = c.read_response(5);
    EXPECT_EQ(RawConn::status(r), 415) << path << ": " << r.substr(0, 300);
    EXPECT_NE(RawConn::body(r).find("Content-Encoding"), std::string::npos) << r;
  }
  EXPECT_EQ(get(server.port(), "/healthz").status, 200);
}

TEST(ServeHostile, ChunkedBodiesStopAtTheRouteLimit) {
  ServeOptions o = TestServer::defaults();
  o.max_body_bytes = size_t{1} << 20;
  o.max_image_body_bytes = size_t{4} << 20;
  TestServer server(o);
  struct Case {
    std::string path;
    int status;
    size_t limit;  // the answer must come before this much was sent
  };
  // "/" has no POST route: 404 at once, the body never read. The others stop at their limit.
  // The bounds leave 8 MiB for what the loopback socket buffers take in before the client sees
  // the answer; a server that reads the whole body answers only after all 64 MiB.
  const size_t slack = size_t{8} << 20;
  const std::vector<Case> cases = {{"/", 404, slack},
                                   {"/v1/jobs", 413, o.max_body_bytes + slack},
                                   {"/sdapi/v1/txt2img", 413, o.max_body_bytes + slack},
                                   {"/v1/images/edits", 413, o.max_image_body_bytes + slack},
                                   {"/sdapi/v1/img2img", 413, o.max_image_body_bytes + slack}};
  for (const Case& k : cases) {
    RawConn c(server.port());
    ASSERT_TRUE(c.ok());
    c.send("POST " + k.path +
           " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           "Transfer-Encoding: chunked\r\n\r\n");
    size_t sent = 0;
    const std::string r = chunked_until_answer(c, size_t{64} << 20, &sent);
    EXPECT_EQ(RawConn::status(r), k.status) << k.path << ": " << r.substr(0, 300);
    EXPECT_LT(sent, k.limit) << k.path << ": the server read " << sent << " bytes first";
  }
  EXPECT_EQ(get(server.port(), "/healthz").status, 200);
}

TEST(ServeHostile, ContentLengthOverTheLimitIsAnsweredAtOnce) {
  TestServer server;
  for (const bool expect_continue : {false, true}) {
    RawConn c(server.port());
    const auto t0 = Clock::now();
    c.send(std::string("POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                       "application/json\r\nContent-Length: 100000000\r\n") +
           (expect_continue ? "Expect: 100-continue\r\n" : "") + "\r\n");
    const std::string r = c.read_response(5);
    EXPECT_EQ(RawConn::status(r), 413) << r.substr(0, 200);  // never "100 Continue" first
    EXPECT_LT(seconds_since(t0), 1.5);
    EXPECT_NE(RawConn::body(r).find("body: larger than the 1048576-byte limit"), std::string::npos)
        << r;
  }
}

TEST(ServeHostile, MultiRangeRequestsAreNotAmplified) {
  TestServer server;
  std::string ranges = "bytes=0-";
  for (int i = 0; i < 2700; ++i) ranges += ",0-";
  RawConn c(server.port());
  c.send("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nRange: " + ranges + "\r\n\r\n");
  const std::string r = c.read_response(5);
  const Reply plain = get(server.port(), "/");
  ASSERT_EQ(plain.status, 200);
  EXPECT_EQ(RawConn::status(r), 200) << r.substr(0, 300);  // Range is ignored: the page once
  EXPECT_EQ(RawConn::body(r).size(), plain.body.size());
  EXPECT_EQ(r.find("multipart/byteranges"), std::string::npos);
}

TEST(ServeHostile, TooManyOrTooLargeHeadersGet431) {
  TestServer server;
  {  // 200 small fields: past the 100-field limit
    std::string head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    for (int i = 0; i < 200; ++i) head += "X-F" + std::to_string(i) + ": v\r\n";
    RawConn c(server.port());
    c.send(head + "\r\n");
    const std::string r = c.read_response(5);
    EXPECT_EQ(RawConn::status(r), 431) << r.substr(0, 300);
    EXPECT_NE(RawConn::body(r).find("more than 100 header fields"), std::string::npos) << r;
  }
  {  // a flood of a million header lines: answered once 32 KiB are in, the rest never read
    RawConn c(server.port());
    c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    const std::string lines = [] {
      std::string s;
      for (int i = 0; i < 1000; ++i) s += "X-A: b\r\n";
      return s;
    }();
    size_t sent = 0;
    while (sent < size_t{32} << 20 && !c.readable(0) && c.send(lines, 2000)) sent += lines.size();
    const std::string r = c.read_response(5);
    EXPECT_EQ(RawConn::status(r), 431) << r.substr(0, 300);
    EXPECT_LT(sent, size_t{8} << 20);  // socket buffers' slack; the head limit is 32 KiB
  }
  EXPECT_EQ(get(server.port(), "/healthz").status, 200);
}

TEST(ServeHostile, FramingAProxyCouldReadOtherwiseIs400) {
  TestServer server;
  const std::string json = R"({"prompt": "a"})";
  const std::string cl = std::to_string(json.size());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"space before the colon",
       "GET /v1/models HTTP/1.1\r\nHost : evil.example\r\nHost: 127.0.0.1\r\n\r\n"},
      {"two Hosts", "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n"},
      {"no Host", "GET /v1/models HTTP/1.1\r\n\r\n"},
      {"two different Content-Lengths",
       "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
       "Content-Length: " +
           cl + "\r\nContent-Length: 3\r\n\r\n" + json},
      {"two equal Content-Lengths",
       "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
       "Content-Length: " +
           cl + "\r\nContent-Length: " + cl + "\r\n\r\n" + json},
      {"Content-Length and chunked",
       "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
       "Content-Length: " +
           cl + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(json) + "0\r\n\r\n"},
      {"a coding other than chunked",
       "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip, chunked, br\r\n\r\n"},
      {"a 30000-byte path (std::regex recurses per character)",
       "GET /v1/jobs/" + std::string(30000, 'a') + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
      {"an absolute-form target",
       "GET http://evil.example/v1/models HTTP/1.1\r\nHost: "
       "127.0.0.1\r\n\r\n"},
  };
  for (const auto& [what, bytes] : cases) {
    RawConn c(server.port());
    c.send(bytes);
    const std::string r = c.read_response(5);
    const int want = what.rfind("a 30000", 0) == 0 ? 414 : 400;
    EXPECT_EQ(RawConn::status(r), want) << what << ": " << r.substr(0, 300);
  }
  EXPECT_EQ(get(server.port(), "/healthz").status, 200);
}

TEST(ServeHostile, OnlyRealLoopbackNamesPassTheHostCheck) {
  TestServer server;
  const std::string job = R"({"prompt": "a", "num_inference_steps": 1})";
  for (const std::string host :
       {"127.0.0.1.rebind.example", "127.evil.example", "127.0.0.1.", "localhost.evil.example",
        "127.0.0.256", "127.1", "evil.example"}) {
    Reply r = post(server.port(), "/v1/jobs", job, {{"Host", host}, {"Origin", "http://" + host}});
    EXPECT_EQ(r.status, 403) << host << ": " << r.body.substr(0, 200);
  }
  for (const std::string host : {"127.0.0.1", "127.1.2.3", "localhost", "[::1]"}) {
    Reply r =
        get(server.port(), "/v1/models", {{"Host", host + ":" + std::to_string(server.port())}});
    EXPECT_EQ(r.status, 200) << host;
  }
  EXPECT_TRUE(is_loopback_name("127.0.0.1"));
  EXPECT_FALSE(is_loopback_name("127.0.0.1.rebind.example"));
  EXPECT_FALSE(is_loopback_name("0127.0.0.1"));
}

TEST(ServeHostile, BearerSchemeIsCaseInsensitive) {
  ServeOptions o = TestServer::defaults();
  o.api_key = "secret-key-123";
  TestServer server(o);
  for (const std::string scheme : {"Bearer", "bearer", "BEARER", "bEaReR"})
    EXPECT_EQ(
        get(server.port(), "/v1/models", {{"Authorization", scheme + " secret-key-123"}}).status,
        200)
        << scheme;
  EXPECT_EQ(get(server.port(), "/v1/models", {{"Authorization", "Basic secret-key-123"}}).status,
            401);
  EXPECT_EQ(get(server.port(), "/v1/models", {{"Authorization", "bearer secret-key-124"}}).status,
            401);
  EXPECT_EQ(get(server.port(), "/v1/models", {{"Authorization", "bearersecret-key-123"}}).status,
            401);
}

TEST(ServeHostile, SlowClientsCannotStarveHealthProbes) {
  ServeOptions o = TestServer::defaults();
  o.http_threads = 4;
  o.header_timeout_s = 3;
  TestServer server(o);
  // Three times as many drippers as handler threads, each sending a byte of its head every
  // 300 ms (a thread-per-connection server gives each one a thread until its read times out).
  std::vector<std::unique_ptr<RawConn>> drippers;
  for (int i = 0; i < 12; ++i) {
    drippers.push_back(std::make_unique<RawConn>(server.port()));
    drippers.back()->send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
  }
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    while (!stop.load()) {
      for (auto& d : drippers) d->send("a", 100);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    httplib::Client c("127.0.0.1", server.port());
    c.set_connection_timeout(2, 0);
    c.set_read_timeout(2, 0);
    auto r = c.Get("/healthz");
    EXPECT_TRUE(r && r->status == 200) << "probe " << i;
    EXPECT_LT(seconds_since(t0), 1.0) << "probe " << i;
    auto m = c.Get("/v1/models");  // a handler-pool route too
    EXPECT_TRUE(m && m->status == 200) << "models " << i;
  }
  // A head that takes longer than --header-timeout is cut off however it trickles.
  EXPECT_TRUE(drippers.front()->closed_within(5.0));
  stop.store(true);
  drip.join();
}

TEST(ServeHostile, ShutdownIsBoundedWhileAClientDrips) {
  ServeOptions o = TestServer::defaults();
  o.header_timeout_s = 60;  // the drip would outlast the shutdown without the grace
  o.shutdown_grace_s = 1;
  auto server = std::make_unique<TestServer>(o);
  RawConn slow(server->port());
  slow.send("POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{");
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    for (int i = 0; i < 300 && !stop.load(); ++i) {
      slow.send(" ", 100);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  auto done = std::async(std::launch::async, [&] { server->server().shutdown(); });
  const bool finished = done.wait_for(std::chrono::seconds(8)) == std::future_status::ready;
  EXPECT_TRUE(finished) << "shutdown still running after 8 s";
  if (finished) {
    EXPECT_LT(seconds_since(t0), 4.0);
  }
  EXPECT_TRUE(slow.closed_within(3.0));
  stop.store(true);
  drip.join();
  if (finished) {
    server.reset();
  } else {
    done.wait();  // the old transport: let it end before the test does
  }
}

TEST(ServeHostile, KeepAliveServesRequestAfterRequest) {
  TestServer server;
  RawConn c(server.port());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
    const std::string r = c.read_response(5);
    EXPECT_EQ(RawConn::status(r), 200) << i;
    EXPECT_EQ(RawConn::body(r), R"({"status":"ok"})") << r;
  }
  // Two pipelined requests in one write are answered in order.
  ASSERT_TRUE(
      c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
             "GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"));
  std::string both;
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < until && both.find("404") == std::string::npos) both += c.read_response(1);
  EXPECT_LT(both.find(" 200 "), both.find(" 404 ")) << both;
}

}  // namespace
}  // namespace zimage::serve::test
