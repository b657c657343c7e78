// Logging through fmt, to stderr, every line prefixed with the rank once the runtime has set it.
// The library never prints to stdout: stdout belongs to the programs (tables, final results).
#pragma once

#include <pipeline/core/error.hpp>

#include <fmt/format.h>

#include <cstdio>

namespace pipeline {

enum class LogLevel { Debug, Info, Warn, Error };

inline LogLevel& log_threshold() {
  static LogLevel level = LogLevel::Info;
  return level;
}

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < log_threshold()) return;
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  fmt::print(stderr, "{}{}: {}\n", detail::rank_prefix(), kNames[static_cast<int>(level)],
             fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  log(LogLevel::Info, f, std::forward<Args>(args)...);
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  log(LogLevel::Warn, f, std::forward<Args>(args)...);
}

}  // namespace pipeline
