// The real `zimage serve` binary: --port 0 prints the port, SIGTERM / SIGINT cancel queued and
// running jobs with a clear status and exit 0, a non-loopback host without a key is refused, and a
// seeded request gives the same pixels and PNG text chunks as `zimage generate`.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <thread>

#include "serve/raw_http.h"
#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

using Clock = std::chrono::steady_clock;

// A child process with its stdout readable line by line; killed on destruction if still running.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      const int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 2);
      close(out[0]);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  // The next stdout line matching `re` within `timeout_s` (empty if none).
  std::string wait_line(const std::regex& re, double timeout_s, std::smatch* m = nullptr) {
    const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Clock::now() < until) {
      size_t nl;
      while ((nl = buf_.find('\n')) != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        lines_ = line;
        if (std::regex_search(lines_, *(m ? m : &last_), re)) return lines_;
      }
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        char b[4096];
        const ssize_t n = read(fd_, b, sizeof(b));
        if (n <= 0) return "";
        buf_.append(b, static_cast<size_t>(n));
      }
    }
    return "";
  }
  // Exit status, or -1 if it did not exit within `timeout_s`.
  int wait_exit(double timeout_s) {
    const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Clock::now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool exited_ = false;
  std::string buf_, lines_;
  std::smatch last_;
};

std::vector<std::string> serve_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {
      ZIMAGE_CLI_PATH, "serve", "--model", ZIMAGE_SERVE_MODEL_DIR, "--port", "0", "--device", "cpu",
      "--threads",     "2",     "--quiet", "--default-size",       "64x64"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

int start_and_get_port(Child& child) {
  std::smatch m;
  const std::string line =
      child.wait_line(std::regex(R"(listening on http://127\.0\.0\.1:(\d+))"), 30, &m);
  if (line.empty()) return -1;
  const int port = std::stoi(m[1].str());
  if (child.wait_line(std::regex("ready"), 60).empty()) return -1;
  return port;
}

void graceful_stop(int sig) {
  Child child(serve_args());
  const int port = start_and_get_port(child);
  ASSERT_GT(port, 0);
  EXPECT_EQ(get(port, "/readyz").status, 200);
  Reply running = post(port, "/v1/jobs",
                       R"({"prompt": "long", "num_inference_steps": 1000, "size": "128x128"})");
  Reply queued = post(port, "/v1/jobs", R"({"prompt": "queued"})");
  ASSERT_EQ(running.status, 202);
  ASSERT_EQ(queued.status, 202);
  const std::string rid = running.json()["id"], qid = queued.json()["id"];
  // Watch both jobs' events until the end.
  std::string running_events, queued_events;
  std::thread w1([&] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    c.Get("/v1/jobs/" + rid + "/events", [&](const char* d, size_t n) {
      running_events.append(d, n);
      return true;
    });
  });
  std::thread w2([&] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    c.Get("/v1/jobs/" + qid + "/events", [&](const char* d, size_t n) {
      queued_events.append(d, n);
      return true;
    });
  });
  for (int i = 0; i < 1200; ++i) {
    if (get(port, "/v1/jobs/" + rid).json().value("step", 0) > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(child.pid(), sig), 0);
  const int code = child.wait_exit(20);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  w1.join();
  w2.join();
  EXPECT_EQ(code, 0);
  EXPECT_LT(took, 10.0);
  EXPECT_NE(running_events.find("event: started"), std::string::npos);
  EXPECT_NE(running_events.find("event: cancelled"), std::string::npos) << running_events;
  EXPECT_NE(running_events.find("server shutting down"), std::string::npos);
  EXPECT_NE(queued_events.find("event: cancelled"), std::string::npos) << queued_events;
  EXPECT_NE(queued_events.find("server shutting down"), std::string::npos);
  EXPECT_EQ(get(port, "/healthz").status, -1);  // gone
}

TEST(ServeProcess, SigtermCancelsJobsAndExitsZero) {
  graceful_stop(SIGTERM);
}

TEST(ServeProcess, SigtermEndsWithinTheGraceWhileAClientDrips) {
  Child child(serve_args({"--shutdown-grace", "1", "--header-timeout", "120"}));
  const int port = start_and_get_port(child);
  ASSERT_GT(port, 0);
  RawConn slow(port);
  ASSERT_TRUE(slow.send("POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "));
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    for (int i = 0; i < 400 && !stop.load(); ++i) {
      slow.send("a", 100);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(child.pid(), SIGTERM), 0);
  const int code = child.wait_exit(15);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  stop.store(true);
  drip.join();
  EXPECT_EQ(code, 0);
  EXPECT_LT(took, 5.0);
}

TEST(ServeProcess, SigintCancelsJobsAndExitsZero) {
  graceful_stop(SIGINT);
}

TEST(ServeProcess, NonLoopbackHostWithoutKeyIsRefused) {
  Child child({ZIMAGE_CLI_PATH, "serve", "--model", ZIMAGE_SERVE_MODEL_DIR, "--host", "0.0.0.0",
               "--port", "0"});
  EXPECT_EQ(child.wait_exit(30), 2);
}

TEST(ServeProcess, MissingModelFailsWithExitCode1) {
  Child child({ZIMAGE_CLI_PATH, "serve", "--model", "/nonexistent/zimage-model", "--port", "0"});
  EXPECT_FALSE(child.wait_line(std::regex("listening on"), 30).empty());
  EXPECT_EQ(child.wait_exit(30), 1);
}

TEST(ServeCli, SeededImageMatchesCli) {
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("zimage_serve_cli_" + std::to_string(getpid()) + ".png"))
                              .string();
  Child cli({ZIMAGE_CLI_PATH,
             "generate",
             "--model",
             ZIMAGE_SERVE_MODEL_DIR,
             "--prompt",
             "a lighthouse at dusk, 灯台",
             "--negative-prompt",
             "fog",
             "--width",
             "64",
             "--height",
             "48",
             "--steps",
             "3",
             "--guidance",
             "2.5",
             "--seed",
             "987654321",
             "--device",
             "cpu",
             "--threads",
             "2",
             "--quiet",
             "--output",
             out});
  ASSERT_EQ(cli.wait_exit(120), 0);
  PngTextChunks cli_text;
  auto cli_img = png_load(out, &cli_text);
  std::filesystem::remove(out);
  ASSERT_TRUE(cli_img.ok()) << cli_img.status().to_string();

  TestServer server;
  Reply r = post(server.port(), "/v1/images/generations",
                 R"({"prompt": "a lighthouse at dusk, 灯台", "negative_prompt": "fog",
                     "size": "64x48", "num_inference_steps": 3, "guidance_scale": 2.5,
                     "seed": 987654321})");
  ASSERT_EQ(r.status, 200) << r.body;
  PngTextChunks srv_text;
  auto srv_img = png_decode(base64_decode(r.json()["data"][0]["b64_json"]), &srv_text);
  ASSERT_TRUE(srv_img.ok());
  EXPECT_EQ(srv_img->width, cli_img->width);
  EXPECT_EQ(srv_img->height, cli_img->height);
  EXPECT_TRUE(srv_img->rgb == cli_img->rgb) << "pixels differ from zimage generate";
  EXPECT_EQ(srv_text, cli_text);
}

}  // namespace
}  // namespace zimage::serve::test
