// What the benchmarks share: random input tensors, the machine description printed above each
// table, process CPU time (on a shared machine wall time also counts other programs' turns), and
// appending a table to a results file such as bench/RESULTS.md.
#pragma once

#include <pipeline/core/rng.hpp>
#include <pipeline/core/tensor.hpp>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

namespace pipeline::bench {

// A tensor of uniform values in [-1, 1), drawn from Rng(seed).
inline Tensor random_tensor(const Shape& s, std::uint64_t seed) {
  Tensor t = Tensor::empty(s);
  Rng(seed).fill_uniform(t, -1.f, 1.f);
  return t;
}

// The CPU model from /proc/cpuinfo, or "unknown CPU".
inline std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// The 1-minute load average: wall-clock columns are only meaningful when it is below the cores.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  in >> first;
  return first.empty() ? "?" : first;
}

// CPU seconds of this process, summed over its threads.
inline double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Appends `header` and `table` to `path` as a fenced block; false (after saying so on stderr)
// when the file cannot be written.
inline bool append_results(const std::string& path, const std::string& header,
                           const std::string& table) {
  std::ofstream out(path, std::ios::app);
  out << "\n```\n" << header << table << "```\n";
  if (!out) {
    std::fprintf(stderr, "could not append to %s\n", path.c_str());
    return false;
  }
  return true;
}

// Runs `command` through the shell and returns its standard output's lines; *status is
// pclose's status (-1 when it could not be started).
inline std::vector<std::string> run_lines(const std::string& command, int* status) {
  std::vector<std::string> lines;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return lines;
  }
  std::string line;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      lines.push_back(line);
      line.clear();
    }
  }
  if (!line.empty()) lines.push_back(line);
  *status = pclose(p);
  return lines;
}

// `s` single-quoted for the shell.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

}  // namespace pipeline::bench
