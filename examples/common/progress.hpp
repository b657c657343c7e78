// Progress reporting for the example programs: a redrawn bar with loss and samples/s when stdout
// is a terminal, plain log lines (every `every` steps) when it is a file or pipe, so logs stay
// readable in CI and under mpirun.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <unistd.h>

namespace pipeline::examples {

class Progress {
 public:
  Progress(std::string label, long total, long every = 50)
      : m_label(std::move(label)), m_total(total), m_every(every), m_tty(isatty(fileno(stdout))) {}

  void update(long step, double loss, double samples_per_s) {
    if (m_tty) {
      constexpr int kWidth = 30;
      int filled = m_total > 0 ? static_cast<int>(kWidth * step / m_total) : 0;
      fmt::print("\r{} [{:<{}}] {}/{} loss {:.4f} {:.0f} samples/s", m_label,
                 std::string(static_cast<std::size_t>(filled), '='), kWidth, step, m_total, loss,
                 samples_per_s);
      std::fflush(stdout);
      m_dirty = true;
    } else if (step % m_every == 0 || step == m_total) {
      fmt::print("{} step {}/{} loss {:.4f} samples/s {:.1f}\n", m_label, step, m_total, loss,
                 samples_per_s);
      std::fflush(stdout);
    }
  }

  // Ends the bar's line so that the next output starts on a fresh one.
  void finish() {
    if (m_dirty) fmt::print("\n");
    m_dirty = false;
  }

 private:
  std::string m_label;
  long m_total, m_every;
  bool m_tty;
  bool m_dirty = false;
};

}  // namespace pipeline::examples
