// The SIGTERM report of MPI programs (report_termination_on_sigterm in comms/mpi.hpp) and the
// wait notes it reads.
//
// A signal handler may not allocate, lock or format, so the waits prepare the text: WaitNote
// writes "<what>, at <context>" into one of two static slots and then publishes it by bumping a
// generation counter; the handler copies the slot of the generation it read and retries when the
// generation moved meanwhile (a writer on another thread reusing that slot). Everything the
// handler touches is a lock-free atomic or a char array, and it only calls write(2), sigaction(2)
// and raise(3). The line goes out in one write(2): under PIPE_BUF bytes, a write to mpirun's pipe
// is atomic, so the line is neither split by the other ranks' lines nor cut short when mpirun's
// SIGKILL follows its SIGTERM while the rank is still writing.
#include <pipeline/comm/comms/mpi.hpp>
#include <pipeline/core/error.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <string>

namespace pipeline {
namespace detail {
namespace {

constexpr std::size_t kNoteBytes = 1024;

struct TerminationState {
  std::atomic<bool> installed{false};
  std::atomic<unsigned> generation{0};  // slot generation % 2 holds the current note
  std::atomic<bool> waiting{false};     // inside a WaitNote now
  std::atomic<bool> aborting{false};    // note_aborting(): its own error is printed
  char slots[2][kNoteBytes] = {};
  char header[256] = {};  // "[rank 3] error: host node1, pid 4242: "
};

static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<unsigned>::is_always_lock_free,
              "the SIGTERM handler needs lock-free atomics");

TerminationState& state() {
  static TerminationState s;
  return s;
}

// Appends `text` to the line of `used` bytes (of `capacity`), cutting it at the end of the buffer.
void append(char* line, std::size_t& used, std::size_t capacity, const char* text) {
  while (*text != '\0' && used + 1 < capacity) line[used++] = *text++;
  line[used] = '\0';
}

void write_all(const char* text, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= static_cast<std::size_t>(w);
  }
}

void on_sigterm(int sig) {
  TerminationState& s = state();
  if (s.aborting.load(std::memory_order_acquire)) {
    std::raise(sig);  // SA_RESETHAND restored the default action
    return;
  }
  char note[kNoteBytes];
  note[0] = '\0';
  for (int attempt = 0; attempt < 4; ++attempt) {
    const unsigned g = s.generation.load(std::memory_order_acquire);
    std::memcpy(note, s.slots[g % 2], kNoteBytes);
    if (s.generation.load(std::memory_order_acquire) == g) break;
    note[0] = '\0';
  }
  note[kNoteBytes - 1] = '\0';

  char line[sizeof(s.header) + kNoteBytes + 512];
  std::size_t used = 0;
  const auto add = [&](const char* text) { append(line, used, sizeof(line), text); };
  add(s.header);
  add("mpirun ended this rank (SIGTERM) while it was ");
  if (note[0] == '\0') {
    add("not waiting for any peer yet");
  } else if (s.waiting.load(std::memory_order_acquire)) {
    add("waiting for ");
    add(note);
  } else {
    add("computing; its last wait was for ");
    add(note);
  }
  add(". Another rank of the job died or failed (or the job was interrupted): find the rank that "
      "mpirun names, or its own error line, in the job's output, fix that and run again\n");
  static_assert(sizeof(line) <= PIPE_BUF, "one atomic write to a pipe");
  write_all(line, used);

  // Die of the signal as without the handler: SA_RESETHAND restored the default action, which
  // ends the process now or, where the signal is blocked inside its handler, when this returns.
  std::raise(sig);
}

}  // namespace

bool termination_report_installed() {
  return state().installed.load(std::memory_order_relaxed);
}

void note_wait(std::string_view what, const WaitSettings& settings) {
  TerminationState& s = state();
  std::string where;
  if (settings.context) {
    try {
      where = settings.context();
    } catch (...) {
      where.clear();
    }
  }
  const unsigned next = s.generation.load(std::memory_order_relaxed) + 1;
  char* slot = s.slots[next % 2];
  const auto r =
      fmt::format_to_n(slot, kNoteBytes - 1, "{}{}{}", what, where.empty() ? "" : ", at ", where);
  slot[std::min<std::size_t>(r.size, kNoteBytes - 1)] = '\0';
  s.generation.store(next, std::memory_order_release);
  s.waiting.store(true, std::memory_order_release);
}

void note_aborting() {
  state().aborting.store(true, std::memory_order_release);
}

void note_wait_ended() {
  state().waiting.store(false, std::memory_order_release);
}

}  // namespace detail

void report_termination_on_sigterm() {
  detail::TerminationState& s = detail::state();
  const std::string header =
      fmt::format("{}error: {}: ", detail::rank_prefix(), detail::host_and_pid());
  const std::size_t n = std::min(header.size(), sizeof(s.header) - 1);
  std::memcpy(s.header, header.data(), n);
  s.header[n] = '\0';

  struct sigaction action {};
  action.sa_handler = detail::on_sigterm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;
  PIPELINE_CHECK(::sigaction(SIGTERM, &action, nullptr) == 0,
                 "cannot install the SIGTERM handler: {}", std::strerror(errno));
  s.installed.store(true, std::memory_order_release);
}

}  // namespace pipeline
