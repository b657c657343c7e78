// Topology: the cluster as nested levels, innermost first — e.g. 8 GPUs per server at 300 GB/s,
// then 4 servers at 25 Gbit/s — plus the memory of one worker, and optionally the workers' types
// and prices.
//
// Worker types (mixed clusters: 8 H100 and 16 A100, or GPUs and CPU nodes): `types` lists each
// kind with its count, memory and price per worker-hour. The types' counts add up to the
// workers of the levels, and a typed topology has one level, its network: a stage may be placed
// on any type, so the planner models every link at that one bandwidth rather than guess where
// each type sits in a hierarchy. Each type is timed from its own profile
// (plan/device_profiles.hpp). An untyped topology has one kind of worker, whose memory is
// `memory_bytes_per_worker` and whose price is `price_per_worker_hour`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pipeline {

struct TopologyLevel {
  int count = 1;                      // groups of the level below in one group of this level
  double bandwidth_bytes_per_s = 0;   // link bandwidth between those groups
};

// One kind of worker of a mixed cluster.
struct WorkerType {
  std::string name;                              // "h100"; matches a profile's type and plan.json "device"
  int count = 0;                                 // workers of this type
  std::optional<double> memory_bytes_per_worker;  // none: the topology's memory_bytes_per_worker
  std::optional<double> price_per_worker_hour;    // currency units; none: the topology's price
};

struct Topology {
  std::vector<TopologyLevel> levels;          // innermost first
  std::optional<double> memory_bytes_per_worker;
  std::optional<double> price_per_worker_hour;  // currency units per worker and hour
  std::vector<WorkerType> types;                // empty: one kind of worker

  int workers() const {
    int n = 1;
    for (auto& l : levels) n *= l.count;
    return n;
  }
  bool typed() const { return !types.empty(); }
};

}  // namespace pipeline
