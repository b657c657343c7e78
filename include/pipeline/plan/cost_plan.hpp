// Cost planning: which workers to rent, and how to split the model over them, to train a number
// of samples by a deadline or within a budget (Ceer's and SMLT's questions, answered with the
// partitioner's exact plans).
//
// A candidate is the fastest plan on one choice of workers: on a topology with worker types
// (Topology::types), every usage vector of at most each type's count (TypedPartitioner solves
// them all at once); on a topology of one kind of worker, every sub-cluster of whole groups: 1..M
// groups of the outermost level, and within one group the same one level down (so one level of
// N workers gives 1..N workers), each planned by partition(). Using fewer workers than there are
// is how cost trades against time.
//
// Time and cost of training N samples on a plan of time per minibatch T at the profile's batch
// size b, with n_t workers of type t at price p_t per worker-hour:
//   time = T · N / b        cost = time / 3600 s · Σ_t n_t p_t
// (the steady state of 1F1B-stash; the pipeline's fill and drain, a few minibatches, are left
// out). Prices come from the types, or the topology's price_per_worker_hour; every type used
// must have one (ConfigError otherwise).
//
// The frontier is the set of candidates that no other candidate beats on both time and cost (one
// at least as fast and as cheap, and better in one): ascending in time, strictly descending in
// cost; it always holds the fastest candidate (the cheapest among the fastest) and the cheapest
// (the fastest among the cheapest).
#pragma once

#include <pipeline/plan/device_profiles.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan.hpp>
#include <pipeline/plan/topology.hpp>

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

struct CostedPlan {
  Plan plan;
  std::vector<int> workers;   // per worker type, topology order; untyped: {plan.workers}
  double time_s = 0;          // to train the requested samples
  double cost = 0;            // currency units for that time
  double price_per_hour = 0;  // of all the plan's workers together
};

// Every candidate with a plan (ConfigError when none has one, or a price or the profile's batch
// size is missing). `profiles`: one per worker type, or for an untyped topology exactly one.
std::vector<CostedPlan> cost_candidates(const DeviceProfiles& profiles, const Topology& topology,
                                        const PartitionOptions& options, double samples);

// The time/cost Pareto frontier of the candidates, ascending in time.
std::vector<CostedPlan> pareto_frontier(const std::vector<CostedPlan>& candidates);

// The cheapest candidate that trains in at most `deadline_s` (ties: the faster, then fewer
// workers). ConfigError when none does, saying how long the fastest takes: "the fastest plan
// takes 7.4h for N samples ...; the deadline is 6h: raise --deadline to 7.4h or add workers".
const CostedPlan& cheapest_within_deadline(const std::vector<CostedPlan>& candidates,
                                           double deadline_s, double samples);
// The fastest candidate that costs at most `budget` (ties: the cheaper, then fewer workers).
// ConfigError when none does, saying what the cheapest costs.
const CostedPlan& fastest_within_budget(const std::vector<CostedPlan>& candidates, double budget,
                                        double samples);

// "90s", "45m", "6h", "2d", "1.5h" (a plain number is seconds) -> seconds; ConfigError on
// anything else, a negative duration, or zero unless `allow_zero`.
double parse_duration(std::string_view text, bool allow_zero = false);
// Seconds as "42s", "7.5m", "7.4h" or "2.1d" (3 significant digits); round_up: never below the
// value (for "raise --deadline to ...").
std::string format_duration(double seconds, bool round_up = false);
// "8 h100 + 4 a100", or "6 workers" on an untyped topology.
std::string describe_workers(const CostedPlan& plan, const Topology& topology);

// {"samples": N, "points": [{"time_s", "time", "cost", "price_per_hour", "workers": {"h100": 8},
//  "config", "devices", "time_per_minibatch_s"}]}
nlohmann::json frontier_to_json(const std::vector<CostedPlan>& frontier, const Topology& topology,
                                double samples);
void write_frontier_json(const std::string& path, const std::vector<CostedPlan>& frontier,
                         const Topology& topology, double samples);
// An SVG scatter of every candidate (grey) with the frontier as a step line (blue), time in
// hours on x, cost on y, each frontier point labelled with its workers.
std::string frontier_svg(const std::vector<CostedPlan>& frontier,
                         const std::vector<CostedPlan>& candidates, const Topology& topology,
                         double samples);
void write_frontier_svg(const std::string& path, const std::vector<CostedPlan>& frontier,
                        const std::vector<CostedPlan>& candidates, const Topology& topology,
                        double samples);

}  // namespace pipeline
