// A small synchronous Redis client over hiredis (Debian's libhiredis), returning Status/Result.
// Why a wrapper: hiredis hands back raw C trees (redisReply) whose type, pointers and sizes the
// caller must check before every read; here each reply is checked once and copied into a plain
// C++ value (Reply), connections are RAII, a broken connection is dropped and re-opened with
// backoff, and no exception or abort escapes. One RedisClient per thread (hiredis contexts are
// not thread-safe). Built without hiredis, connect() fails with "built without hiredis".
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "broker/redis_url.h"
#include "zimage/status.h"

struct redisReply;  // hiredis

namespace zimage::broker {

// One reply, RESP2 types. Error replies inside an array (EXEC) stay kError elements.
struct Reply {
  enum class Type { kString, kStatus, kInteger, kNil, kArray, kError };
  Type type = Type::kNil;
  std::string str;  // kString (binary safe), kStatus, kError
  int64_t integer = 0;
  std::vector<Reply> elements;  // kArray
  bool is_nil() const { return type == Type::kNil; }
};
const char* type_name(Reply::Type t);  // "string", "status", ...

// Copies a hiredis reply, checking every node: a known type, a non-null string when its length
// is not 0, non-null elements, nesting at most 16 deep. kFormat names what is wrong.
Result<Reply> convert_reply(const redisReply* r);

// Checked reads; `what` names the value in the error ("XPENDING entry 0 delivery count").
Result<std::string> as_string(const Reply& r, const std::string& what);  // string or status
Result<int64_t> as_integer(const Reply& r, const std::string& what);
// An array of at least `min_size` elements.
Result<const std::vector<Reply>*> as_array(const Reply& r, size_t min_size,
                                           const std::string& what);
// A flat [field, value, field, value, ...] array (HGETALL, stream entry fields) as pairs.
Result<std::vector<std::pair<std::string, std::string>>> as_pairs(const Reply& r,
                                                                  const std::string& what);

struct ClientOptions {
  double connect_timeout_s = 5;
  double command_timeout_s = 10;  // per reply; keep it above any BLOCK time used
  // Re-connection after a broken connection: attempts (0 = until `stop` is set), waiting
  // backoff_initial_s, doubling up to backoff_max_s, between attempts.
  int reconnect_attempts = 5;
  double backoff_initial_s = 0.1;
  double backoff_max_s = 5;
  const std::atomic<bool>* stop = nullptr;  // ends a reconnect loop early (worker shutdown)
  std::string client_name;                  // CLIENT SETNAME, when not empty (no spaces)
};

class RedisClient {
 public:
  // Connects (with the reconnect policy), authenticates and selects the database.
  static Result<std::unique_ptr<RedisClient>> connect(const RedisUrl& url,
                                                      const ClientOptions& options);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Sends one command (binary-safe arguments) and reads its reply. A dropped connection is
  // re-opened first. Failures: kIo for the connection (the connection is then dropped: a
  // later call reconnects: worth retrying); kInvalidArgument for an error reply, the server
  // refusing the command ("redis XGROUP: BUSYGROUP ..."); kFormat for a malformed reply.
  Result<Reply> command(const std::vector<std::string>& args);
  // As command(), but an error reply comes back as a Reply of type kError, not a Status.
  Result<Reply> command_raw(const std::vector<std::string>& args);

  bool connected() const;
  // Drops the connection and opens a new one with the backoff policy.
  Status reconnect();
  const RedisUrl& url() const { return url_; }

 private:
  RedisClient(RedisUrl url, ClientOptions options);
  Status open_once();
  void drop();

  struct Ctx;
  RedisUrl url_;
  ClientOptions options_;
  std::unique_ptr<Ctx> ctx_;
};

// True when zimage was built with hiredis (the broker commands work).
bool have_hiredis();

}  // namespace zimage::broker
