// Small pieces every route uses: JSON and error responses, the handler guard that turns any
// exception into a JSON 500, request admission (validate -> job table -> queue), base URLs, the
// route table (each route with its body limit), and the server-wide hooks (API key, Host and
// cross-origin refusal, access log, JSON bodies for errors the transport answers itself such as
// 404, 413 and 431).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "serve/api_error.h"
#include "serve/context.h"
#include "serve/http/server.h"

namespace zimage::serve {

void send_json(http::Response& res, int status, const nlohmann::json& body);
void send_error(http::Response& res, const ApiError& e);

// Wraps a handler: any exception becomes a JSON 500 (bad_alloc a 503); nothing escapes.
http::Handler guard(std::function<void(const http::Request&, http::Response&)> f);

// Validates `spec` against the engine, makes the job and queues it. On failure fills `error`
// (400 naming the field, 429 when the queue is full, 503 while loading or stopping) and returns
// nullptr. `res` gets Retry-After on 429/503.
std::shared_ptr<Job> admit(ServeContext& ctx, JobSpec spec, http::Response& res, ApiError* error);

// Parses a body with `parse` and admits it: the shared path of every generation endpoint.
using ParseFn = Result<JobSpec> (*)(std::string_view, const ParseLimits&, uint64_t);
std::shared_ptr<Job> parse_and_admit(ServeContext& ctx, ParseFn parse, const http::Request& req,
                                     http::Response& res);
// The same for a request that is not one JSON body (multipart forms): `make` builds the spec
// from the server's limits and a fresh random seed.
using SpecFn = std::function<Result<JobSpec>(const ParseLimits&, uint64_t)>;
std::shared_ptr<Job> make_and_admit(ServeContext& ctx, const SpecFn& make, http::Response& res);

// Responses that wait on a job (sync generations, SSE streams) each hold an HTTP thread; past
// http_threads - 8 of them a new one gets 503, so /healthz and short requests always find a thread.
// Returns false after sending that 503.
bool reserve_waiting_slot(ServeContext& ctx, http::Response& res);

// The synchronous generation endpoints' shared path: reserves a waiting slot, parses and admits
// the body, waits for the job to end. Returns the job when it succeeded; otherwise sends the error
// (503 for a job cancelled by shutdown) and returns nullptr.
std::shared_ptr<Job> generate_and_wait(ServeContext& ctx, ParseFn parse, const http::Request& req,
                                       http::Response& res);
std::shared_ptr<Job> generate_and_wait(ServeContext& ctx, const SpecFn& make, http::Response& res);

// Paths whose bodies carry images (multipart /v1/images/edits, A1111's img2img): they may be
// up to ServeOptions::max_image_body_bytes; every other body stays under max_body_bytes.
bool takes_image_body(const std::string& path);

// "http://host:port" as the client addressed us (from a well-formed Host header), else "".
std::string base_url(const http::Request& req);
// Whether the query (undecoded, after '?') holds `name` as 1 or true ("preview=1"); `fallback`
// when `name` is absent; any other value reads false.
bool query_flag(const std::string& query, const std::string& name, bool fallback);

// Constant-time comparison (no early exit on the first differing byte).
bool constant_time_equal(const std::string& a, const std::string& b);

// Registers routes on the transport, each with the body limit of its path: the image routes
// (takes_image_body) --max-image-body, every other --max-body.
class RouteTable {
 public:
  RouteTable(http::Server& svr, const ServeOptions& options) : svr_(svr), options_(options) {}
  // `run_inline`: answered on the transport's I/O thread (health probes: never starved).
  void get(const std::string& pattern, http::Handler h, bool run_inline = false);
  void post(const std::string& pattern, http::Handler h);
  void del(const std::string& pattern, http::Handler h);

 private:
  size_t body_limit(const std::string& pattern) const;
  http::Server& svr_;
  const ServeOptions& options_;
};

// True for the names a loopback-only server answers to: "localhost", an IPv4 literal in
// 127.0.0.0/8, "::1" / "[::1]" (not "127.0.0.1.evil.example").
bool is_loopback_name(const std::string& host);

// The value of an "Authorization: Bearer KEY" header (the scheme in any case), or nullopt.
std::optional<std::string> bearer_token(const std::string& authorization);

// Installs the pre-routing checks, error handler and access logger.
void install_hooks(http::Server& svr, ServeContext& ctx);

}  // namespace zimage::serve
