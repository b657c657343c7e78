// The preemption handlers. A signal handler may only touch lock-free atomics and call
// async-signal-safe functions: the line it writes is formatted when the handlers are installed.
#include <pipeline/runtime/preemption.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace pipeline {
namespace {

struct PreemptionState {
  std::atomic<int> signal{0};
  std::atomic<bool> installed{false};
  struct sigaction previous_term {};
  struct sigaction previous_int {};
  char line[512] = {};
};

static_assert(std::atomic<int>::is_always_lock_free);

PreemptionState& state() {
  static PreemptionState s;
  return s;
}

void on_signal(int sig) {
  PreemptionState& s = state();
  int expected = 0;
  if (!s.signal.compare_exchange_strong(expected, sig)) {
    // The second signal: what was there before decides (a report, or the default action).
    ::sigaction(SIGTERM, &s.previous_term, nullptr);
    ::sigaction(SIGINT, &s.previous_int, nullptr);
    std::raise(sig);
    return;
  }
  const char* text = s.line;
  std::size_t n = std::strlen(text);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w <= 0) break;
    text += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

void catch_preemption_signals() {
  PreemptionState& s = state();
  if (s.installed.exchange(true)) return;
  const std::string line = fmt::format(
      "{}info: stop requested (SIGTERM/SIGINT): finishing the current step, then writing a "
      "checkpoint and exiting; signal again to stop at once (mpirun also sends SIGTERM when "
      "another rank fails: then that rank's error is the cause)\n",
      detail::rank_prefix());
  std::strncpy(s.line, line.c_str(), sizeof(s.line) - 2);
  if (line.size() >= sizeof(s.line) - 1) s.line[sizeof(s.line) - 2] = '\n';
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a signal must not fail the system calls it interrupts
  PIPELINE_CHECK(::sigaction(SIGTERM, &action, &s.previous_term) == 0 &&
                     ::sigaction(SIGINT, &action, &s.previous_int) == 0,
                 "cannot install the preemption signal handlers: {}", std::strerror(errno));
}

bool preemption_requested() {
  return state().signal.load(std::memory_order_relaxed) != 0;
}

int preemption_signal() {
  return state().signal.load(std::memory_order_relaxed);
}

void reset_preemption_request() {
  state().signal.store(0);
}

}  // namespace pipeline
