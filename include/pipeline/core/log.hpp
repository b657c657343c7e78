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

// Raises the threshold for a scope (work whose warnings another step repeats, or expects), and
// restores it on the way out.
class LogThresholdScope {
 public:
  explicit LogThresholdScope(LogLevel level) : m_saved(log_threshold()) { log_threshold() = level; }
  ~LogThresholdScope() { log_threshold() = m_saved; }
  LogThresholdScope(const LogThresholdScope&) = delete;
  LogThresholdScope& operator=(const LogThresholdScope&) = delete;

 private:
  LogLevel m_saved;
};

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
