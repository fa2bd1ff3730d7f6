// A raw TCP client for the transport tests: sends exactly the bytes a test gives (malformed
// framing, slow drips, bodies larger than any limit) and reads what the server answers, with
// deadlines, so a server that never answers fails the test instead of hanging it. Loopback only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <string_view>

namespace zimage::serve::test {

class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  bool ok() const { return fd_ >= 0; }

  // Sends all of `data` unless the server closes or stops reading for `timeout_ms`.
  bool send(std::string_view data, int timeout_ms = 5000) {
    while (!data.empty()) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, timeout_ms) <= 0 || (p.revents & (POLLERR | POLLHUP))) return false;
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        return false;
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // True when the server has sent something (or closed) within `ms`.
  bool readable(int ms) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, ms) > 0;
  }

  // Reads until the server closes, a whole response (head + Content-Length body) is in, or
  // `timeout_s` passes.
  std::string read_response(double timeout_s) {
    std::string out;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < until) {
      if (complete(out)) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

  // True once the server has closed the connection (reads 0 or fails) within `timeout_s`.
  bool closed_within(double timeout_s) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
    }
    return false;
  }

  // The status of a response ("HTTP/1.1 413 ..." -> 413), -1 when there is none.
  static int status(const std::string& response) {
    if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return -1;
    return std::atoi(response.c_str() + 9);
  }
  // The body after the head ("" when none).
  static std::string body(const std::string& response) {
    const size_t p = response.find("\r\n\r\n");
    return p == std::string::npos ? "" : response.substr(p + 4);
  }

 private:
  static bool complete(const std::string& r) {
    const size_t head = r.find("\r\n\r\n");
    if (head == std::string::npos) return false;
    std::string lower = r.substr(0, head);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const size_t cl = lower.find("\r\ncontent-length:");
    if (cl == std::string::npos) return lower.find("transfer-encoding") == std::string::npos;
    const size_t length = std::stoul(lower.substr(cl + 17));
    return r.size() >= head + 4 + length;
  }

  int fd_ = -1;
};

}  // namespace zimage::serve::test
