// Load and failure behaviour on a live in-process server (bounded in count and time, loopback
// only): 100 concurrent clients where every job either completes or gets an explicit 429 (none
// lost, none duplicated), a cancel storm, SSE clients that vanish, clients that never read or
// never finish their request, and a job whose engine call fails or throws failing alone.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <thread>

#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(ServeLoad, HundredConcurrentClientsCompleteOrGet429) {
  ServeOptions o = TestServer::defaults();
  o.max_queue = 8;
  TestServer server(o);
  const int port = server.port();
  constexpr int kClients = 100;
  constexpr int kAttempts = 5;  // a client retries a 429 after 200 ms, at most this many times
  std::mutex mu;
  std::vector<std::string> ids;
  std::vector<double> latencies;  // submission to images, completed requests only
  int ok = 0, gave_up = 0, other = 0, responses_429 = 0;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      for (int attempt = 0; attempt < kAttempts; ++attempt) {
        if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        // Half synchronous (OpenAI), half asynchronous (job + SSE until done).
        const bool sync = i % 2 == 0;
        const std::string body =
            R"({"prompt": "load", "num_inference_steps": 1, "size": "32x32", "seed": )" +
            std::to_string(i) + "}";
        const auto t0 = Clock::now();
        Reply r = post(port, sync ? "/v1/images/generations" : "/v1/jobs", body);
        if (r.status == 429) {
          std::lock_guard<std::mutex> lock(mu);
          ++responses_429;
          EXPECT_TRUE(r.headers.count("Retry-After"));
          if (attempt + 1 == kAttempts) ++gave_up;
          continue;
        }
        std::string id;
        bool done = false;
        if (sync && r.status == 200) {
          id = r.json()["id"];
          done = r.json()["data"].size() == 1;
        } else if (!sync && r.status == 202) {
          id = r.json()["id"];
          httplib::Client c("127.0.0.1", port);
          c.set_read_timeout(60, 0);
          std::string events;
          c.Get("/v1/jobs/" + id + "/events", [&](const char* d, size_t n) {
            events.append(d, n);
            return true;
          });
          done = events.find("event: done") != std::string::npos;
        }
        std::lock_guard<std::mutex> lock(mu);
        if (done) {
          ++ok;
          ids.push_back(id);
          latencies.push_back(seconds_since(t0));
        } else {
          ++other;
          ADD_FAILURE() << r.status << " " << r.body.substr(0, 200);
        }
        return;
      }
    });
  for (auto& t : threads) t.join();
  const double elapsed = seconds_since(start);
  std::sort(latencies.begin(), latencies.end());
  auto pct = [&](double p) {
    return latencies.empty() ? 0.0 : latencies[static_cast<size_t>(p * (latencies.size() - 1))];
  };
  std::printf(
      "[ServeLoad] %d clients: %d completed, %d gave up after %d x 429 (%d 429 responses "
      "in all), %d other, %.2f s; latency of completed p50 %.3f s, p95 %.3f s\n",
      kClients, ok, gave_up, kAttempts, responses_429, other, elapsed, pct(0.5), pct(0.95));
  EXPECT_EQ(ok + gave_up, kClients);
  EXPECT_EQ(other, 0);
  EXPECT_GT(ok, 8);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size());  // no duplicates
  const Metrics& m = server.server().context().metrics;
  EXPECT_EQ(m.jobs_succeeded.load(), static_cast<uint64_t>(ok));  // none lost
  EXPECT_EQ(m.rejected_queue_full.load(), static_cast<uint64_t>(responses_429));
  EXPECT_EQ(m.queue_depth.load(), 0);
  EXPECT_EQ(server.server().context().jobs.size(), static_cast<size_t>(ok));
  EXPECT_LT(elapsed, 120.0);
}

TEST(ServeLoad, CancelStormLeavesTheServerHealthy) {
  ServeOptions o = TestServer::defaults();
  o.max_queue = 32;
  TestServer server(o);
  const int port = server.port();
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) {
    Reply r = post(port, "/v1/jobs", R"({"prompt": "storm", "num_inference_steps": 1000})");
    ASSERT_EQ(r.status, 202) << r.body;
    ids.push_back(r.json()["id"]);
  }
  std::vector<std::thread> threads;
  std::atomic<int> non_200{0};
  for (int t = 0; t < 40; ++t)
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < ids.size(); ++k) {
        const std::string& id = ids[(k + static_cast<size_t>(t)) % ids.size()];
        if (del(port, "/v1/jobs/" + id).status != 200) ++non_200;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(non_200.load(), 0);
  for (const std::string& id : ids) {
    json j;
    for (int i = 0; i < 200; ++i) {
      j = get(port, "/v1/jobs/" + id).json();
      if (j["status"] == "cancelled") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    EXPECT_EQ(j["status"], "cancelled") << id;
  }
  const Metrics& m = server.server().context().metrics;
  EXPECT_EQ(m.jobs_cancelled.load(), ids.size());  // each counted once
  EXPECT_EQ(m.queue_depth.load(), 0);
  const auto t0 = Clock::now();
  EXPECT_EQ(post(port, "/v1/images/generations", R"({"prompt": "after"})").status, 200);
  EXPECT_LT(seconds_since(t0), 10.0);
}

// Opens a TCP connection to the server and sends `request` (possibly incomplete).
int raw_connect(int port, const std::string& request, int rcvbuf = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  if (!request.empty()) (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  return fd;
}

bool wait_for(const std::function<bool()>& cond, double seconds) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

TEST(ServeLoad, SseClientsThatDisconnectAreReleased) {
  TestServer server;
  const int port = server.port();
  ServeContext& ctx = server.server().context();
  Reply r = post(port, "/v1/jobs", R"({"prompt": "watched", "num_inference_steps": 1000})");
  ASSERT_EQ(r.status, 202);
  const std::string id = r.json()["id"];
  // 10 clients that hang up after their first event, 10 that hang up without reading.
  std::vector<std::thread> threads;
  for (int i = 0; i < 10; ++i)
    threads.emplace_back([&] {
      httplib::Client c("127.0.0.1", port);
      c.Get("/v1/jobs/" + id + "/events", [](const char*, size_t) { return false; });
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 10; ++i) {
    const int fd =
        raw_connect(port, "GET /v1/jobs/" + id + "/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  // Every stream notices within a few writes (a step event or a keep-alive each second).
  EXPECT_TRUE(wait_for([&] { return ctx.waiting_responses.load() == 0; }, 10.0))
      << ctx.waiting_responses.load() << " streams still open";
  EXPECT_EQ(get(port, "/healthz").status, 200);
  EXPECT_EQ(del(port, "/v1/jobs/" + id).status, 200);
}

TEST(ServeLoad, SlowClientsDoNotHoldTheServer) {
  ServeOptions o = TestServer::defaults();
  o.http_threads = 6;
  o.io_timeout_s = 1;
  TestServer server(o);
  const int port = server.port();
  // 4 noise images of 128x128 (~45 kB each as PNG).
  Reply big = post(port, "/v1/jobs",
                   R"({"prompt": "big", "size": "128x128", "n": 4, "num_inference_steps": 1,
                       "response_format": "url"})");
  ASSERT_EQ(big.status, 202) << big.body;
  const std::string id = big.json()["id"];
  ASSERT_TRUE(
      wait_for([&] { return get(port, "/v1/jobs/" + id).json()["status"] == "succeeded"; }, 60.0));
  std::string pipelined;  // 64 image requests on one connection (HTTP pipelining): ~3 MB
  for (int k = 0; k < 64; ++k)
    pipelined += "GET /v1/jobs/" + id + "/images/" + std::to_string(k % 4) +
                 " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  std::vector<int> fds;
  // Three clients that ask for ~3 MB and never read (tiny receive buffer)...
  for (int i = 0; i < 3; ++i) fds.push_back(raw_connect(port, pipelined, 1024));
  // ...and three that never finish sending their request (slowloris).
  for (int i = 0; i < 3; ++i) fds.push_back(raw_connect(port, "GET /healthz HTTP/1.1\r\nHo"));
  for (int fd : fds) ASSERT_GE(fd, 0);
  // All six connections hold a thread for at most the I/O timeout; then the server answers.
  const auto t0 = Clock::now();
  EXPECT_TRUE(wait_for([&] { return get(port, "/healthz").status == 200; }, 15.0));
  std::printf("[ServeLoad] healthz answered %.2f s after 6 stuck clients\n", seconds_since(t0));
  // The slowloris connections were closed by the server (read returns 0 or an error).
  for (size_t i = 3; i < fds.size(); ++i) {
    char buf[4096];
    timeval tv{5, 0};
    setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ssize_t n;
    std::string got;
    while ((n = ::recv(fds[i], buf, sizeof(buf), 0)) > 0) got.append(buf, static_cast<size_t>(n));
    EXPECT_LE(n, 0);
  }
  for (int fd : fds) ::close(fd);
  // Full capacity again: six requests at once.
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&] { good += get(port, "/readyz").status == 200; });
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 6);
}

TEST(ServeLoad, EventStreamsAreCappedBelowTheThreadCount) {
  ServeOptions o = TestServer::defaults();
  o.http_threads = 12;  // at most 12 - 8 = 4 waiting responses
  TestServer server(o);
  const int port = server.port();
  ServeContext& ctx = server.server().context();
  Reply r = post(port, "/v1/jobs", R"({"prompt": "watched", "num_inference_steps": 1000})");
  ASSERT_EQ(r.status, 202);
  const std::string id = r.json()["id"];
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i)
    fds.push_back(
        raw_connect(port, "GET /v1/jobs/" + id + "/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  ASSERT_TRUE(wait_for([&] { return ctx.waiting_responses.load() == 4; }, 10.0));
  Reply fifth = get(port, "/v1/jobs/" + id + "/events");
  EXPECT_EQ(fifth.status, 503);
  EXPECT_TRUE(fifth.headers.count("Retry-After"));
  Reply sync = post(port, "/v1/images/generations", R"({"prompt": "x"})");
  EXPECT_EQ(sync.status, 503);
  EXPECT_EQ(get(port, "/healthz").status, 200);
  EXPECT_EQ(get(port, "/v1/jobs/" + id).status, 200);
  for (int fd : fds) ::close(fd);
  EXPECT_EQ(del(port, "/v1/jobs/" + id).status, 200);
  EXPECT_TRUE(wait_for([&] { return ctx.waiting_responses.load() == 0; }, 10.0));
}

// Wraps the real engine; some prompts fail or throw inside the worker.
class FaultyRunner : public EngineRunner {
 public:
  Result<GenerateResult> generate(const GenerateRequest& req, const GenerateHooks& hooks) override {
    const std::string& p = req.prompts.front();
    if (p == "throw bad_alloc") throw std::bad_alloc();
    if (p == "throw runtime_error") throw std::runtime_error("simulated engine bug");
    if (p == "device error") return DeviceError("simulated CUDA out of memory");
    if (p == "engine rejects") return FieldError("guidance", "rejected by the engine");
    return shared_engine()->generate(req, hooks);
  }
};

TEST(ServeLoad, AFailedJobFailsAloneAndTheNextSucceeds) {
  FaultyRunner runner;
  TestServer server(TestServer::defaults(), &runner);
  const int port = server.port();
  struct Want {
    const char* prompt;
    int status;
    const char* type;
  };
  for (const Want& w :
       {Want{"throw bad_alloc", 503, "server_error"},
        Want{"throw runtime_error", 500, "server_error"}, Want{"device error", 500, "server_error"},
        Want{"engine rejects", 400, "invalid_request_error"}}) {
    SCOPED_TRACE(w.prompt);
    // The failing job and a good one queued right behind it.
    Reply failing_async = post(port, "/v1/jobs", std::string(R"({"prompt": ")") + w.prompt + "\"}");
    ASSERT_EQ(failing_async.status, 202);
    Reply good_async = post(port, "/v1/jobs", R"({"prompt": "fine"})");
    ASSERT_EQ(good_async.status, 202);
    Reply failing =
        post(port, "/v1/images/generations", std::string(R"({"prompt": ")") + w.prompt + "\"}");
    EXPECT_EQ(failing.status, w.status) << failing.body;
    EXPECT_EQ(failing.json()["error"]["type"], w.type);
    EXPECT_NE(failing.json()["error"]["message"].get<std::string>().find("generation failed"),
              std::string::npos);
    if (std::string(w.prompt) == "engine rejects") {
      EXPECT_EQ(failing.json()["error"]["param"], "guidance_scale");  // client's name
    }
    const std::string fid = failing_async.json()["id"], gid = good_async.json()["id"];
    ASSERT_TRUE(wait_for(
        [&] { return get(port, "/v1/jobs/" + gid).json()["status"] == "succeeded"; }, 30.0));
    EXPECT_EQ(get(port, "/v1/jobs/" + fid).json()["status"], "failed");
    EXPECT_EQ(post(port, "/v1/images/generations", R"({"prompt": "fine"})").status, 200);
  }
  const Metrics& m = server.server().context().metrics;
  EXPECT_EQ(m.jobs_failed.load(), 8u);
  EXPECT_EQ(m.jobs_succeeded.load(), 8u);
}

}  // namespace
}  // namespace zimage::serve::test
