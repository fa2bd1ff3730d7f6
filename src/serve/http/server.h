// The HTTP/1.1 transport of zimage serve, on Boost.Beast and Boost.Asio. Why not cpp-httplib,
// which served before: Debian's 0.11 gives a thread to each connection from its first byte (so
// as many slow clients as threads starve everyone, health probes included), has no deadline for
// a whole head or body, inflates compressed bodies and reads chunked ones without the body
// limit, answers unbounded multi-range requests, and keeps no count of header fields.
//
// Here connections are read asynchronously on a few I/O threads, each under deadlines: the head
// within header_timeout, no silence longer than idle_timeout, the body within body_timeout. Only
// a complete, checked request (http/framing.h: limits, one Host, strict framing, no encoded
// bodies) reaches a handler thread; routes marked `inline` (health probes) answer on the I/O
// thread and so cannot be starved by busy handlers. Past max_connections, the oldest connection
// still sending its head is dropped for the new one. Errors the transport answers itself (400,
// 404, 413, 414, 415, 417, 431) get their body from the error handler; a deadline closes the
// connection. stop() is bounded: it
// waits up to its grace time for running handlers, then closes every connection.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "serve/http/framing.h"
#include "serve/http/message.h"
#include "zimage/status.h"

namespace zimage::serve::http {

struct ServerLimits {
  FramingLimits framing;
  int header_timeout_s = 10;  // the whole request head, from the first byte awaited
  int idle_timeout_s = 10;    // longest silence while a body is read or a response written
  int body_timeout_s = 120;   // the whole body (and the whole of one response write)
  size_t max_connections = 1024;
  int handler_threads = 64;
  int io_threads = 2;
};

using Handler = std::function<void(const Request&, Response&)>;

class Server {
 public:
  explicit Server(ServerLimits limits);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // A route: `method` ("GET" also answers HEAD), a regular expression matched against the whole
  // decoded path (its captures in Request::matches), the largest body it takes. Inline routes
  // run on the I/O thread: only for handlers that never block.
  // `body_limit` bounds every body; where `form_body_limit` is not 0, a multipart/form-data body
  // is bounded by it instead (a route taking JSON and an uploaded image: /v1/jobs).
  void add(const std::string& method, const std::string& pattern, size_t body_limit, Handler h,
           bool run_inline = false, size_t form_body_limit = 0);
  // Runs once a request's head is in and checked, before its body is read: answering (true)
  // ends the request there. Authentication lives here, so no body is read for a refused client.
  void set_pre_routing(std::function<bool(const Request&, Response&)> f);
  // Fills the body of an error response the transport or a route left empty (status >= 400).
  void set_error_handler(std::function<void(const Request&, Response&)> f);
  // After each response (the request's head may be partial when it was refused early).
  void set_logger(std::function<void(const Request&, const Response&, double ms)> f);
  // Headers every response carries unless it sets them itself.
  void set_default_headers(Headers h);

  // Binds host:port (port 0: any free port) and starts serving. Returns the port.
  Result<int> start(const std::string& host, int port);
  // Refuses new connections, waits up to `grace` for running handlers, then closes every
  // connection and joins all threads. Idempotent.
  void stop(std::chrono::milliseconds grace);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace zimage::serve::http
