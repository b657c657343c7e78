// Progress reporting for the example programs: a redrawn bar with loss and samples/s on a
// terminal; plain lines every few seconds (step, loss, samples/s, ETA) everywhere else, so that a
// batch job's log file stays readable.
//
// Under mpirun a rank's stdout is a pseudo-terminal that mpirun forwards wherever its own output
// goes — a log file as often as a terminal — so a process started by an MPI launcher prints
// lines. PIPELINE_PROGRESS=bar or =lines overrides the choice.
#pragma once

#include <fmt/format.h>

#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace pipeline::examples {

class Progress {
 public:
  // Steps count up to `total`; this run starts after step `start` (a resumed run).
  Progress(std::string label, long total, long start = 0, double seconds_between_lines = 5.0)
      : m_label(std::move(label)),
        m_total(total),
        m_start(start),
        m_every_s(seconds_between_lines),
        m_bar(use_bar()),
        m_t0(Clock::now()),
        m_last_line(m_t0) {}

  void update(long step, double loss, double samples_per_s) {
    const auto now = Clock::now();
    if (m_bar) {
      constexpr int kWidth = 30;
      int filled = m_total > 0 ? static_cast<int>(kWidth * step / m_total) : 0;
      fmt::print("\r{} [{:<{}}] {}/{} loss {:.4f} {:.0f} samples/s", m_label,
                 std::string(static_cast<std::size_t>(filled), '='), kWidth, step, m_total, loss,
                 samples_per_s);
      std::fflush(stdout);
      m_dirty = true;
      return;
    }
    if (std::chrono::duration<double>(now - m_last_line).count() < m_every_s && step != m_total)
      return;
    m_last_line = now;
    fmt::print("{} step {}/{} loss {:.4f} samples/s {:.1f} eta {}\n", m_label, step, m_total, loss,
               samples_per_s, eta(step, now));
    std::fflush(stdout);
  }

  // Ends the bar's line so that the next output starts on a fresh one.
  void finish() {
    if (m_dirty) fmt::print("\n");
    m_dirty = false;
  }

 private:
  using Clock = std::chrono::steady_clock;

  static bool use_bar() {
    if (const char* v = std::getenv("PIPELINE_PROGRESS")) {
      if (std::string(v) == "bar") return true;
      if (std::string(v) == "lines") return false;
    }
    const bool launched =
        std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
    return !launched && isatty(fileno(stdout));
  }

  // Remaining time at the pace of this run so far, as 1h02m03s.
  std::string eta(long step, Clock::time_point now) const {
    const double elapsed = std::chrono::duration<double>(now - m_t0).count();
    if (step <= m_start || elapsed <= 0) return "?";
    const long s = static_cast<long>(elapsed / static_cast<double>(step - m_start) *
                                     static_cast<double>(m_total - step));
    if (s >= 3600) return fmt::format("{}h{:02d}m{:02d}s", s / 3600, s / 60 % 60, s % 60);
    if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
    return fmt::format("{}s", s);
  }

  std::string m_label;
  long m_total, m_start;
  double m_every_s;
  bool m_bar;
  bool m_dirty = false;
  Clock::time_point m_t0, m_last_line;
};

}  // namespace pipeline::examples
