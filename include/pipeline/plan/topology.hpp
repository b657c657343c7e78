// Topology: the cluster as nested levels, innermost first — e.g. 8 GPUs per server at 300 GB/s,
// then 4 servers at 25 Gbit/s — plus the memory of one worker.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace pipeline {

struct TopologyLevel {
  int count = 1;                      // groups of the level below in one group of this level
  double bandwidth_bytes_per_s = 0;   // link bandwidth between those groups
};

struct Topology {
  std::vector<TopologyLevel> levels;          // innermost first
  std::optional<double> memory_bytes_per_worker;

  int workers() const {
    int n = 1;
    for (auto& l : levels) n *= l.count;
    return n;
  }
};

}  // namespace pipeline
