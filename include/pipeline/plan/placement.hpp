// Placement: which host each rank of a plan runs on, so that a multi-host `mpirun` puts ranks
// where the planner assumed they are.
//
// The partitioner numbers workers in topology order: worker w sits in group w / g_l of level l,
// where g_l is the product of the counts of the levels inside l, and two ranks talk at the
// bandwidth of the innermost level whose group holds both. A host holds the workers of the
// innermost `host_level` levels (host_level = 1: the innermost level is one host, e.g. 8 GPUs
// per server inside 4 servers; host_level = 0: every worker is a host of its own, the one-level
// topology of a network of single-worker machines), so rank r runs on host r / g_host_level.
//
// The hosts come from an OpenMPI hostfile ("NAME [slots=N] [max_slots=N]", '#' comments); a
// host's slots, when given, bound the ranks placed on it. The result is written as an OpenMPI
// rankfile ("rank R=HOST slot=CORES") for `mpirun --rankfile FILE`, each rank bound to
// `cores_per_rank` cores of its host (its local index times that many, onwards).
#pragma once

#include <pipeline/plan/plan.hpp>
#include <pipeline/plan/topology.hpp>

#include <optional>
#include <string>
#include <vector>

namespace pipeline {

struct HostEntry {
  std::string name;
  std::optional<int> slots;  // ranks that may run there; none: no bound
};

struct PlacementOptions {
  // Innermost levels inside one host; none: 1 when the topology has several levels, else 0.
  std::optional<int> host_level;
  int cores_per_rank = 1;  // cores each rank is bound to on its host
};

struct RankPlacement {
  int rank = 0;
  std::string host;
  int local_index = 0;  // among the ranks on that host
  int first_core = 0;   // bound to cores [first_core, first_core + cores)
  int cores = 1;
};

// Parses an OpenMPI hostfile's text; `source` names it in errors.
std::vector<HostEntry> parse_hostfile(const std::string& text,
                                      const std::string& source = "hostfile");
std::vector<HostEntry> read_hostfile(const std::string& path);

// The host level options resolve to for this topology (checked against its levels).
int resolve_host_level(const Topology& topology, const PlacementOptions& options);

// One entry per rank 0..plan.workers-1. A plan for fewer workers than an untyped topology has
// (cost planning's sub-clusters) runs on its first workers in topology order. Throws ConfigError
// naming what is missing when the plan needs more hosts than `hosts` lists, more ranks on a host
// than its slots, or its ranks do not fit the topology.
std::vector<RankPlacement> place_ranks(const Plan& plan, const Topology& topology,
                                       const std::vector<HostEntry>& hosts,
                                       const PlacementOptions& options = {});

// One line for people: "ranks 0-7 on a, 8-15 on b".
std::string describe_placement(const std::vector<RankPlacement>& placement);

// The OpenMPI rankfile text of a placement, and writing it (atomically).
std::string rankfile_text(const std::vector<RankPlacement>& placement);
void write_rankfile(const std::string& path, const std::vector<RankPlacement>& placement);

}  // namespace pipeline
