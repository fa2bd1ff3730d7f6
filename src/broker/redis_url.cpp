// See redis_url.h.
#include "broker/redis_url.h"

#include <cstdint>

namespace zimage::broker {

namespace {

bool parse_uint(std::string_view s, int64_t max, int64_t* out) {
  if (s.empty() || s.size() > 10) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > max) return false;
  *out = v;
  return true;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool percent_decode(std::string_view s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out->push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return false;
    const int hi = hex_value(s[i + 1]);
    const int lo = hex_value(s[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

bool valid_host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

}  // namespace

Result<RedisUrl> parse_redis_url(std::string_view text) {
  const std::string quoted = "redis URL '" + std::string(text) + "': ";
  constexpr std::string_view kScheme = "redis://";
  if (text.substr(0, kScheme.size()) != kScheme) {
    if (text.find("://") != std::string_view::npos)
      return InvalidArgument(quoted + "only the redis:// scheme is supported (no TLS rediss://, " +
                             "no unix sockets)");
    return InvalidArgument(quoted + "must start with redis:// (redis://host:port[/db])");
  }
  std::string_view rest = text.substr(kScheme.size());
  for (char c : rest)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return InvalidArgument(quoted + "contains a space or control character");
  RedisUrl url;
  // userinfo: everything before the last '@' (a password may hold '@' only as %40)
  const size_t at = rest.find('@');
  if (at != std::string_view::npos) {
    if (rest.find('@', at + 1) != std::string_view::npos)
      return InvalidArgument(quoted + "more than one '@' (write '@' in a password as %40)");
    const std::string_view info = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = info.find(':');
    const std::string_view user = colon == std::string_view::npos ? info : info.substr(0, colon);
    const std::string_view pass =
        colon == std::string_view::npos ? std::string_view() : info.substr(colon + 1);
    if (colon == std::string_view::npos)  // "redis://secret@host": redis-cli reads it as password
      return InvalidArgument(quoted + "credentials must be ':password@' or 'user:password@'");
    if (!percent_decode(user, &url.user) || !percent_decode(pass, &url.password))
      return InvalidArgument(quoted + "bad percent escape in the credentials");
    if (url.password.empty()) return InvalidArgument(quoted + "empty password before '@'");
  }
  // db: after the first '/' of what is left
  const size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    int64_t v = 0;
    if (!db.empty()) {
      if (!parse_uint(db, 1'000'000, &v))
        return InvalidArgument(quoted + "database '" + std::string(db) +
                               "' is not a whole number in 0..1000000");
      url.db = static_cast<int>(v);
    }
  }
  std::string_view port;
  if (!hostport.empty() && hostport.front() == '[') {  // [IPv6]:port
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos) return InvalidArgument(quoted + "'[' without ']'");
    url.host = std::string(hostport.substr(1, close - 1));
    for (char c : url.host)
      if (hex_value(c) < 0 && c != ':' && c != '.')
        return InvalidArgument(quoted + "'" + url.host + "' is not an IPv6 address");
    const std::string_view after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return InvalidArgument(quoted + "text after ']' is not ':port'");
      port = after.substr(1);
      if (port.empty()) return InvalidArgument(quoted + "empty port after ':'");
    }
  } else {
    const size_t colon = hostport.find(':');
    url.host = std::string(hostport.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = hostport.substr(colon + 1);
      if (port.empty()) return InvalidArgument(quoted + "empty port after ':'");
    }
    for (char c : url.host)
      if (!valid_host_char(c))
        return InvalidArgument(quoted + "host '" + url.host + "' has a character '" +
                               std::string(1, c) + "' not allowed in a host name");
  }
  if (url.host.empty()) return InvalidArgument(quoted + "no host (redis://host:port)");
  if (!port.empty()) {
    int64_t v = 0;
    if (!parse_uint(port, 1'000'000'000, &v) || v < 1 || v > 65535)
      return InvalidArgument(quoted + "port " + std::string(port) + " is outside 1..65535");
    url.port = static_cast<int>(v);
  }
  return url;
}

std::string redacted(const RedisUrl& url) {
  std::string s = "redis://";
  if (!url.password.empty()) s += url.user + ":***@";
  s += url.host.find(':') != std::string::npos ? "[" + url.host + "]" : url.host;
  return s + ":" + std::to_string(url.port) + "/" + std::to_string(url.db);
}

}  // namespace zimage::broker
