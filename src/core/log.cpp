#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace zimage {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("ZIMAGE_LOG");
  if (!env) return LogLevel::kWarn;
  if (!std::strcmp(env, "error")) return LogLevel::kError;
  if (!std::strcmp(env, "info")) return LogLevel::kInfo;
  if (!std::strcmp(env, "debug")) return LogLevel::kDebug;
  // Read during static initialisation, where no error can be returned: a value it does not take
  // is named on stderr once, and the default kept.
  if (std::strcmp(env, "warn") != 0)
    std::fprintf(stderr,
                 "[zimage warn] ZIMAGE_LOG='%s' is not one of error, warn, info, debug; "
                 "logging warnings and errors\n",
                 env);
  return LogLevel::kWarn;
}

std::atomic<int> g_level{static_cast<int>(initial_level())};
std::mutex g_mutex;
// Info and debug lines carry the seconds since the library was loaded (static initialisation,
// close enough to the process start), so `--verbose` is a per-phase breakdown of a whole run.
const std::chrono::steady_clock::time_point g_start = std::chrono::steady_clock::now();

}  // namespace

void set_log_level(LogLevel level) {
  g_level = static_cast<int>(level);
}
LogLevel log_level() {
  return static_cast<LogLevel>(g_level.load());
}

void log_message(LogLevel level, const char* fmt, ...) {
  static const char* const kNames[] = {"error", "warn", "info", "debug"};
  std::lock_guard<std::mutex> lock(g_mutex);
  if (level >= LogLevel::kInfo) {
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
    std::fprintf(stderr, "[zimage %s %.3fs] ", kNames[static_cast<int>(level)], t);
  } else {
    std::fprintf(stderr, "[zimage %s] ", kNames[static_cast<int>(level)]);
  }
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fputc('\n', stderr);
}

}  // namespace zimage
