// See redis_client.h.
#include "broker/redis_client.h"

#include <chrono>
#include <new>
#include <thread>

#if ZIMAGE_WITH_HIREDIS
#include <hiredis/hiredis.h>
#include <sys/time.h>
#endif

namespace zimage::broker {

const char* type_name(Reply::Type t) {
  switch (t) {
    case Reply::Type::kString:
      return "string";
    case Reply::Type::kStatus:
      return "status";
    case Reply::Type::kInteger:
      return "integer";
    case Reply::Type::kNil:
      return "nil";
    case Reply::Type::kArray:
      return "array";
    case Reply::Type::kError:
      return "error";
  }
  return "?";
}

Result<std::string> as_string(const Reply& r, const std::string& what) {
  if (r.type != Reply::Type::kString && r.type != Reply::Type::kStatus)
    return FormatError(what + ": expected a string reply, got " + type_name(r.type) +
                       (r.type == Reply::Type::kError ? " '" + r.str + "'" : ""));
  return r.str;
}

Result<int64_t> as_integer(const Reply& r, const std::string& what) {
  if (r.type != Reply::Type::kInteger)
    return FormatError(what + ": expected an integer reply, got " + std::string(type_name(r.type)));
  return r.integer;
}

Result<const std::vector<Reply>*> as_array(const Reply& r, size_t min_size,
                                           const std::string& what) {
  if (r.type != Reply::Type::kArray)
    return FormatError(what + ": expected an array reply, got " + std::string(type_name(r.type)));
  if (r.elements.size() < min_size)
    return FormatError(what + ": expected at least " + std::to_string(min_size) +
                       " elements, got " + std::to_string(r.elements.size()));
  return &r.elements;
}

Result<std::vector<std::pair<std::string, std::string>>> as_pairs(const Reply& r,
                                                                  const std::string& what) {
  ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* a, as_array(r, 0, what));
  if (a->size() % 2 != 0)
    return FormatError(what + ": expected field/value pairs, got " + std::to_string(a->size()) +
                       " elements");
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < a->size(); i += 2) {
    ZI_ASSIGN_OR_RETURN(std::string k, as_string((*a)[i], what + " field"));
    ZI_ASSIGN_OR_RETURN(std::string v, as_string((*a)[i + 1], what + " value of " + k));
    out.emplace_back(std::move(k), std::move(v));
  }
  return out;
}

#if ZIMAGE_WITH_HIREDIS

bool have_hiredis() {
  return true;
}

namespace {

constexpr int kMaxDepth = 16;

Result<Reply> convert(const redisReply* r, int depth) {
  if (r == nullptr) return FormatError("redis reply: null node");
  if (depth > kMaxDepth) return FormatError("redis reply: nested deeper than 16 levels");
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      out.type = r->type == REDIS_REPLY_STRING   ? Reply::Type::kString
                 : r->type == REDIS_REPLY_STATUS ? Reply::Type::kStatus
                                                 : Reply::Type::kError;
      if (r->len > 0 && r->str == nullptr) return FormatError("redis reply: string without data");
      if (r->len > 0) out.str.assign(r->str, static_cast<size_t>(r->len));
      return out;
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::kInteger;
      out.integer = r->integer;
      return out;
    case REDIS_REPLY_NIL:
      out.type = Reply::Type::kNil;
      return out;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::kArray;
      if (r->elements > 0 && r->element == nullptr)
        return FormatError("redis reply: array without elements");
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) {
        ZI_ASSIGN_OR_RETURN(Reply e, convert(r->element[i], depth + 1));
        out.elements.push_back(std::move(e));
      }
      return out;
    default:
      return FormatError("redis reply: unknown type " + std::to_string(r->type));
  }
}

timeval to_timeval(double s) {
  timeval tv{};
  const auto us = static_cast<int64_t>(s * 1e6);
  tv.tv_sec = static_cast<time_t>(us / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(us % 1000000);
  return tv;
}

struct ReplyFree {
  void operator()(void* p) const {
    if (p != nullptr) freeReplyObject(p);
  }
};

}  // namespace

Result<Reply> convert_reply(const redisReply* r) {
  try {
    return convert(r, 0);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("redis reply: out of memory copying the reply");
  }
}

struct RedisClient::Ctx {
  redisContext* c = nullptr;
  ~Ctx() {
    if (c != nullptr) redisFree(c);
  }
};

RedisClient::RedisClient(RedisUrl url, ClientOptions options)
    : url_(std::move(url)), options_(std::move(options)) {}
RedisClient::~RedisClient() = default;

bool RedisClient::connected() const {
  return ctx_ != nullptr && ctx_->c != nullptr && ctx_->c->err == 0;
}

void RedisClient::drop() {
  ctx_.reset();
}

Status RedisClient::open_once() {
  drop();
  auto ctx = std::make_unique<Ctx>();
  ctx->c =
      redisConnectWithTimeout(url_.host.c_str(), url_.port, to_timeval(options_.connect_timeout_s));
  const std::string where = redacted(url_);
  if (ctx->c == nullptr) return IoError("redis " + where + ": cannot allocate a connection");
  if (ctx->c->err != 0)
    return IoError("redis " + where + ": cannot connect: " + std::string(ctx->c->errstr));
  if (redisSetTimeout(ctx->c, to_timeval(options_.command_timeout_s)) != REDIS_OK)
    return IoError("redis " + where + ": cannot set the socket timeout");
  redisEnableKeepAlive(ctx->c);
  ctx_ = std::move(ctx);
  std::vector<std::vector<std::string>> setup;
  if (!url_.password.empty()) {
    if (url_.user.empty())
      setup.push_back({"AUTH", url_.password});
    else
      setup.push_back({"AUTH", url_.user, url_.password});
  }
  if (url_.db != 0) setup.push_back({"SELECT", std::to_string(url_.db)});
  if (!options_.client_name.empty()) setup.push_back({"CLIENT", "SETNAME", options_.client_name});
  for (const auto& cmd : setup) {
    auto r = command_raw(cmd);
    if (!r.ok()) {
      drop();
      return r.status().with_context("redis " + where);
    }
    if (r->type == Reply::Type::kError) {
      drop();
      return IoError("redis " + where + ": " + cmd[0] + " failed: " + r->str);
    }
  }
  return Status::Ok();
}

Status RedisClient::reconnect() {
  double wait = options_.backoff_initial_s;
  Status last;
  for (int attempt = 1;; ++attempt) {
    last = open_once();
    if (last.ok()) return last;
    const bool stopping = options_.stop != nullptr && options_.stop->load();
    if (stopping || (options_.reconnect_attempts > 0 && attempt >= options_.reconnect_attempts))
      return last;
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    wait = std::min(wait * 2, options_.backoff_max_s);
  }
}

Result<std::unique_ptr<RedisClient>> RedisClient::connect(const RedisUrl& url,
                                                          const ClientOptions& options) {
  try {
    std::unique_ptr<RedisClient> client(new RedisClient(url, options));
    ZI_TRY(client->reconnect());
    return client;
  } catch (const std::bad_alloc&) {
    return OutOfMemory("redis: out of memory");
  }
}

Result<Reply> RedisClient::command_raw(const std::vector<std::string>& args) {
  if (args.empty()) return InvalidArgument("redis: empty command");
  if (!connected()) ZI_TRY(reconnect());
  try {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    std::unique_ptr<void, ReplyFree> raw(
        redisCommandArgv(ctx_->c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (raw == nullptr) {
      const std::string why = ctx_->c->err != 0 ? ctx_->c->errstr : "no reply";
      drop();  // the stream is in an unknown state: never reuse it
      return IoError("redis " + args[0] + ": connection to " + redacted(url_) + " lost: " + why);
    }
    return convert_reply(static_cast<const redisReply*>(raw.get()));
  } catch (const std::bad_alloc&) {
    drop();
    return OutOfMemory("redis " + args[0] + ": out of memory");
  }
}

Result<Reply> RedisClient::command(const std::vector<std::string>& args) {
  ZI_ASSIGN_OR_RETURN(Reply r, command_raw(args));
  if (r.type == Reply::Type::kError) return InvalidArgument("redis " + args[0] + ": " + r.str);
  return r;
}

#else  // built without hiredis: every connection attempt says so

bool have_hiredis() {
  return false;
}

Result<Reply> convert_reply(const redisReply*) {
  return Unsupported("zimage was built without hiredis");
}

struct RedisClient::Ctx {};
RedisClient::RedisClient(RedisUrl url, ClientOptions options)
    : url_(std::move(url)), options_(std::move(options)) {}
RedisClient::~RedisClient() = default;
bool RedisClient::connected() const {
  return false;
}
void RedisClient::drop() {}
Status RedisClient::open_once() {
  return reconnect();
}
Status RedisClient::reconnect() {
  return Unsupported(
      "zimage was built without hiredis: the broker commands need it (install libhiredis-dev, "
      "e.g. with scripts/setup.sh, and configure again)");
}
Result<std::unique_ptr<RedisClient>> RedisClient::connect(const RedisUrl& url,
                                                          const ClientOptions& options) {
  RedisClient c(url, options);
  return c.reconnect();
}
Result<Reply> RedisClient::command_raw(const std::vector<std::string>&) {
  return reconnect();
}
Result<Reply> RedisClient::command(const std::vector<std::string>&) {
  return reconnect();
}

#endif

}  // namespace zimage::broker
