// Where a Redis server is: `redis://[[user]:password@]host[:port][/db]`, the URL form redis-cli
// and most client libraries take. Why its own file: it is untrusted text from a flag, parsed
// without any network library, and unit-tested on its own.
#pragma once

#include <string>
#include <string_view>

#include "zimage/status.h"

namespace zimage::broker {

struct RedisUrl {
  std::string host = "127.0.0.1";  // a name, an IPv4 address or an IPv6 address (no brackets)
  int port = 6379;
  std::string user;      // Redis 6 ACL user; empty = the default user
  std::string password;  // empty = no AUTH
  int db = 0;            // SELECT db when not 0
};

// Parses `text`; the error (kInvalidArgument) says what is wrong with which part, e.g.
// "redis URL 'redis://h:99999': port 99999 is outside 1..65535". Percent escapes (%40) are
// decoded in the user and password.
Result<RedisUrl> parse_redis_url(std::string_view text);

// The URL with the password masked ("redis://:***@host:6379/0"), for logs and messages.
std::string redacted(const RedisUrl& url);

}  // namespace zimage::broker
