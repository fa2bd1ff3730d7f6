// Minimal leveled logging to stderr. The level comes from ZIMAGE_LOG (error, warn, info, debug)
// or set_log_level(); the CLI's --verbose raises it to info.
#pragma once

#include <cstdarg>

namespace zimage {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace zimage

#define ZI_LOG(level, ...)                                                  \
  do {                                                                      \
    if (static_cast<int>(level) <= static_cast<int>(::zimage::log_level())) \
      ::zimage::log_message(level, __VA_ARGS__);                            \
  } while (0)
#define ZI_ERROR(...) ZI_LOG(::zimage::LogLevel::kError, __VA_ARGS__)
#define ZI_WARN(...) ZI_LOG(::zimage::LogLevel::kWarn, __VA_ARGS__)
#define ZI_INFO(...) ZI_LOG(::zimage::LogLevel::kInfo, __VA_ARGS__)
#define ZI_DEBUG(...) ZI_LOG(::zimage::LogLevel::kDebug, __VA_ARGS__)
