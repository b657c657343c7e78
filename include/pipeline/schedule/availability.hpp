// Availability traces: training on transient resources (spot instances, preemptible nodes) that
// come and go, re-planned at each change, against a static plan on the workers that are always
// there (the question elastic systems such as Proteus answer).
//
// A trace is a CSV file of rows `time_s,workers`: from time_s (seconds from the start of the run)
// on, `workers` workers are available, until the next row; the last row holds for ever. An
// optional header line (`time_s,workers`), blank lines and `#` comments are skipped. Times start
// at 0 and increase strictly; worker counts are integers >= 0. Bad rows are a ConfigError naming
// the file and line.
//
// Model (replay_availability):
//  - each worker count k is planned once by partition() on the topology cut to k workers
//    (topology_for_workers: whole groups of the inner levels; workers that do not fill one are
//    left idle) with AvailabilityOptions::partition (pipeline-simulate: the optimizer's step and
//    state, the profile's transfer dtype, and allow_idle, so a plan may train on fewer of them
//    where that is faster, and runs and costs only those); the plan trains at its predicted
//    steady state, batch / time_per_minibatch_s samples per second (the partitioner's and cost
//    planning's rate; fill and drain left out);
//  - elastic run: it starts on the plan for the workers available at the first row where one
//    fits, without restart cost. At each later change: when the running plan trains on more
//    workers than remain, or nothing runs and now a plan can, it re-plans and pays restart_s (write
//    a checkpoint, start the new job, load it; plans resume across worker counts, see the
//    checkpoint section of the README); when more workers appear it re-plans only if the new plan,
//    restart included, would finish the remaining samples sooner than the running one (judged
//    without knowing the future, as a scheduler would). A restart cut short by the next change
//    starts over if that change re-plans, and otherwise goes on. With 0 workers (or none on which a
//    plan fits in memory) the run waits, paying nothing;
//  - static run: one plan, never restarted, on the workers that are there for the whole of its
//    run: the first row's count, lowered to the fewest of any row before that run would end,
//    until that holds. When it reaches 0 (or no plan fits), no static plan exists
//    (AvailabilityRun::feasible = false);
//  - cost: the plan's workers times the time they run or restart, times the price per
//    worker-hour (AvailabilityOptions::price_per_worker_hour, else the topology's; with neither,
//    costs are 0 and `priced` is false).
#pragma once

#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan.hpp>
#include <pipeline/plan/topology.hpp>
#include <pipeline/profile/profile.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

struct AvailabilityChange {
  double time_s = 0;
  int workers = 0;
  int line = 0;  // in the CSV, 1-based (0: not from a file)
};

// Rows in time order. ConfigError, naming `source` and the line, on a malformed row.
std::vector<AvailabilityChange> parse_availability_csv(std::string_view text,
                                                       std::string_view source = "trace");
std::vector<AvailabilityChange> read_availability_csv(const std::string& path);

struct AvailabilityOptions {
  double samples = 0;     // to train; > 0
  double restart_s = 60;  // checkpoint and restart per re-plan
  std::optional<double> price_per_worker_hour;
  PartitionOptions partition;
};

// One stretch of a run between two changes (or its end).
struct AvailabilitySegment {
  double start_s = 0;
  double end_s = 0;
  int available = 0;  // workers in the trace
  int workers = 0;    // workers the running plan uses (0: waiting)
  std::string config;
  double time_per_minibatch_s = 0;
  bool replanned = false;  // a new plan was started at start_s (the first one too)
  double restart_s = 0;    // of the segment spent restarting
  double samples = 0;      // trained in it
  double cost = 0;
};

struct AvailabilityRun {
  bool feasible = true;
  std::vector<AvailabilitySegment> segments;
  double time_s = 0;  // until the last sample is trained
  double worker_hours = 0;
  double cost = 0;
  int restarts = 0;
};

struct AvailabilityReplay {
  AvailabilityRun elastic;
  AvailabilityRun fixed;  // the static plan
  int static_workers = 0;
  bool priced = false;
};

// The topology cut to at most `workers` workers (>= 1): on one level, that many; on several,
// as many whole groups of the inner levels as fit, or within one group the same one level down.
// Typed topologies are refused (a trace counts one kind of worker).
Topology topology_for_workers(const Topology& topology, int workers);

// Replays a run of options.samples samples on the trace (see above). ConfigError when the
// profile has no batch size, the trace is empty or ends with no plan able to run, or the
// topology is typed.
AvailabilityReplay replay_availability(const Profile& profile, const Topology& topology,
                                       const std::vector<AvailabilityChange>& trace,
                                       const AvailabilityOptions& options);

}  // namespace pipeline
