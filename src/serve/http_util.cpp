// Shared HTTP helpers and server-wide hooks (see http_util.h).
#include "serve/http_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <new>

#include "serve/lora_request.h"
#include "serve/request_parse.h"

namespace zimage::serve {

namespace {

using nlohmann::json;
// The host part of a Host header ("127.0.0.1:8188" -> "127.0.0.1", "[::1]:80" -> "[::1]").
std::string host_part(const std::string& host) {
  if (!host.empty() && host[0] == '[') {
    const size_t close = host.find(']');
    return close == std::string::npos ? host : host.substr(0, close + 1);
  }
  const size_t colon = host.find(':');
  return colon == std::string::npos ? host : host.substr(0, colon);
}

bool well_formed_host(const std::string& h) {
  if (h.empty() || h.size() > 255) return false;
  for (char c : h) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == ':' || c == '[' || c == ']';
    if (!ok) return false;
  }
  return true;
}

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms.count()));
  return buf;
}

}  // namespace

void send_json(http::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json; charset=utf-8");
}

void send_error(http::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json; charset=utf-8");
}

http::Handler guard(std::function<void(const http::Request&, http::Response&)> f) {
  return [f = std::move(f)](const http::Request& req, http::Response& res) {
    try {
      f(req, res);
    } catch (const std::bad_alloc&) {
      res = http::Response();
      send_error(res, ApiError{503, "server_error", "out of memory", ""});
    } catch (const std::exception& e) {
      res = http::Response();
      send_error(res,
                 ApiError{500, "server_error", std::string("internal error: ") + e.what(), ""});
    } catch (...) {
      res = http::Response();
      send_error(res, ApiError{500, "server_error", "internal error", ""});
    }
  };
}

std::shared_ptr<Job> admit(ServeContext& ctx, JobSpec spec, http::Response& res, ApiError* error) {
  if (ctx.stopping.load()) {
    *error = ApiError{503, "server_error", "the server is shutting down", ""};
    return nullptr;
  }
  if (!ctx.ready.load()) {
    res.set_header("Retry-After", "5");
    *error = ApiError{503, "server_error", "the model is still loading; retry later", ""};
    return nullptr;
  }
  if (const Status st = check_request_loras(*ctx.engine, spec.runs, ctx.options.lora_dir);
      !st.ok()) {
    ++ctx.metrics.rejected_invalid;
    *error = api_error(st);
    return nullptr;
  }
  for (const GenerateRequest& r : spec.runs) {
    const Status st = rename_fields(ctx.engine->validate(r), spec.dialect);
    if (!st.ok()) {
      ++ctx.metrics.rejected_invalid;
      *error = api_error(st);
      return nullptr;
    }
  }
  std::shared_ptr<Job> job = ctx.jobs.create(std::move(spec));
  switch (ctx.scheduler.submit(job)) {
    case Admission::kAccepted:
      return job;
    case Admission::kQueueFull:
      ctx.jobs.remove(job->id());
      ++ctx.metrics.rejected_queue_full;
      res.set_header("Retry-After", "1");
      *error = ApiError{
          429, "rate_limit_error",
          "the queue is full (" + std::to_string(ctx.options.max_queue) + " jobs); retry later",
          ""};
      return nullptr;
    case Admission::kShuttingDown:
      break;
  }
  ctx.jobs.remove(job->id());
  *error = ApiError{503, "server_error", "the server is shutting down", ""};
  return nullptr;
}

bool takes_image_body(const std::string& path) {
  // /v1/jobs also takes the edits form (an image); its JSON bodies keep --max-body.
  return path == "/v1/images/edits" || path == "/sdapi/v1/img2img" || path == "/v1/jobs";
}

bool query_flag(const std::string& query, const std::string& name, bool fallback) {
  size_t start = 0;
  while (start <= query.size()) {
    size_t end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    const std::string item = query.substr(start, end - start);
    const size_t eq = item.find('=');
    if (item.substr(0, eq) == name) {
      const std::string v = eq == std::string::npos ? "" : item.substr(eq + 1);
      return v == "1" || v == "true";
    }
    start = end + 1;
  }
  return fallback;
}

namespace {

// The server reads bodies up to the image routes' limit; JSON bodies stay under --max-body
// (413 otherwise, as the transport answers past a route's limit).
bool json_body_fits(ServeContext& ctx, const http::Request& req, http::Response& res) {
  const bool image_route = takes_image_body(req.path) && req.path != "/v1/jobs";
  if (image_route || req.body.size() <= ctx.options.max_body_bytes) return true;
  send_error(res, ApiError{413, "invalid_request_error",
                           "body: larger than the " + std::to_string(ctx.options.max_body_bytes) +
                               "-byte limit",
                           "body"});
  return false;
}

}  // namespace

std::shared_ptr<Job> parse_and_admit(ServeContext& ctx, ParseFn parse, const http::Request& req,
                                     http::Response& res) {
  if (!json_body_fits(ctx, req, res)) return nullptr;
  return make_and_admit(
      ctx,
      [parse, &req](const ParseLimits& limits, uint64_t seed) {
        return parse(req.body, limits, seed);
      },
      res);
}

std::shared_ptr<Job> make_and_admit(ServeContext& ctx, const SpecFn& make, http::Response& res) {
  if (!ctx.ready.load() || ctx.stopping.load()) {
    ApiError e;
    admit(ctx, JobSpec{}, res, &e);
    send_error(res, e);
    return nullptr;
  }
  Result<JobSpec> spec = make(ctx.limits, random_seed());
  if (!spec.ok()) {
    ++ctx.metrics.rejected_invalid;
    send_error(res, api_error(spec.status()));
    return nullptr;
  }
  ApiError e;
  std::shared_ptr<Job> job = admit(ctx, std::move(spec).value(), res, &e);
  if (job == nullptr) send_error(res, e);
  return job;
}

bool reserve_waiting_slot(ServeContext& ctx, http::Response& res) {
  const int limit = std::max(2, ctx.options.http_threads - 8);
  if (ctx.waiting_responses.load() < limit) return true;
  res.set_header("Retry-After", "1");
  send_error(res, ApiError{503, "server_error",
                           "too many open event streams and waiting requests (" +
                               std::to_string(limit) + "); retry later",
                           ""});
  return false;
}

std::shared_ptr<Job> generate_and_wait(ServeContext& ctx, ParseFn parse, const http::Request& req,
                                       http::Response& res) {
  if (!json_body_fits(ctx, req, res)) return nullptr;
  return generate_and_wait(
      ctx,
      [parse, &req](const ParseLimits& limits, uint64_t seed) {
        return parse(req.body, limits, seed);
      },
      res);
}

std::shared_ptr<Job> generate_and_wait(ServeContext& ctx, const SpecFn& make, http::Response& res) {
  if (!reserve_waiting_slot(ctx, res)) return nullptr;
  std::shared_ptr<Job> job = make_and_admit(ctx, make, res);
  if (job == nullptr) return nullptr;
  WaitingResponse waiting(ctx);
  while (!job->wait_final(std::chrono::seconds(1))) {
  }
  const JobSnapshot s = job->snapshot();
  if (s.state == JobState::kSucceeded) return job;
  ApiError e = s.error;
  if (ctx.stopping.load() && s.state == JobState::kCancelled) e.status = 503;
  send_error(res, e);
  return nullptr;
}

std::string base_url(const http::Request& req) {
  const std::string host = req.get_header_value("Host");
  if (!well_formed_host(host)) return "";
  return "http://" + host;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  // The length is not secret (keys have fixed, documented lengths); the bytes are compared
  // without an early exit.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i) diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool is_loopback_name(const std::string& h) {
  if (h == "localhost" || h == "::1" || h == "[::1]") return true;
  // An IPv4 literal: four decimal octets, the first 127.
  int octets = 0;
  size_t i = 0;
  while (i <= h.size()) {
    size_t j = i;
    int value = 0;
    while (j < h.size() && h[j] >= '0' && h[j] <= '9' && j - i < 3)
      value = value * 10 + (h[j++] - '0');
    if (j == i || value > 255) return false;
    if (octets == 0 && value != 127) return false;
    ++octets;
    if (j == h.size()) return octets == 4;
    if (h[j] != '.' || octets == 4) return false;
    i = j + 1;
  }
  return false;
}

std::optional<std::string> bearer_token(const std::string& authorization) {
  // RFC 9110 §11.1: the scheme is case-insensitive; one or more spaces before the credentials.
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() ||
      !http::iequals(std::string_view(authorization).substr(0, kScheme.size()), kScheme) ||
      authorization[kScheme.size()] != ' ')
    return std::nullopt;
  size_t start = kScheme.size();
  while (start < authorization.size() && authorization[start] == ' ') ++start;
  return authorization.substr(start);
}

size_t RouteTable::body_limit(const std::string& pattern) const {
  return takes_image_body(pattern)
             ? std::max(options_.max_body_bytes, options_.max_image_body_bytes)
             : options_.max_body_bytes;
}

void RouteTable::get(const std::string& pattern, http::Handler h, bool run_inline) {
  svr_.add("GET", pattern, body_limit(pattern), std::move(h), run_inline);
}

void RouteTable::post(const std::string& pattern, http::Handler h) {
  // /v1/jobs takes a JSON body (--max-body) or the edits form with its image (--max-image-body).
  if (pattern == "/v1/jobs") {
    svr_.add("POST", pattern, options_.max_body_bytes, std::move(h), false,
             std::max(options_.max_body_bytes, options_.max_image_body_bytes));
    return;
  }
  svr_.add("POST", pattern, body_limit(pattern), std::move(h));
}

void RouteTable::del(const std::string& pattern, http::Handler h) {
  svr_.add("DELETE", pattern, body_limit(pattern), std::move(h));
}

void install_hooks(http::Server& svr, ServeContext& ctx) {
  const bool loopback = is_loopback_name(ctx.options.host);
  svr.set_pre_routing([&ctx, loopback](const http::Request& req, http::Response& res) {
    try {
      const std::string& host = req.get_header_value("Host");
      // DNS rebinding: a page on evil.example resolving to 127.0.0.1 still sends its own Host.
      // Only loopback literals, localhost and the --host the server was given pass.
      const std::string name = host_part(host);
      if (loopback && !host.empty() && !is_loopback_name(name) && name != ctx.options.host) {
        send_error(res, ApiError{403, "permission_error",
                                 "Host: this server only answers to loopback names", "Host"});
        return true;
      }
      // CORS is off: a browser request from another origin is refused outright (this also stops
      // cross-site form POSTs, which browsers send without a preflight). https:// is the same
      // page behind a TLS-terminating proxy.
      const std::string& origin = req.get_header_value("Origin");
      if (!origin.empty() && origin != "http://" + host && origin != "https://" + host) {
        send_error(res, ApiError{403, "permission_error",
                                 "Origin: cross-origin requests are not allowed", "Origin"});
        return true;
      }
      if (!ctx.options.api_key.empty() && req.path != "/healthz" && req.path != "/") {
        const std::optional<std::string> key = bearer_token(req.get_header_value("Authorization"));
        if (!key || !constant_time_equal(*key, ctx.options.api_key)) {
          res.set_header("WWW-Authenticate", "Bearer");
          send_error(res, ApiError{401, "authentication_error",
                                   "Authorization: a valid \"Bearer <api key>\" header is required",
                                   "Authorization"});
          return true;
        }
      }
    } catch (...) {
      res = http::Response();
      send_error(res, ApiError{500, "server_error", "internal error", ""});
      return true;
    }
    return false;
  });

  svr.set_error_handler([](const http::Request& req, http::Response& res) {
    ApiError e{res.status, "invalid_request_error", "", ""};
    if (!res.error_message.empty()) {  // the transport's own refusals (413, 431, 408, ...)
      e.message = res.error_message;
      e.param = res.error_param;
    } else if (res.status == 404) {
      e.type = "not_found_error";
      e.message = "no route for " + req.method + " " + req.path.substr(0, 200);
    } else if (res.status >= 500) {
      e.type = "server_error";
      e.message = "internal error";
    } else {
      e.message = "bad request";
    }
    send_error(res, e);
  });

  svr.set_logger([&ctx](const http::Request& req, const http::Response& res, double ms) {
    try {
      ctx.metrics.count_http(res.status);
      if (!ctx.options.access_log) return;
      // Never the API key, the headers, the query or the body (prompts stay private).
      nlohmann::ordered_json line = {
          {"ts", utc_now()},      {"remote", req.remote_addr},
          {"method", req.method}, {"path", req.path.substr(0, 200)},
          {"status", res.status}, {"ms", static_cast<int64_t>(ms * 1000) / 1000.0}};
      const std::string s = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
      std::fwrite(s.data(), 1, s.size(), stderr);
    } catch (...) {
      // Logging must never take a request down.
    }
  });
}

}  // namespace zimage::serve
