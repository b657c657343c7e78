#include <pipeline/plan/placement.hpp>

#include <pipeline/core/error.hpp>

#include "../core/output_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

namespace pipeline {

namespace {

int parse_count(const std::string& value, const std::string& token, const std::string& where) {
  int n = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  PIPELINE_CHECK_AS(ConfigError, ec == std::errc() && ptr == value.data() + value.size() && n >= 1,
                    "{}: '{}' needs a positive whole number of slots", where, token);
  return n;
}

}  // namespace

std::vector<HostEntry> parse_hostfile(const std::string& text, const std::string& source) {
  std::vector<HostEntry> hosts;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::string name, token;
    if (!(words >> name)) continue;
    const std::string where = fmt::format("{} line {}", source, number);
    PIPELINE_CHECK_AS(ConfigError, name.find('=') == std::string::npos,
                      "{}: expected a host name first, got '{}' (lines read NAME [slots=N])", where,
                      name);
    PIPELINE_CHECK_AS(ConfigError, seen.insert(name).second,
                      "{}: host '{}' is listed twice; give it once with its slots", where, name);
    HostEntry host{name, std::nullopt};
    std::optional<int> max_slots;
    // OpenMPI's keywords: slots (count is its old name) and max_slots; others (cpu bindings and
    // the like) do not bear on placement and are left to mpirun.
    while (words >> token) {
      const auto eq = token.find('=');
      const std::string key = token.substr(0, eq),
                        value = eq == std::string::npos ? "" : token.substr(eq + 1);
      if (key == "slots" || key == "count")
        host.slots = parse_count(value, token, where);
      else if (key == "max_slots" || key == "max-slots")
        max_slots = parse_count(value, token, where);
    }
    if (max_slots) host.slots = std::min(host.slots.value_or(*max_slots), *max_slots);
    hosts.push_back(std::move(host));
  }
  PIPELINE_CHECK_AS(ConfigError, !hosts.empty(), "{} lists no hosts (one per line: NAME [slots=N])",
                    source);
  return hosts;
}

std::vector<HostEntry> read_hostfile(const std::string& path) {
  std::ifstream f(path);
  PIPELINE_CHECK_AS(ConfigError, f.good(), "cannot open hostfile '{}'", path);
  std::ostringstream text;
  text << f.rdbuf();
  return parse_hostfile(text.str(), path);
}

int resolve_host_level(const Topology& topology, const PlacementOptions& options) {
  const int levels = static_cast<int>(topology.levels.size());
  const int k = options.host_level.value_or(levels > 1 ? 1 : 0);
  PIPELINE_CHECK_AS(ConfigError, k >= 0 && k <= levels,
                    "host level {} is outside the topology's {} level(s); give 0 (one worker per "
                    "host) to {} (all "
                    "on one host)",
                    k, levels, levels);
  return k;
}

namespace {

// The topology worker each plan rank runs on (-1: a rank no stage uses). Untyped: rank r is
// worker r. Typed: the workers are numbered type by type, in the order the topology lists the
// types (the hostfile's hosts in that order), and each stage's ranks take the next free workers
// of the stage's device type, so a plan for part of the cluster runs on the first workers of
// each type it uses.
std::vector<int> workers_of_ranks(const Plan& plan, const Topology& topology) {
  std::vector<int> worker(static_cast<std::size_t>(plan.workers), -1);
  if (!topology.typed()) {
    for (int r = 0; r < plan.workers; ++r) worker[static_cast<std::size_t>(r)] = r;
    return worker;
  }
  std::vector<int> next, end;  // per type: its next free worker, and one past its last
  for (const WorkerType& t : topology.types) {
    next.push_back(end.empty() ? 0 : end.back());
    end.push_back(next.back() + t.count);
  }
  for (const PlanStage& s : plan.stages) {
    PIPELINE_CHECK_AS(ConfigError, !s.device.empty(),
                      "the topology has worker types but the plan's stages name none (a plan for "
                      "one kind of worker): place the plan with the topology it was planned for");
    std::size_t type = 0;
    while (type < topology.types.size() && topology.types[type].name != s.device) ++type;
    PIPELINE_CHECK_AS(ConfigError, type < topology.types.size(),
                      "stage of layers {}..{} runs on device type '{}', which the topology does "
                      "not have: place the plan with the topology it was planned for",
                      s.begin, s.end - 1, s.device);
    for (int r : s.ranks) {
      PIPELINE_CHECK_AS(ConfigError, next[type] < end[type],
                        "the plan puts more ranks on device type '{}' than the topology's {}: "
                        "place it with the topology it was planned for",
                        s.device, topology.types[type].count);
      worker[static_cast<std::size_t>(r)] = next[type]++;
    }
  }
  return worker;
}

}  // namespace

std::vector<RankPlacement> place_ranks(const Plan& plan, const Topology& topology,
                                       const std::vector<HostEntry>& hosts,
                                       const PlacementOptions& options) {
  PIPELINE_CHECK_AS(ConfigError, options.cores_per_rank >= 1,
                    "cores per rank must be at least 1, got {}", options.cores_per_rank);
  const int workers = topology.workers();
  // A plan for fewer workers (cost planning's sub-clusters: whole groups, or part of the first
  // group; on a typed topology some of each type) runs on the topology's first workers, in its
  // order (workers_of_ranks).
  PIPELINE_CHECK_AS(ConfigError, plan.workers <= workers,
                    "the plan is for {} workers but the topology has {}; place it with the "
                    "topology it was planned for",
                    plan.workers, workers);
  for (const auto& s : plan.stages)
    for (int r : s.ranks)
      PIPELINE_CHECK_AS(ConfigError, r >= 0 && r < plan.workers,
                        "the plan has rank {}, outside its workers 0..{}", r, plan.workers - 1);
  const std::vector<int> worker_of = workers_of_ranks(plan, topology);

  const int k = resolve_host_level(topology, options);
  int per_host = 1;
  for (int l = 0; l < k; ++l) per_host *= topology.levels[static_cast<std::size_t>(l)].count;
  // Worker w of the topology is on host w / per_host. A plan that leaves workers idle runs as a
  // job of the ranks it uses (compact_ranks): job rank j is the j-th of them, on its worker's host.
  std::vector<int> used = plan.ranks_used(), job_workers;
  if (used.empty())
    for (int r = 0; r < plan.workers; ++r) used.push_back(r);
  for (int r : used) job_workers.push_back(worker_of[static_cast<std::size_t>(r)]);
  const int needed = *std::max_element(job_workers.begin(), job_workers.end()) / per_host + 1;
  PIPELINE_CHECK_AS(ConfigError, static_cast<int>(hosts.size()) >= needed,
                    "the plan needs {} hosts ({} ranks, {} per host at host level {}) but the "
                    "hostfile lists {}; add "
                    "hosts, or plan for {} workers",
                    needed, used.size(), per_host, k, hosts.size(),
                    static_cast<int>(hosts.size()) * per_host);

  std::vector<RankPlacement> placement;
  placement.reserve(used.size());
  for (std::size_t j = 0; j < job_workers.size(); ++j) {
    const int w = job_workers[j];
    const HostEntry& host = hosts[static_cast<std::size_t>(w / per_host)];
    // The rank takes its worker's place on the host (a typed plan's ranks may skip places).
    const int local = w % per_host;
    const auto on_host = std::count_if(job_workers.begin(), job_workers.end(),
                                       [&](int u) { return u / per_host == w / per_host; });
    PIPELINE_CHECK_AS(ConfigError, !host.slots || local < *host.slots,
                      "host '{}' has {} slots but the plan puts {} ranks on it, one of them on its "
                      "worker {} of {} ({} per host at host level {}, counted from 0); give it "
                      "slots={}, or a topology whose host level has {} workers",
                      host.name, host.slots.value_or(0), on_host, local, per_host, per_host, k,
                      local + 1, host.slots.value_or(0));
    placement.push_back({static_cast<int>(j), host.name, local, local * options.cores_per_rank,
                         options.cores_per_rank});
  }
  return placement;
}

std::string describe_placement(const std::vector<RankPlacement>& placement) {
  std::string text;
  for (std::size_t i = 0; i < placement.size();) {
    std::size_t j = i;
    while (j + 1 < placement.size() && placement[j + 1].host == placement[i].host) ++j;
    const auto& a = placement[i];
    text += text.empty() ? "" : ", ";
    text += i == j ? fmt::format("rank {} on {}", a.rank, a.host)
                   : fmt::format("ranks {}-{} on {}", a.rank, placement[j].rank, a.host);
    i = j + 1;
  }
  return text;
}

std::string rankfile_text(const std::vector<RankPlacement>& placement) {
  std::string text;
  for (const auto& p : placement) {
    const std::string cores = p.cores == 1
                                  ? fmt::format("{}", p.first_core)
                                  : fmt::format("{}-{}", p.first_core, p.first_core + p.cores - 1);
    text += fmt::format("rank {}={} slot={}\n", p.rank, p.host, cores);
  }
  return text;
}

void write_rankfile(const std::string& path, const std::vector<RankPlacement>& placement) {
  detail::write_file_atomically(path, rankfile_text(placement));
}

}  // namespace pipeline
