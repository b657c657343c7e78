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
#include <string>

namespace pipeline {
namespace {

struct PreemptionState {
  std::atomic<int> signal{0};
  std::atomic<bool> installed{false};
  struct sigaction previous_term {};
  struct sigaction previous_int {};
  char line[512] = {};
  char repeat_line[256] = {};
};

static_assert(std::atomic<int>::is_always_lock_free);

PreemptionState& state() {
  static PreemptionState s;
  return s;
}

void write_line(const char* text) {
  std::size_t n = std::strlen(text);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w <= 0) break;
    text += w;
    n -= static_cast<std::size_t>(w);
  }
}

void on_signal(int sig) {
  PreemptionState& s = state();
  int expected = 0;
  if (s.signal.compare_exchange_strong(expected, sig)) {
    write_line(s.line);
    return;
  }
  // A repeated SIGTERM is the same request: a scheduler signals every process of a job and
  // mpirun passes on the one it got, so a rank sees two; ending it then would lose the
  // checkpoint the first one asked for.
  if (sig == SIGTERM) {
    write_line(s.repeat_line);
    return;
  }
  // SIGINT again (Ctrl-C twice): what was there before decides (a report, or the default action).
  ::sigaction(SIGTERM, &s.previous_term, nullptr);
  ::sigaction(SIGINT, &s.previous_int, nullptr);
  std::raise(sig);
}

// Copies `text` into `out`, cut to fit and still ending in a newline.
template <std::size_t N>
void keep_line(char (&out)[N], const std::string& text) {
  std::strncpy(out, text.c_str(), N - 2);
  if (text.size() >= N - 1) out[N - 2] = '\n';
}

}  // namespace

void catch_preemption_signals() {
  PreemptionState& s = state();
  if (s.installed.exchange(true)) return;
  keep_line(s.line, fmt::format("{}info: stop requested (SIGTERM/SIGINT): finishing the current "
                                "step, then writing a checkpoint and exiting; SIGINT again (or "
                                "SIGKILL) stops at once (mpirun also sends SIGTERM when another "
                                "rank fails: then that rank's error is the cause)\n",
                                detail::rank_prefix()));
  keep_line(s.repeat_line,
            fmt::format("{}info: SIGTERM again: still stopping after the agreed "
                        "step and its checkpoint (SIGINT or SIGKILL stops at once)\n",
                        detail::rank_prefix()));
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a signal must not fail the system calls it interrupts
  PIPELINE_CHECK(::sigaction(SIGTERM, &action, &s.previous_term) == 0 &&
                     ::sigaction(SIGINT, &action, &s.previous_int) == 0,
                 "cannot install the preemption signal handlers: {}", std::strerror(errno));
  // A signal ignored when the program started stays ignored (SIGINT of a background job of a
  // non-interactive shell, nohup's): whoever started it meant it not to reach the program.
  if (s.previous_term.sa_handler == SIG_IGN) ::sigaction(SIGTERM, &s.previous_term, nullptr);
  if (s.previous_int.sa_handler == SIG_IGN) ::sigaction(SIGINT, &s.previous_int, nullptr);
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
