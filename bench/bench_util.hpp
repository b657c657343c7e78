// What the benchmarks share: the machine description printed above each table, process CPU time
// (on a shared machine wall time also counts other programs' turns), and appending a table to a
// results file such as bench/RESULTS.md.
#pragma once

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

namespace pipeline::bench {

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

}  // namespace pipeline::bench
