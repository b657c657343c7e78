// Errors: one exception hierarchy and one check macro family.
//
// Every failure the library can detect is reported by throwing pipeline::Error (or a subclass)
// with a message that says what was wrong, with which value, and what to do about it. Return
// codes of CUDA, cuBLAS, cuDNN, NCCL and MPI are checked through PIPELINE_<LIB>_CHECK macros
// that all end in pipeline::detail::fail(), which adds the expression and file:line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace pipeline {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad configuration or user input: flags, JSON files, plans, shapes that do not fit.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A file that cannot be read or written, or whose contents are truncated or corrupt.
class IoError : public Error {
 public:
  using Error::Error;
};

// Failures reported by device and communication libraries.
class CudaError : public Error {
 public:
  using Error::Error;
};
class MpiError : public Error {
 public:
  using Error::Error;
};
class NcclError : public Error {
 public:
  using Error::Error;
};
// A point-to-point or collective wait that did not complete within its timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

namespace detail {

// The rank prefix added to every error and log line; set once by the runtime after MPI_Init.
inline int& current_rank() {
  static int rank = -1;
  return rank;
}

// The rank of the calling thread when the ranks of a job are threads of one process (an
// in-process pipeline); -1 on other threads, which take the process's current_rank().
inline int& thread_rank() {
  thread_local int rank = -1;
  return rank;
}

inline std::string rank_prefix() {
  const int r = thread_rank() >= 0 ? thread_rank() : current_rank();
  return r < 0 ? std::string() : fmt::format("[rank {}] ", r);
}

// Sets the calling thread's rank for its scope (errors and log lines of that thread name it).
class ThreadRankScope {
 public:
  explicit ThreadRankScope(int rank) : m_previous(std::exchange(thread_rank(), rank)) {}
  ~ThreadRankScope() { thread_rank() = m_previous; }
  ThreadRankScope(const ThreadRankScope&) = delete;
  ThreadRankScope& operator=(const ThreadRankScope&) = delete;

 private:
  int m_previous;
};

template <typename E = Error>
[[noreturn]] inline void fail(std::string_view expr, const char* file, int line,
                              const std::string& message) {
  if (expr.empty()) throw E(fmt::format("{}{} ({}:{})", rank_prefix(), message, file, line));
  throw E(fmt::format("{}{} ({}:{}, check `{}`)", rank_prefix(), message, file, line, expr));
}

// The message of `e` without the "[rank N] " that fail() puts first: for a line that logs it
// under its own prefix.
inline std::string_view unprefixed_message(const std::exception& e) {
  std::string_view m = e.what();
  const std::string prefix = rank_prefix();
  if (m.starts_with(prefix)) m.remove_prefix(prefix.size());
  return m;
}

}  // namespace detail
}  // namespace pipeline

// PIPELINE_CHECK(cond, "format {}", args...) throws pipeline::Error when cond is false.
#define PIPELINE_CHECK(cond, ...)                                                        \
  do {                                                                                   \
    if (!(cond)) [[unlikely]]                                                            \
      ::pipeline::detail::fail<::pipeline::Error>(#cond, __FILE__, __LINE__,             \
                                                  ::fmt::format(__VA_ARGS__));           \
  } while (0)

// The same with a chosen exception type, e.g. PIPELINE_CHECK_AS(ConfigError, n > 0, "...").
#define PIPELINE_CHECK_AS(type, cond, ...)                                                   \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      ::pipeline::detail::fail<::pipeline::type>(#cond, __FILE__, __LINE__,                  \
                                                 ::fmt::format(__VA_ARGS__));                \
  } while (0)

// Throw unconditionally with a formatted message (for switch defaults and parse failures).
#define PIPELINE_FAIL(type, ...) \
  ::pipeline::detail::fail<::pipeline::type>("", __FILE__, __LINE__, ::fmt::format(__VA_ARGS__))
